"""A script that calls routetune.tune without the __main__ guard, or from standard input:
one UsageError before any worker starts, in real subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from graphs import conv_bn

CALL = ('routetune.tune("m.onnx", shapes="x:1x3x32x32", seasonings=["ort-threads"], '
        'max_trials=2, min_runs=3, min_time_s=0.02, confirm_repeats=1, busy_machine="ignore", '
        'output="out")')
GUARD = 'if __name__ == "__main__":'


def python(folder: Path, script: str, stdin: bool = False) -> subprocess.CompletedProcess[str]:
    (folder / "s.py").write_text(script)
    args = [sys.executable, "-" if stdin else "s.py"]
    return subprocess.run(args, cwd=folder, input=script if stdin else None,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("script", "where"), [
    (f"import routetune\n\nresult = {CALL}\n", "s.py:3: routetune.tune is called outside"),
    (f"import routetune\n\n\ndef go():\n    return {CALL}\n\n\ndef main():\n    go()\n\n\n"
     "main()\n", "s.py:12: routetune.tune is called (through main()) outside"),
])
def test_an_unguarded_call_is_one_usage_error_naming_the_guard(tmp_path: Path, script: str,
                                                               where: str) -> None:
    conv_bn(tmp_path / "m.onnx")
    done = python(tmp_path, script)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"routetune.errors.UsageError: {tmp_path / 's.py'}"[:40])
    assert where in last and f"`{GUARD}`" in last and "in_process=True" in last
    assert "BrokenProcessPool" not in done.stderr and "another routetune run" not in done.stderr
    assert done.stderr.count("Traceback") == 1  # the script's own, from the one error
    assert not (tmp_path / "out" / "trials.sqlite").exists()


@pytest.mark.slow
def test_a_script_from_standard_input_is_refused_and_a_guarded_one_runs(tmp_path: Path) -> None:
    conv_bn(tmp_path / "m.onnx")
    done = python(tmp_path, f"import routetune\n{CALL}\n", stdin=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "routetune.errors.UsageError: <stdin>: the script that calls routetune.tune was read "
        "from standard input, which worker processes cannot read again; save it to a file "
        f"with the call under `{GUARD}`, or pass in_process=True")
    done = python(tmp_path, f"import routetune\n\n{GUARD}\n    print({CALL}.winner.route)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in {"base", "ort-threads", "ort-threads{intra_op=2}"}
