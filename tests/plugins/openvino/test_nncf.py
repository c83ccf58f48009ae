"""nncf-int8: real NNCF calibration, compiled by real OpenVINO."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from graphs import conv_bn, product

import routetune
from routetune.install import pip_install
from routetune.plugin_manager import load_registry
from routetune.testing import check_seasoning

HERE = Path(__file__).parents[2]
ov = pytest.importorskip("openvino", reason="openvino is not installed: "
                         + pip_install("nncf"))  # `pytest -m gpu` on a GPU-only machine


def test_nncf_int8_calibrates_and_openvino_runs_it_in_int8(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx", batch=4)
    result = routetune.tune(model, backend="openvino", seasonings=["nncf-int8"],
                            search="exhaustive", accuracy="rel_l2<=0.2",
                            output=tmp_path / "out", min_time_s=0.1, busy_machine="ignore",
                            keep="all", in_process=True)
    trials = {t.route: t for t in result.trials}
    assert {"nncf-int8", "nncf-int8{preset=mixed}"} <= set(trials)
    trial = trials["nncf-int8"]
    assert trial.status == "ok", trial.reason
    stats = trial.passes[-1]["stats"]
    assert stats["quantized_nodes"] == 1 and stats["dequantize_linear"] >= 2
    compiled = ov.Core().compile_model(str(tmp_path / "out" / trial.artifact), "CPU")
    precisions = {op.get_rt_info()["runtimePrecision"].astype(str)
                  for op in compiled.get_runtime_model().get_ops()}
    assert precisions & {"i8", "u8"}, precisions


def test_nncf_int8_says_why_it_does_not_apply(tmp_path: Path) -> None:
    registry = load_registry()
    cls = registry.seasoning("nncf-int8")
    import onnx
    import onnx_graphsurgeon as gs

    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
    from routetune.plugins.openvino.backend import OpenVinoBackend

    graph = gs.import_onnx(onnx.load(product(tmp_path / "p.onnx")))
    assert "no Conv/MatMul/Gemm/ConvTranspose node" in cls().applicable(graph,
                                                                         OpenVinoBackend())
    assert cls().applicable(graph, OnnxRuntimeBackend())  # openvino's only
    # the contract every seasoning keeps: deterministic, a valid model, signature kept
    record = check_seasoning(registry, "nncf-int8", conv_bn(tmp_path / "m.onnx", batch=2),
                             tmp_path / "work", backend="openvino")
    assert record["stats"]["quantized_nodes"] == 1


TELEMETRY = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from graphs import conv_bn
import routetune
routetune.tune(conv_bn(Path(sys.argv[2]) / "m.onnx", batch=2), backend="openvino",
               routes=["nncf-int8"], seasonings=[], accuracy="rel_l2<=0.5",
               output=Path(sys.argv[2]) / "out", min_time_s=0.05, in_process=True,
               busy_machine="ignore")
from nncf.telemetry import telemetry, wrapper
print(isinstance(telemetry, wrapper.NNCFTelemetry))
"""


def test_nncf_sends_no_telemetry(tmp_path: Path) -> None:
    # outside pytest (which NNCF detects and stays quiet in): a user's process
    done = subprocess.run([sys.executable, "-c", TELEMETRY, str(HERE), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"  # NNCF's stub, not its sender
