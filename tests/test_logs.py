"""Third-party output goes to a log file, not ahead of routetune's one line (issue 14, kind 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from quick import QUICK_FLAGS

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


def test_build_and_tune_show_only_their_own_lines_and_keep_the_libraries_in_the_log(
        tmp_path: Path) -> None:
    # onnx-graphsurgeon prints "[W] ..." lines when it imports a float8 model (at
    # preparation, before the output folder is chosen): they used to reach the terminal
    # first. (The FP8 quantizer's "WARNING:root:" line this test used to provoke is no
    # longer reached on the CPU: fp8-qdq is not applicable there and says so.)
    nodes = [helper.make_node("Identity", ["x"], ["i"], name="id"),
             helper.make_node("Cast", ["i"], ["f8"], to=TensorProto.FLOAT8E5M2, name="to8"),
             helper.make_node("Cast", ["f8"], ["y"], to=TensorProto.FLOAT, name="back")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])])
    model = tmp_path / "f8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), model)
    for command, log_name, first in (
            (["build", str(model), "--route", "eliminate-noops"], "build.log", "built "),
            (["tune", str(model), "--seasonings", "eliminate-noops", *QUICK_FLAGS],
             "prepare.log", "")):
        out = tmp_path / command[0]
        done = subprocess.run([sys.executable, "-m", "routetune", *command, "--output",
                               str(out)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert lines[0].strip().startswith(first), lines
        assert not [line for line in lines if line.startswith("[W]")], lines
        log = (out / LOGS / log_name).read_text()
        assert "== " in log and "[W] Could not convert: FLOAT8E5M2" in log
