"""Third-party output goes to a log file, not ahead of routetune's one line (issue 14, kind 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from graphs import conv_bn

from routetune.logs import LOGS

SCRIPT = """
import logging, os, sys
from pathlib import Path
from routetune.logs import captured
log = Path(sys.argv[1])
with captured(log, "phase one"):
    print("from print")
    os.write(2, b"from a C library on fd 2\\n")
    logging.warning("from the root logger")
print("back on the terminal")
with captured(log, "phase two"):
    print("appended")
"""


def test_print_c_level_writes_and_logging_reach_the_log_and_the_terminal_comes_back(
        tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("back on the terminal\n", "")
    lines = log.read_text().splitlines()
    assert re.fullmatch(r"== \d\d:\d\d:\d\d pid \d+: phase one", lines[0]), lines[0]
    assert lines[1:4] == ["from print", "from a C library on fd 2",
                          "WARNING:root:from the root logger"]
    assert lines[4].endswith(": phase two") and lines[5] == "appended"


def test_build_shows_only_its_own_lines_and_keeps_the_quantizer_s_in_the_log(
        tmp_path: Path) -> None:
    # ONNX Runtime's FP8 quantizer warns on the root logger (logging.warning) about the
    # opset, and
    # onnx-graphsurgeon prints "[W] ..." lines: both used to reach the terminal first
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "routetune", "build", str(model), "--route",
                           "fp8-qdq", "--shapes", "x:1x3x32x32", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines[0].startswith("built fp8-qdq: "), lines
    assert not [line for line in lines if "WARNING" in line or line.startswith("[W]")], lines
    log = (out / LOGS / "build.log").read_text()
    assert "== " in log and "build fp8-qdq" in log
    assert "WARNING:root:The original model opset version is 17" in log
