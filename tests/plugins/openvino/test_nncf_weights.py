"""nncf-int4: real NNCF weight compression, compiled and run by real OpenVINO."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

import routetune
from routetune.install import pip_install
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.openvino.backend import OpenVinoBackend
from routetune.plugins.openvino.nncf_weights import NncfInt4
from routetune.seasoning import RouteContext, RouteState

sys.path.insert(0, str(Path(__file__).parents[1] / "onnxruntime"))
from test_weight_only import mlp  # noqa: E402 - the same seeded MLP as int4-weights'

ov = pytest.importorskip("openvino", reason="openvino is not installed: "
                         + pip_install("nncf"))


def compressed(**params: object) -> tuple[routetune.seasoning.PassResult, onnx.ModelProto]:
    graph = gs.import_onnx(mlp())
    result = NncfInt4(params)(RouteState(graph), RouteContext(OpenVinoBackend()))
    return result, gs.export_onnx(graph)


def test_nncf_writes_int4_matmuls_that_openvino_runs_close_to_fp32() -> None:
    result, model = compressed()
    ops = [n.op_type for n in model.graph.node]
    # NNCF keeps the last MatMul in its INT8 backup (all_layers=False, its default)
    assert ops.count("MatMulNBits") == result.stats["quantized_nodes"] == 1
    assert result.stats["int8_backup"] >= 1 and result.modified
    core = ov.Core()
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    fp32 = core.compile_model(core.read_model(mlp().SerializeToString(), b""), "CPU")(
        {"x": x})[0]
    int4 = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU")(
        {"x": x})[0]
    error = float(np.linalg.norm(int4 - fp32) / np.linalg.norm(fp32))
    assert 0.01 < error < 0.2, error  # int4 on one layer, INT8 on the other


def test_nncf_int4_is_offered_for_openvino_from_opset_13(model_path) -> None:  # noqa: ANN001
    seasoning = NncfInt4()
    assert seasoning.why_not(gs.import_onnx(mlp()), OpenVinoBackend()) is None
    assert seasoning.why_not(gs.import_onnx(mlp()), OnnxRuntimeBackend()) == (
        "applies only to backends openvino")
    rec = gs.import_onnx(onnx.load(model_path("ppocr-rec")))
    assert seasoning.why_not(rec, OpenVinoBackend()).startswith(
        "opset 12: NNCF compresses ONNX weights from opset 13")
    _, done = compressed()
    assert seasoning.why_not(gs.import_onnx(done), OpenVinoBackend()).startswith(
        "the model is quantized already")


def test_asymmetric_groups_are_not_searched_nncf_writes_their_zero_points_unpacked() -> None:
    # MatMulNBits packs two 4-bit zero points a byte: [N, ceil(groups / 2)]; NNCF 3.4
    # writes one a byte. When this fails, NNCF packs them: int4_asym can be searched.
    _, model = compressed(mode="int4_asym")
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    zero_points = next(t for t in model.graph.initializer if t.name == node.input[3])
    groups = 256 // 32
    assert list(zero_points.dims) == [512, groups]  # not [512, groups // 2]
    assert NncfInt4.info.param("mode").choices == ("int4_sym",)


def test_a_search_on_openvino_times_and_judges_int4(tmp_path: Path) -> None:
    onnx.save(mlp(), tmp_path / "m.onnx")
    result = routetune.tune(tmp_path / "m.onnx", backend="openvino",
                            seasonings=["nncf-int4"], search="exhaustive",
                            accuracy="cos>=0.98", output=tmp_path / "out", min_time_s=0.05,
                            busy_machine="ignore", confirm_repeats=1, in_process=True)
    trials = {t.route: t for t in result.trials if t.route.startswith("nncf-int4")}
    assert set(trials) == {"nncf-int4"}
    for trial in trials.values():
        assert trial.status in ("ok", "accuracy-failed"), (trial.route, trial.reason)
        assert trial.passes[0]["stats"]["quantized_nodes"] == 1
        assert trial.accuracy["y"]["cos"] > 0.98 and trial.latency is not None
