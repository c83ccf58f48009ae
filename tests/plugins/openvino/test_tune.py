"""A real search on the ``openvino`` backend, and a run without it."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from graphs import conv_bn

from routetune.install import pip_install

needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                    reason="openvino is not installed: "
                                           + pip_install("openvino"))

TUNE = """
import sys
import routetune

if __name__ == "__main__":
    result = routetune.tune(sys.argv[1], output=sys.argv[2], backend="openvino",
                            shapes="x:2x3x32x32", search="one-at-a-time",
                            seasonings=["ov-threads", "ov-no-pinning", "ov-precision",
                                        "ov-no-hyper-threading"],
                            space={"ov-threads": {"threads": [1]}}, min_runs=5, min_time_s=0.02,
                            busy_machine="ignore")
    print(result.winner.route)
"""


@needs_openvino
def test_a_search_on_openvino_records_ok_trials_with_the_cpus_capabilities(
        tmp_path: Path) -> None:
    from routetune.plugins.openvino.installed import cpu_facts

    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    (tmp_path / "s.py").write_text(TUNE)
    done = subprocess.run([sys.executable, str(tmp_path / "s.py"), str(model), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = sqlite3.connect(out / "trials.sqlite").execute(
        "SELECT route, status, reason, settings, versions, device FROM trials").fetchall()
    status = {r[0]: r[1] for r in rows}
    facts = cpu_facts()
    # OpenVINO's default precision is the CPU's (bf16 on an AVX-512 BF16 CPU): the base
    # route, and each route that keeps it, misses the FP32 constraint there, and the f32
    # route wins though the inaccurate base route is faster
    kept = "ok" if facts.default_precision == "f32" else "accuracy-failed"
    assert status["base"] == status["ov-no-pinning"] == status["ov-threads"] == kept, rows
    if kept != "ok":  # f32 is ov-precision's first choice there; f16 another, on AMX-FP16
        assert status["ov-precision"] == "ok", rows
        winner = done.stdout.strip()
        assert winner.startswith("ov-precision") and status[winner] == "ok", (winner, rows)
        offered = {"ov-precision"} | ({"ov-precision{type=f16}"}
                                      if "FP16" in facts.capabilities else set())
        assert winner in offered, (winner, rows)
    for route, _, _, _, versions, device in rows:
        if status[route] not in ("ok", "accuracy-failed"):
            continue
        v = json.loads(versions)
        assert v["openvino"][:4].isdigit() and v["openvino_cpu"] == facts.name
        assert v["openvino_capabilities"] == ",".join(facts.capabilities)
        assert device.startswith(f"cpu: {facts.name}")
    settings = {r[0]: json.loads(r[3]) for r in rows}
    assert settings["ov-threads"]["openvino.INFERENCE_NUM_THREADS"] == 1
    assert settings["ov-no-pinning"]["openvino.ENABLE_CPU_PINNING"] == "NO"
    assert settings["base"]["openvino.PERFORMANCE_HINT"] == "LATENCY"
    if kept != "ok":
        assert settings["ov-precision"]["openvino.INFERENCE_PRECISION_HINT"] == "f32"
    assert not list(out.rglob("*.blob"))  # OpenVINO's cache is the user's, not the folder's
    # where OpenVINO resolves hyper-threading off by itself, the route that turns it
    # off is the base route's engine: recorded as such, neither timed nor judged
    from routetune.plugins.openvino.installed import core

    resolved = core().compile_model(str(model), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    reason = {r[0]: r[2] for r in rows}["ov-no-hyper-threading"]
    if resolved.get_property("ENABLE_HYPER_THREADING") is False:
        assert status["ov-no-hyper-threading"] == "skipped", rows
        assert reason.startswith("same engine as route 'base' (equal engine sha256"), reason
    else:
        assert status["ov-no-hyper-threading"] == kept, rows
    if "BF16" not in facts.capabilities and "FP16" not in facts.capabilities:
        reason = next(r[2] for r in rows if r[0] == "ov-precision")
        assert status["ov-precision"] == "skipped"  # recorded, with why
        assert f"bf16: {facts.name} does not compute BF16 natively" in reason, reason


BLOCK = ("import sys\n"
         "sys.modules['openvino'] = None  # Python's own way to make an import fail\n"
         "from routetune.cli import main\n"
         "main(sys.argv[1:])\n")


KERNELS = """
import sys
import routetune

