"""int4-weights, int8-weights: MatMulNBits by ONNX Runtime's quantizer, run and judged for real.

Every quantized model runs in a real ONNX Runtime CPU session and is compared with the
FP32 model on inputs the quantizer never saw (weight-only quantization calibrates on
nothing). The trained model is PP-OCRv4's recognizer, whose attention blocks and CTC head
are MatMuls on constant weights, judged on the example's rendered text lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from quick import quick_spec

from routetune.errors import UsageError
from routetune.feeds.examples import load_inputs
from routetune.install import pip_install
from routetune.passes.precision.repair import PrecisionRepair
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.onnxruntime.weight_only import (
    HQQ,
    Int4Weights,
    Int8Weights,
    WeightOnly,
    output_projections,
)
from routetune.plugins.openvino.backend import OpenVinoBackend
from routetune.registry import Registry
from routetune.routes.composer import resolve_route
from routetune.routes.route import parse_route
from routetune.run.tuning import tune
from routetune.seasoning import PassResult, RouteContext, RouteState

BACKEND = OnnxRuntimeBackend()


def mlp(seed: int = 0) -> onnx.ModelProto:
    """x f32[4,256] -> MatMul [256,512] -> Relu -> MatMul [512,256] -> y f32[4,256].

    Seeded standard-normal weights scaled by 1/sqrt(fan-in), as initializers.
    """
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((256, 512)) / 16).astype(np.float32)
    w2 = (rng.standard_normal((512, 256)) / 22.6).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def season(model: onnx.ModelProto, kind: type[WeightOnly] = Int4Weights,
           **params: object) -> tuple[PassResult, onnx.ModelProto]:
    """Apply int4-weights (or `kind`) as a route does; the graph is rewritten in place.

    `mlp`'s fc2 writes its output, so it is an output projection: kept unless
    ``keep_head=False`` (the default here, so that both MatMuls are quantized).
    """
    graph = gs.import_onnx(model)
    state = RouteState(graph)
    result = kind({"keep_head": False, **params})(state, RouteContext(BACKEND))
    assert state.graph is graph
    return result, gs.export_onnx(graph)


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of one ONNX Runtime CPU run."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_rtn_writes_matmulnbits_that_run_close_to_fp32(symmetric: bool,
                                                       accuracy_level: int) -> None:
    model = mlp()
    result, quantized = season(model, symmetric=symmetric, accuracy_level=accuracy_level)
    nbits = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    assert [n.name for n in quantized.graph.node if n.op_type == "MatMul"] == []
    assert len(nbits) == 2 and result.modified and result.stats["quantized_nodes"] == 2
    for node in nbits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 4 and attrs["block_size"] == 32
        assert attrs.get("accuracy_level", 0) == accuracy_level
        # asymmetric blocks carry a zero point input; symmetric ones do not
        assert (len(node.input) >= 4 and node.input[3] != "") is not symmetric
    before, after = result.stats["weight_bytes_before"], result.stats["weight_bytes_after"]
    assert before == (256 * 512 + 512 * 256) * 4
    assert before / after > 5  # 4 bits a weight, plus a scale (and zero point) per 32
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    (fp32,), (int4,) = run(model, {"x": x}), run(quantized, {"x": x})
    error = rel_l2(int4, fp32)
    # 16 levels over each block's range: 11-13% relative error here (symmetric blocks,
    # which spend one level on nothing, the more)
    assert 0.05 < error < 0.2, error


@pytest.mark.parametrize("symmetric", [False, True])
def test_int8_writes_8_bit_blocks_sixteen_times_closer_than_int4(symmetric: bool) -> None:
    model = mlp()
    result, quantized = season(model, Int8Weights, symmetric=symmetric)
    nbits = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and result.stats["quantized_nodes"] == 2
    for node in nbits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 8 and attrs["accuracy_level"] == 4  # its searched level
    assert result.note.startswith("rtn, 8 bits, block 32")
    before, after = result.stats["weight_bytes_before"], result.stats["weight_bytes_after"]
    assert 3 < before / after < 4  # 8 bits a weight, plus a scale (and zero point) per 32
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    (fp32,), (int8,) = run(model, {"x": x}), run(quantized, {"x": x})
    _, int4_model = season(model, symmetric=symmetric)
    int4 = run(int4_model, {"x": x})[0]
    # 256 levels a block where int4 has 16; accuracy_level 4 also rounds the activations
    # to int8 per block: 0.7-0.9% relative error here, against int4's 11-13%
    assert rel_l2(int8, fp32) < 0.02 and rel_l2(int8, fp32) < rel_l2(int4, fp32) / 5


def test_int4_and_int8_weights_conflict_in_a_route(registry: Registry) -> None:
    with pytest.raises(UsageError, match="'int4-weights' conflicts with int8-weights"):
        resolve_route(parse_route("int4-weights,int8-weights"), registry)


def test_accuracy_level_is_left_out_on_cuda_where_the_provider_ignores_it() -> None:
    from routetune.plugins.onnxruntime.cuda import OnnxRuntimeCudaBackend
    written = {}
    for level in (0, 4):
        graph = gs.import_onnx(mlp())
        Int4Weights({"keep_head": False, "accuracy_level": level})(
            RouteState(graph), RouteContext(OnnxRuntimeCudaBackend()))
        model = gs.export_onnx(graph)
        assert all(a.name != "accuracy_level" for n in model.graph.node for a in n.attribute)
        written[level] = model.SerializeToString()
    assert written[0] == written[4]  # one model, so one trial in a search


def test_excluded_nodes_keep_their_matmul() -> None:
    result, quantized = season(mlp(), nodes_to_exclude=("fc2",))
    ops = {n.name: n.op_type for n in quantized.graph.node}
    assert ops["fc2"] == "MatMul" and "MatMulNBits" in ops.values()
    assert result.stats["quantized_nodes"] == 1
    assert result.stats["weight_bytes_before"] == 256 * 512 * 4


def test_hqq_quantizes_where_torch_imports_and_says_what_to_install_where_not() -> None:
    model = mlp()
    if not HQQ:
        with pytest.raises(ValueError, match="needs torch .*" + re.escape(pip_install("int4-hqq"))):
            season(model, algorithm="hqq")
        return
    result, quantized = season(model, algorithm="hqq")
    assert result.stats["quantized_nodes"] == 2
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    assert rel_l2(run(quantized, {"x": x})[0], run(model, {"x": x})[0]) < 0.2


def test_hqq_has_no_symmetric_form() -> None:
    with pytest.raises(ValueError, match="hqq writes a zero point per block"):
        season(mlp(), algorithm="hqq", symmetric=True)


WITHOUT_ONNX_IR = ("import sys\n"
                   "sys.modules['onnx_ir'] = None  # Python's own way to make an import fail\n"
                   "from routetune.cli import main\n"
                   "main(sys.argv[1:])\n")


def test_without_onnx_ir_it_is_not_offered_and_asked_for_it_says_what_to_install(
        tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    out = tmp_path / "out"
    asked = subprocess.run(
        [sys.executable, "-c", WITHOUT_ONNX_IR, "tune", str(path), "--seasonings",
         "int4-weights,int8-weights", "--output", str(out)],
        capture_output=True, text=True, timeout=120)
    assert asked.returncode == 2, asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1, asked.stderr
    assert f"needs onnx-ir, which is not installed: {pip_install('int4')}" in asked.stderr
    assert not out.exists()


def test_where_it_is_offered(model_path: Callable[[str], Path]) -> None:
    seasoning = Int4Weights()
    assert seasoning.why_not(gs.import_onnx(mlp()), BACKEND) is None
    assert seasoning.why_not(gs.import_onnx(mlp()), OpenVinoBackend()) == (
        "applies only to backends onnxruntime, onnxruntime-cuda")
    _, quantized = season(mlp())
    assert seasoning.why_not(gs.import_onnx(quantized), BACKEND) == (
        "the model is quantized already (MatMulNBits)")
    rec = gs.import_onnx(onnx.load(model_path("ppocr-rec")))
    reason = seasoning.why_not(rec, BACKEND)
    # its attention and CTC head hold 38% of its weight bytes (Constant nodes, as
    # Paddle2ONNX writes weights), its convolutions the rest
    assert reason is not None and reason.startswith("constant MatMul weights are 38% of")
    det = gs.import_onnx(onnx.load(model_path("ppocr-det")))
    assert seasoning.why_not(det, BACKEND) == "no MatMul with a constant weight"


def test_a_trained_recognizer_runs_quantized_and_reads_most_text_the_same(
        model_path: Callable[[str], Path]) -> None:
    model = onnx.load(model_path("ppocr-rec"))
    result, quantized = season(model)
    # its 9 MatMuls on weights (Constant nodes made initializers); the 4 attention
    # products of two activations stay MatMul
    assert result.stats["quantized_nodes"] == 9
    assert sum(n.op_type == "MatMul" for n in quantized.graph.node) == 4
    agree, total = 0, 0
    for feed in load_inputs("ppocr-rec", count=4):
        (fp32,), (int4,) = run(model, dict(feed)), run(quantized, dict(feed))
        assert fp32.shape == int4.shape and np.isfinite(int4).all()
        agree += int((fp32.argmax(-1) == int4.argmax(-1)).sum())
        total += fp32.shape[0] * fp32.shape[1]
    # the argmax label of each of the 4 x 40 time steps, int4 against FP32: 159 of 160
    # agree (2026-12-07, onnxruntime 1.32); about 10% weight error per block moves few
    assert agree / total > 0.95, agree / total
    assert result.stats["weight_bytes_before"] / result.stats["weight_bytes_after"] > 5


def test_a_search_builds_times_and_judges_each_variant(registry: Registry,
                                                       tmp_path: Path) -> None:
    onnx.save(mlp(), tmp_path / "m.onnx")
    result = tune(quick_spec(model=tmp_path / "m.onnx", seasonings=("int4-weights",),
                             search="exhaustive", accuracy="cos>=0.99",
                             space={"int4-weights": {"keep_head": (False,)}},
                             output=tmp_path / "out"), registry)
    routes = {t.route: t for t in result.trials if t.route.startswith("int4-weights")}
    expected = {"int4-weights{keep_head=false}",
                "int4-weights{accuracy_level=4,keep_head=false}"} | (
        {"int4-weights{algorithm=hqq,keep_head=false}",
         "int4-weights{accuracy_level=4,algorithm=hqq,keep_head=false}"} if HQQ else set())
    assert set(routes) == expected
    for trial in routes.values():
        assert trial.status in ("ok", "accuracy-failed"), (trial.route, trial.reason)
        assert trial.passes[0]["stats"]["quantized_nodes"] == 2
        assert trial.latency is not None and trial.accuracy["y"]["cos"] > 0.98


def test_precision_repair_keeps_the_matmul_that_adds_the_most_error() -> None:
    model = mlp()
    feeds = [{"x": np.random.default_rng(k).standard_normal((4, 256)).astype(np.float32)}
             for k in range(2)]
    ctx = RouteContext(BACKEND, tuple(feeds), "base", lambda m: BACKEND.evaluate(m, feeds))
    state = RouteState(gs.import_onnx(model))
    Int4Weights({"keep_head": False})(state, ctx)
    result = PrecisionRepair()(state, ctx)  # count=1
    # both MatMuls ranked by the error each adds over its input's; the worst stays FP32
    assert result.stats["ranked"] == 2 and result.stats["kept_fp32"] == 1
    assert result.stats["quantized_nodes"] == 1
    kept = result.note.removeprefix("kept in FP32: ").split(" (")[0]
    out = gs.export_onnx(state.graph)
    ops = {n.name: n.op_type for n in out.graph.node}
    assert ops[kept] == "MatMul" and ops[{"fc1": "fc2", "fc2": "fc1"}[kept]] == "MatMulNBits"
    x = feeds[0]
    # half the weights back in FP32: closer to the FP32 output than int4 throughout
    _, int4 = season(model)
    assert rel_l2(run(out, x)[0], run(model, x)[0]) < rel_l2(run(int4, x)[0],
                                                              run(model, x)[0])


def test_the_output_projection_is_kept_unless_asked() -> None:
    result, out = season(mlp(), keep_head=True)
    ops = {n.name: n.op_type for n in out.graph.node}
    assert ops["fc1"] == "MatMulNBits" and ops["fc2"] == "MatMul"  # fc2 writes y
    assert result.stats["quantized_nodes"] == 1 and result.stats["kept_head"] == 1
    assert result.note.endswith("kept the output projection fc2 as it was")
    model = mlp()  # through a bias Add and a Reshape, as an lm_head's logits often are
    model.graph.node[-1].output[0] = "z"
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(256, np.float32), "b"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([4, 256]), "shape"))
    model.graph.node.extend([helper.make_node("Add", ["z", "b"], ["zb"], name="bias"),
                             helper.make_node("Reshape", ["zb", "shape"], ["y"], name="rs")])
    assert output_projections(gs.import_onnx(model)) == ["fc2"]
    model.graph.node[-1].op_type = "Softmax"  # a probability is not the projection's own
    del model.graph.node[-1].input[1:]
    assert output_projections(gs.import_onnx(model)) == []
