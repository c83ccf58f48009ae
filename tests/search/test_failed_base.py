"""A route that builds wins over a base route that does not (real-models issue, kind 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from graphs import folded_mul_one
from quick import QUICK_FLAGS, quick_spec

from routetune.registry import Registry
from routetune.run.tuning import tune


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("producer", ["Cast", "Identity"])  # onnxruntime#32416, #32413
def test_a_route_that_loads_wins_when_onnx_runtime_refuses_the_base_route(
        registry: Registry, tmp_path: Path, producer: str) -> None:
    model = folded_mul_one(tmp_path / "m.onnx", producer)
    with pytest.raises(Exception, match="is not a graph input"):
        ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    result = tune(quick_spec(model=model, output=tmp_path / "out",
                             seasonings=("ort-opt-level",), search="exhaustive"), registry)
    trials = {t.route: t for t in result.trials}
    assert trials["base"].status == "build-failed"
    assert "ONNX Runtime refused the model" in trials["base"].reason
    assert result.winner.route == "ort-opt-level{level=disable}"
    assert result.winner.status == "ok" and result.confirmations == ()  # base never re-timed
    assert "no base to compare against" in result.winner_reason
    assert "absolute latency" in result.winner_reason
    settings = json.loads((tmp_path / "out" / "winner.json").read_text())
    assert settings["route"] == "ort-opt-level{level=disable}"
    assert settings["settings"]["onnxruntime.graph_optimization_level"] == "disable"


@pytest.mark.slow
def test_the_command_line_exits_0_with_the_fixing_route_and_build_gives_one_line(
        tmp_path: Path) -> None:
    model = folded_mul_one(tmp_path / "m.onnx")
    done = cli("tune", str(model), "--seasonings", "ort-opt-level,eliminate-noops",
               *QUICK_FLAGS, "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "no base to compare against" in " ".join(done.stdout.split())
    built = cli("build", str(model), "--route", "base", "--output", str(tmp_path / "out"))
    assert built.returncode == 1 and "Traceback" not in built.stderr + built.stdout
    lines = [line for line in (built.stdout + built.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "ONNX Runtime refused the model" in lines[0], lines
    fixed = cli("build", str(model), "--route", "ort-opt-level{level=disable}",
                "--output", str(tmp_path / "out"))
    assert fixed.returncode == 0, fixed.stderr