if __name__ == "__main__":
    routetune.tune(sys.argv[1], output=sys.argv[2], backend="openvino", shapes="x:2x3x32x32",
                   search="one-at-a-time", seasonings=["fuse-bn-into-conv", "ov-threads"],
                   space={"ov-threads": {"threads": [1]}}, min_runs=5, min_time_s=0.02,
                   accuracy=sys.argv[3], memory=sys.argv[4], busy_machine="ignore")
"""


@needs_openvino
@pytest.mark.parametrize("accuracy", ["cos>=0.99", "linf<=0"])  # bf16 meets the first
def test_a_route_on_an_accurate_shorter_routes_kernels_is_not_timed(
        tmp_path: Path, accuracy: str) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    (tmp_path / "s.py").write_text(KERNELS)
    memory = tmp_path / "memory.sqlite"
    done = subprocess.run([sys.executable, str(tmp_path / "s.py"), str(model), str(out),
                           accuracy, str(memory)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r[0]: r[1:] for r in sqlite3.connect(out / "trials.sqlite").execute(
        "SELECT route, status, reason, latency, passes FROM trials")}
    assert rows["ov-threads"][2] is not None, rows  # another property: other kernels, timed
    fused = rows["fuse-bn-into-conv"]
    assert json.loads(fused[3])[-1]["modified"] is True, fused  # the batch norm folded
    if accuracy == "cos>=0.99":  # OpenVINO folds the batch norm itself: the same kernels
        assert rows["base"][0] == "ok", rows
        assert fused[0] == "skipped" and fused[2] is None, rows
        assert fused[1] == ("same kernels as the base route: openvino compiles this route's "
                            "model to the same layers, kernels, precisions and properties, "
                            "its weight values aside, so it runs as fast and can at best tie "
                            "it (not timed or checked for accuracy)"), fused
        # the memory learns that the step changes nothing the engine runs here
        taught = sqlite3.connect(memory).execute(
            "SELECT outcome FROM lessons WHERE parent = 'base' AND step = 'fuse-bn-into-conv'")
        assert [r[0] for r in taught] == ["no-op"]
    else:  # the base route missed the constraint: the other weights may meet it, so timed
        assert rows["base"][0] == "accuracy-failed", rows
        assert fused[0] in ("ok", "accuracy-failed") and fused[2] is not None, rows


def test_without_openvino_the_backend_is_unavailable_and_says_how_to_install(
        tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, "-c", BLOCK, "seasonings"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    row = " ".join(line for line in listed.stdout.splitlines() if "│ openvino " in line)
    assert "unavailable: the openvino package is not installed" in row, listed.stdout
    model = conv_bn(tmp_path / "m.onnx")
    refused = subprocess.run([sys.executable, "-c", BLOCK, "tune", str(model), "--backend",
                              "openvino", "--shapes", "x:1x3x32x32"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.startswith("routetune: error: --backend openvino: not available "
                                     "here (the openvino package is not installed; "
                                     f"{pip_install('openvino')})"), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


LAZY_CHECK = """
import sys
from pathlib import Path
from routetune.timing.measure import MeasureSettings
from routetune.plugin_manager import load_registry
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune
registry = load_registry()
assert not registry.seasonings["ov-precision"].made
tune(RunSpec(model=Path(sys.argv[1]), output=Path(sys.argv[2]), shapes="x:1x3x32x32",
             seasonings=("fuse-bn-into-conv",), in_process=True, busy_machine="ignore",
             measure=MeasureSettings(warmup=1, min_runs=3, min_time_s=0.01)), registry)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "openvino")
assert not loaded, loaded
assert not registry.seasonings["ov-precision"].made
print("no openvino")
"""


def test_a_run_on_onnx_runtime_never_imports_openvino(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", LAZY_CHECK, str(conv_bn(tmp_path / "m.onnx")),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no openvino"
