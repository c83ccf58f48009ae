"""The command line: bad input exits 2 with one line.

Most cases run the entry point in this process (`command.routetune`); a sample of the
bad inputs, the terminal prompt and a pipeline run the real ``python -m routetune``.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from command import routetune, routetune_script
from graphs import conv_bn, matmul_chain, shared_dim, square
from quick import QUICK_FLAGS as FAST

from routetune.registry import Registry


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """A model and an output directory that already holds a finished search."""
    root = tmp_path_factory.mktemp("cli")
    model = conv_bn(root / "m.onnx")
    out = root / "out"
    done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
                     "--seasonings", "fuse-bn-into-conv,ort-threads", *FAST)
    assert done.returncode == 0, done.stderr
    wrote = next(line for line in done.stdout.splitlines() if line.startswith("wrote "))
    assert all(name in wrote for name in ("winner.onnx", "winner_outputs.npz", "run.json"))
    assert "done; winner " in done.stderr  # the progress bar's last line
    rows = sqlite3.connect(out / "trials.sqlite").execute("SELECT count(*) FROM trials")
    return model, out, rows.fetchone()[0]


def test_tune_prints_table_and_winner(tuned: tuple[Path, Path, int]) -> None:
    model, out, rows = tuned
    again = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
                      "--seasonings", "fuse-bn-into-conv,ort-threads", *FAST)
    assert again.returncode == 0
    assert "winner: " in again.stdout
    assert "p50 ms" in again.stdout and "speed-up" in again.stdout
    assert f"to {out}" in again.stdout.replace("\n", "")
    assert rows >= 3
    assert f"routetune show {out} --all" in again.stdout.replace("\n", "")
    assert f"{rows} trials: " in again.stdout  # the counts per status
    header = again.stderr.splitlines()[:4]
    assert [line.split()[0] for line in header] == ["model", "backend", "device", "space"]
    assert all(len(line) <= 80 for line in header)  # short lines, nothing wraps at 80
    assert header[3] == "space    6 routes from 2 seasonings · search beam · up to 6 trials"
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
    flat = " ".join(again.stdout.split())
    assert f"{out} holds {size / 1e6:.1f} MB" in flat  # the folder's size, at the end


def test_show_prints_the_stored_trials_filtered_and_sorted(tuned: tuple[Path, Path, int]
                                                           ) -> None:
    _, out, rows = tuned
    every = routetune("show", str(out), "--all", "--sort", "route")
    assert every.returncode == 0, every.stderr
    assert f"{rows} of {rows} trials, by route" in every.stdout
    numbered = [line.split() for line in every.stdout.splitlines()
                if re.match(r"\s*\d+\s{2,}\S", line)]  # "  3   fuse-bn-into-conv   1.02x …"
    routes = [cells[1] for cells in numbered]
    assert [int(cells[0]) for cells in numbered] == list(range(1, rows + 1))
    assert routes == sorted(routes) and "base" in routes
    ok = routetune("show", str(out), "--status", "ok")
    assert ok.returncode == 0 and " ok" in ok.stdout
    assert "skipped" not in ok.stdout.split("trials:")[0]  # only the ok rows in the table
    assert max(map(len, ok.stdout.splitlines())) <= 200  # a pipe gets 200 columns
    for args, message in ((["--status", "fine"], "--status fine: give one of ok, "),
                          (["--sort", "speed"], "--sort speed: give one of rank, ")):
        bad = routetune("show", str(out), *args)
        assert bad.returncode == 2 and bad.stderr.startswith(f"routetune: error: {message}")
        assert len(bad.stderr.splitlines()) == 1


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


BAD = {
    "missing file": (lambda d, m: ["tune", str(d / "nope.onnx")], "nope.onnx: no such file"),
    "a flag's value read as the model": (  # --race takes no value: 'maybe' is MODEL.onnx
        lambda d, m: ["tune", "--example", "ppocr-cls", "--race", "maybe"],
        "give either MODEL.onnx ('maybe' was read as one) or --example NAME ('ppocr-cls')"),
    "too many build workers": (lambda d, m: ["tune", str(m), "--build-workers", "100000"],
                               "--build-workers 100000: give 1 to"),
    "timeout nan": (lambda d, m: ["tune", str(m), "--trial-timeout", "nan"],
                    "--trial-timeout nan: must be a finite number more than 0"),
    "time budget not a number": (lambda d, m: ["tune", str(m), "--time-budget", "abc"],
                                 "Invalid value for '--time-budget' 'abc': Input should be a "
                                 "valid number"),
    "max depth not a number": (lambda d, m: ["tune", str(m), "--max-depth=two"],
                               "Invalid value for '--max-depth' 'two':"),
    "too little worker memory": (lambda d, m: ["tune", str(m), "--worker-memory", "300"],
                                 "--worker-memory 300: give at least 512"),
    "in-process with workers": (lambda d, m: ["tune", str(m), "--in-process",
                                              "--build-workers", "2"],
                                "--in-process with --build-workers"),
    "not onnx": (lambda d, m: ["tune", str(_text(d / "t.onnx", "hello"))], "not a"),
    "truncated": (lambda d, m: ["tune", str(_trunc(m, d / "cut.onnx"))], "not a valid ONNX"),
    "unknown seasoning": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                        "--seasonings", "fuse-bn,ort-threads"],
                          "unknown seasoning 'fuse-bn'"),
    "unknown backend": (lambda d, m: ["tune", str(m), "--backend", "tensorrtx"],
                        "unknown backend 'tensorrtx'"),
    "bad accuracy": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                   "--accuracy", "cos>>0.9"], "--accuracy 'cos>>0.9'"),
    "npz missing input": (lambda d, m: ["tune", str(m), "--inputs",
                                        str(_npz(d / "a.npz", y=np.zeros(3)))],
                          "is not a model input"),
    "npz wrong dtype": (lambda d, m: ["tune", str(m), "--inputs", str(_npz(
        d / "b.npz", x=np.zeros((1, 3, 32, 32), np.float64)))],
        "is float64, the model wants float32"),
    "npz wrong rank": (lambda d, m: ["tune", str(m), "--inputs", str(_npz(
        d / "c.npz", x=np.zeros((3, 32, 32), np.float32)))], "has rank 4"),
    "shape contradicts": (lambda d, m: ["tune", str(m), "--shapes", "x:1x4x32x32"],
                          "dimension 1 is 4 but the model fixes it at 3"),
    "dynamic without shape": (lambda d, m: ["tune", str(m)],
                              "dimension 0 ('N') is dynamic; give its size with "
                              "--shapes x:1x3x32x32"),
    "a shared dim given two sizes": (
        lambda d, m: ["tune", str(shared_dim(d / "s.onnx")), "--shapes", "a:2x4,b:3x4"],
        "--shapes: inputs 'a' and 'b' share dimension 'N' but have sizes 2 and 3 there; "
        "give them one size"),
    "a dim named twice given two sizes": (
        lambda d, m: ["tune", str(square(d / "q.onnx")), "--shapes", "x:2x3"],
        "input 'x' names dimension 'N' twice but has sizes 2 and 3 there"),
    "bad shapes text": (lambda d, m: ["tune", str(m), "--shapes", "x=1x3"], "cannot read 'x=1x3'"),
    "output not writable": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32", "--output",
                                          str(_text(d / "afile", "x") / "sub")],
                            "cannot create or write"),
    "unknown search": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32", "--search", "dfs"],
                       "unknown search strategy 'dfs'"),
    "unknown example": (lambda d, m: ["tune", "--example", "resnet"], "unknown example"),
    "unknown executor": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                       "--executor", "slurm"],
                         "unknown executor 'slurm'; known: in-process, local, ray"),
    "huge shapes": (lambda d, m: ["tune", str(m), "--shapes", "x:99999999x3x32x32"],
                    "would take 1144.4 GiB; give smaller sizes"),
    "empty seasonings": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                       "--seasonings", ","], "--seasonings: no names given"),
    "impossible bound": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                       "--accuracy", "cos>=1.5"], "can never hold"),
    "pinned parameters": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                        "--seasonings", "fp16{keep_io_types=false}"],
                          "takes seasoning names only"),
    "repair alone": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                   "--seasonings", "precision-repair"],
                     "add fp16, bf16, int8-qdq or fp8-qdq"),
    "a batch of 0": (lambda d, m: ["tune", str(m), "--shapes", "x:0x3x32x32"],
                     "the FP32 reference's output 'y' is empty (shape 0x16x32x32) on every "
                     "input set, so no route's accuracy can be judged; give sizes of 1 or "
                     "more (x:0x3x32x32 has a 0)"),
    "inputs all NaN": (lambda d, m: ["tune", str(m), "--inputs", str(_npz(
        d / "nan.npz", x=np.full((1, 3, 32, 32), np.nan, np.float32)))],
        "the FP32 reference's output 'y' is all NaN on input set 0, so no route's "
        "accuracy can be judged; give validation inputs on which it is not NaN (--inputs "),
    "gpu seasoning on the cpu": (lambda d, m: ["tune", str(m), "--shapes", "x:1x3x32x32",
                                               "--seasonings", "ort-cuda-graph"],
                                 "applies only to backends onnxruntime-cuda"),
}


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _trunc(model: Path, path: Path) -> Path:
    path.write_bytes(model.read_bytes()[:500])
    return path


THROUGH_THE_SCRIPT = ("missing file", "max depth not a number", "unknown seasoning")
"""Bad inputs run through a real ``python -m routetune`` as well: a missing file, a
framework's flag error and a plugin registry's."""


@pytest.mark.parametrize(("case", "script"), [(c, False) for c in sorted(BAD)]
                         + [(c, True) for c in THROUGH_THE_SCRIPT])
def test_bad_input_is_one_line_exit_2_and_keeps_the_store(
    case: str, script: bool, tuned: tuple[Path, Path, int], tmp_path: Path
) -> None:
    model, out, rows = tuned
    make_args, message = BAD[case]
    args = make_args(tmp_path, model)
    if "--output" not in args:
        args += ["--output", str(out)]
    done = (routetune_script if script else routetune)(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("routetune: error: ")
    assert message in lines[0]
    assert "Traceback" not in done.stderr
    kept = sqlite3.connect(out / "trials.sqlite").execute("SELECT count(*) FROM trials")
    assert kept.fetchone()[0] == rows


def test_foreign_sqlite_file_is_refused_and_kept(
    tuned: tuple[Path, Path, int], tmp_path: Path
) -> None:
    model, _, _ = tuned
    out = tmp_path / "foreign"
    out.mkdir()
    db = sqlite3.connect(out / "trials.sqlite")
    db.execute("CREATE TABLE mine (x)")
    db.commit()
    db.close()
    before = (out / "trials.sqlite").read_bytes()
    done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out), *FAST)
    assert done.returncode == 2
    assert "a SQLite file that routetune did not write" in done.stderr
    assert (out / "trials.sqlite").read_bytes() == before


def test_seasonings_lists_plugins() -> None:
    done = routetune("seasonings")
    assert done.returncode == 0
    for name in ("fold-constants", "eliminate-noops", "fuse-bn-into-conv", "ort-opt-level",
                 "ort-no-spinning", "beam", "exhaustive", "cos", "onnxruntime"):
        assert name in done.stdout
    assert "routetune 0.1.0" in done.stdout  # the distribution that registered the built-ins


@pytest.mark.parametrize("columns", [60, 120])
def test_seasonings_in_a_narrow_terminal_keep_each_name_whole(registry: Registry,
                                                              columns: int) -> None:
    done = routetune_script("seasonings", COLUMNS=str(columns))
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= columns
    names = {line.split("│")[1].strip() for line in done.stdout.splitlines()
             if line.startswith("│") and line.split("│")[1].strip()}
    assert set(registry.seasonings) <= names  # each on one line, never broken
    assert ("keep_io_types" in done.stdout) is False  # the parameters: seasonings NAME
    assert "160 columns show every column" in " ".join(done.stdout.split())


def test_seasonings_name_explains_each_parameter_within_the_given_columns() -> None:
    done = routetune_script("seasonings", "fp16", COLUMNS="80")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 80  # $COLUMNS in a pipe, not 200
    text = " ".join(done.stdout.split())
    assert "fp16: FP16 mixed precision" in text and "conflicts with bf16" in text
    for name, help_text in (("keep_io_types", "keep FP32 graph inputs and outputs"),
                            ("nodes_to_exclude", "node names kept FP32")):
        assert name in text
        assert help_text in " ".join(text.replace("│", " ").split())
    wrong = routetune("seasonings", "fp61")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().endswith("unknown seasoning 'fp61'; did you mean 'fp16'? "
                                         "(all: `routetune seasonings`)")


def test_an_early_stop_is_announced(tuned: tuple[Path, Path, int], tmp_path: Path) -> None:
    model, _, _ = tuned
    done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(tmp_path),
                     "--max-trials", "2", *FAST)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "stopped early: --max-trials 2 reached; the best so far stands, resting on the " \
           "2 trials that ran of 2 planned; never tried: " in text  # what the verdict lacks


def test_a_second_run_on_a_locked_output_is_refused(
    tuned: tuple[Path, Path, int], tmp_path: Path
) -> None:
    model, out, rows = tuned
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from routetune.run.outdir import locked; "
         "cm = locked(Path(sys.argv[1])); cm.__enter__(); print('locked', flush=True); "
         "time.sleep(60)", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
                         "--fresh", *FAST)
        assert done.returncode == 2
        assert f"another routetune run (pid {holder.pid}) is using this directory" in done.stderr
    finally:
        holder.kill()
        holder.wait()
    kept = sqlite3.connect(out / "trials.sqlite").execute("SELECT count(*) FROM trials")
    assert kept.fetchone()[0] == rows


HUGE = ["--shapes", "x:1x3x32x32", "--max-depth", "1000"]  # 25,920 routes


def test_a_huge_search_asks_first_at_a_terminal_and_says_so_elsewhere(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    warning = ("this search may try about 25,920 trials of a 25,920-route space: at least "
               "14.4 h at 2 s or more per trial; bound it with --max-trials N, --time-budget "
               "S or a smaller --max-depth, or go on with --yes")
    quiet = ["--busy-machine", "ignore"]  # the warning's estimate needs --min-time's default
    command = " ".join([sys.executable, "-m", "routetune", "tune", str(model), *HUGE, *quiet,
                        "--output", str(tmp_path / "a")])
    asked = subprocess.run(["script", "-qec", command, "/dev/null"], input="n\n",
                           capture_output=True, text=True, timeout=120)  # a real terminal
    assert asked.returncode == 2
    said = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", asked.stdout).split())  # rich's colours
    assert warning in said and "go on? [y/N]" in said
    assert said.endswith("routetune: error: stopped before the search (25,920 routes); bound "
                         "it with --max-trials N or --time-budget S, or give --yes")
    conn = sqlite3.connect(tmp_path / "a" / "trials.sqlite")
    assert conn.execute("SELECT count(*) FROM trials WHERE status != 'skipped'"  # none ran
                        ).fetchone()[0] == 0  # (the seasonings not applicable are recorded)
    conn.close()

    piped = subprocess.Popen([sys.executable, "-m", "routetune", "tune", str(model), *HUGE,
                              *quiet, "--output", str(tmp_path / "b")], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    assert piped.stderr is not None
    for line in piped.stderr:  # goes on: a pipeline has nobody to ask
        lines.append(line)
        if "going on" in line:
            break
    piped.terminate()
    piped.communicate(timeout=60)
    assert warning in " ".join(" ".join(lines).split())
    assert lines[-1].strip() == "(standard input is not a terminal: going on)"


def test_a_bounded_or_confirmed_huge_search_does_not_ask(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    for flag in (["--max-trials", "2"], ["--yes", "--max-trials", "2"]):
        done = routetune("tune", str(model), *HUGE, *flag, *FAST, "--output",
                         str(tmp_path / flag[0][2:]))
        assert done.returncode == 0, done.stderr
        assert "this search may try" not in done.stderr
        assert "space    25,920 routes from " in done.stderr and "· up to 2 trials" in done.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs, as a disk that fills up during a run (mounting needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_stops_the_search_in_one_line_and_a_rerun_goes_on(
        small_disk: Path, tmp_path: Path) -> None:
    """A 2 MiB model's candidates fill a 3 MiB disk after the base route: the run stops
    in one line that names the disk and the fix, leaves no partial file, and once there
    is room the same command finishes the search, the stored trial kept (issue 39,
    kind 9)."""
    model = matmul_chain(tmp_path / "m.onnx", depth=8, width=256, batch=8)
    args = ["tune", str(model), "--output", str(small_disk / "out"), "--memory", "off",
            "--seasonings", "fp16,fold-constants", *FAST]
    done = routetune(*args)
    error = done.stderr.strip().splitlines()[-1]  # after the header and progress
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert error.startswith(f"routetune: error: {small_disk / 'out'}")
    assert ("the disk is full ([Errno 28] No space left on device); free space on the disk "
            f"that holds {small_disk / 'out'} and run the same command again") in error
    assert not list(small_disk.rglob("*.tmp"))  # no partial model left behind
    stored = sqlite3.connect(small_disk / "out" / "trials.sqlite").execute(
        "SELECT route, status FROM trials").fetchall()
    assert stored == [("base", "ok")]
    subprocess.run(["mount", "-o", "remount,size=40M", str(small_disk)], check=True)
    again = routetune(*args)
    assert again.returncode == 0, again.stderr
    assert "resumed: 1 of these trials came from the trial store" in again.stdout
