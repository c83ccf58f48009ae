"""int8-qdq and fp8-qdq on small generated graphs and on the PP-OCR direction classifier.

Every model runs in a real ONNX Runtime CPU session; calibration uses four seeded input
sets, and accuracy is measured on a fifth set the calibration never saw.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from quick import quick_spec

from routetune.errors import UsageError
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.onnxruntime.quantize import Fp8Qdq, Int8Qdq
from routetune.registry import Registry
from routetune.run.tuning import tune
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning

BACKEND = OnnxRuntimeBackend()


def make_model(nodes: list, inputs: list, outputs: list, arrays: dict[str, np.ndarray],
               opset: int = 17, as_constant_nodes: bool = False) -> onnx.ModelProto:
    """A checked model whose weights are initializers, or ``Constant`` nodes as in PP-OCR."""
    tensors = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    if as_constant_nodes:
        nodes = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t)
                 for t in tensors] + nodes
        tensors = []
    graph = helper.make_graph(nodes, "g", inputs, outputs, tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def conv_matmul(opset: int = 17, as_constant_nodes: bool = False) -> onnx.ModelProto:
    """x f32[2,3,16,16] -> Conv(8, 3x3) -> Relu -> GlobalAveragePool -> Flatten -> MatMul.

    y is f32[2,10].
    """
    rng = np.random.default_rng(0)
    arrays = {
        "w": (rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 10)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w2"], ["y"], name="matmul"),
    ]
    return make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], arrays, opset,
        as_constant_nodes)


def boxes_and_scores(box_scale: float = 80.0, head: bool = False) -> onnx.ModelProto:
    """A detector's tail: y = Concat(boxes, Sigmoid(scores)), x f32[4,16] -> y f32[4,12].

    boxes = Relu(x @ w1) * box_scale, f32[4,8]: with the default scale, 0..~680 on
    standard-normal inputs; scores = Sigmoid(x @ w2), f32[4,4] in 0..1. With `head`,
    the output is instead ``Concat(...) @ w3``, f32[4,2].
    """
    rng = np.random.default_rng(1)
    arrays = {
        "w1": rng.standard_normal((16, 8)).astype(np.float32),
        "w2": rng.standard_normal((16, 4)).astype(np.float32),
        "k": np.array(box_scale, np.float32),
        "w3": rng.standard_normal((12, 2)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="box_matmul"),
        helper.make_node("Relu", ["m1"], ["r1"], name="box_relu"),
        helper.make_node("Mul", ["r1", "k"], ["boxes"], name="box_scale"),
        helper.make_node("MatMul", ["x", "w2"], ["m2"], name="score_matmul"),
        helper.make_node("Sigmoid", ["m2"], ["scores"], name="score_sigmoid"),
        helper.make_node("Concat", ["boxes", "scores"], ["cat"], name="concat", axis=1),
    ]
    if head:
        nodes.append(helper.make_node("MatMul", ["cat", "w3"], ["y"], name="head"))
    else:
        nodes[-1].output[0] = "y"
        del arrays["w3"]
    shape = [4, 2] if head else [4, 12]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], arrays)


def feeds_for(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """`count` seeded standard-normal input sets of the model's static input shapes."""
    rng = np.random.default_rng(seed)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return [{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def season(cls: type[Seasoning], model: onnx.ModelProto, **params: object
           ) -> tuple[PassResult, onnx.ModelProto]:
    """Apply a seasoning as a route does (calibrating on 4 input sets); check the result."""
    graph = gs.import_onnx(model)
    state = RouteState(graph)
    result = cls(params)(state, RouteContext(BACKEND, tuple(feeds_for(model, 4, seed=0))))
    assert state.graph is graph
    exported = gs.export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    return result, exported


def run(model: onnx.ModelProto, feed: dict, optimize: bool = True) -> np.ndarray:
    """The first output of one CPU run (ONNX Runtime optimisations all on, or off)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def dequantized_readers(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes (other than Q/DQ) that read a DequantizeLinear output."""
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.name for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and dq & set(n.input)}


@pytest.mark.parametrize("calibration", ["minmax", "entropy", "percentile"])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_conv_matmul(calibration: str, per_channel: bool, symmetric: bool) -> None:
    model = conv_matmul()
    result, quantized = season(Int8Qdq, model, calibration=calibration,
                               per_channel=per_channel, symmetric_activations=symmetric)
    assert result.modified
    assert result.stats["quantized_nodes"] == 2
    assert result.stats["excluded_range_mismatch"] == 0
    q, dq = "QuantizeLinear", "DequantizeLinear"
    assert [n.op_type for n in quantized.graph.node] == [
        dq, dq, dq, q, dq, "Conv", q, dq, "Relu", "GlobalAveragePool", "Flatten", q, dq,
        "MatMul", q, dq]  # weights, bias; input, Conv, its output; MatMul input and output
    assert dequantized_readers(quantized) == {"conv", "relu", "matmul"}
    weight = next(t for t in quantized.graph.initializer if t.name.startswith("w_"))
    assert weight.data_type == TensorProto.INT8
    assert len(weight.dims) == 4  # the int8 Conv weight, f32 scale per channel or per tensor
    feed = feeds_for(model, 1, seed=7)[0]
    expected = run(model, feed, optimize=False)
    for optimize in (False, True):
        got = run(quantized, feed, optimize)
        # measured max error / max|y|: 0.58..1.03% with optimisations off; on, ONNX
        # Runtime's fused per-channel kernels saturate on x86 without VNNI: up to 1.56%
        assert np.abs(got - expected).max() <= 0.025 * np.abs(expected).max()


def test_int8_constant_node_weights_at_opset_11() -> None:
    # Paddle2ONNX models: every weight a Constant node, opset 11 (no DequantizeLinear axis)
    model = conv_matmul(opset=11, as_constant_nodes=True)
    result, quantized = season(Int8Qdq, model, per_channel=True)
    assert result.modified
    assert "3 Constant nodes became initializers" in result.note
    assert "opset 11 -> 13" in result.note
    assert quantized.opset_import[0].version == 13
    weights = {t.name: t for t in quantized.graph.initializer}
    assert weights["w_quantized"].data_type == TensorProto.INT8
    assert numpy_helper.to_array(weights["w_scale"]).shape == (8,)  # per output channel
    assert "Constant" not in [n.op_type for n in quantized.graph.node]
    feed = feeds_for(model, 1, seed=7)[0]
    expected = run(model, feed, optimize=False)
    assert np.abs(run(quantized, feed) - expected).max() <= 0.025 * np.abs(expected).max()


READERS = {"box_matmul", "box_relu", "score_matmul", "score_sigmoid"}
"""The quantized MatMuls, and the readers of their quantized outputs."""


def test_concat_of_boxes_and_scores_is_kept_fp32() -> None:
    model = boxes_and_scores()
    feed = feeds_for(model, 1, seed=7)[0]
    expected = run(model, feed, optimize=False)
    assert 400 < expected[:, :8].max() < 1000 and expected[:, 8:].max() < 1
    op_types = ("MatMul", "Concat")

    result, quantized = season(Int8Qdq, model, per_channel=False, op_types=op_types)
    assert result.stats["excluded_range_mismatch"] == 1
    assert result.stats["quantized_nodes"] == 2
    assert result.note == ("excluded for range mismatch: concat: inputs max |x| boxes 711, "
                           "scores 1 (711x)")  # calibrated on the 4 input sets
    # the MatMuls and their outputs' readers are quantized, the Concat is not
    assert dequantized_readers(quantized) == READERS
    got = run(quantized, feed)
    assert np.abs(got[:, 8:] - expected[:, 8:]).max() < 0.03  # measured 0.0093
    assert np.abs(got[:, :8] - expected[:, :8]).max() < 15  # measured 7.1 of 482

    # Without the rule the one output scale (~680/127 = 5.4 per step) zeroes every score.
    result, unchecked = season(Int8Qdq, model, per_channel=False, op_types=op_types,
                               range_check=False)
    assert result.stats["excluded_range_mismatch"] == 0
    assert dequantized_readers(unchecked) == READERS | {"concat"}
    np.testing.assert_array_equal(run(unchecked, feed)[:, 8:], 0.0)


def test_concat_of_similar_ranges_is_quantized() -> None:
    model = boxes_and_scores(box_scale=0.25)  # boxes 0..~2, scores 0..1: within 10x
    result, quantized = season(Int8Qdq, model, per_channel=False, op_types=("MatMul", "Concat"))
    assert result.stats["excluded_range_mismatch"] == 0
    assert dequantized_readers(quantized) == READERS | {"concat"}


def test_consumer_of_a_mismatched_concat_is_kept_fp32() -> None:
    # Concat is not quantized, but the head MatMul would put one scale on its output.
    model = boxes_and_scores(head=True)
    result, quantized = season(Int8Qdq, model, per_channel=False, op_types=("MatMul",))
    assert result.stats["excluded_range_mismatch"] == 1
    assert result.note == ("excluded for range mismatch: head: reads concat whose inputs "
                           "max |x| boxes 711, scores 1 (711x)")
    assert dequantized_readers(quantized) == READERS


def test_user_exclusions_and_nothing_left() -> None:
    model = conv_matmul()
    result, quantized = season(Int8Qdq, model, nodes_to_exclude=("conv",))
    assert result.stats["quantized_nodes"] == 1
    assert dequantized_readers(quantized) == {"matmul"}
    graph = gs.import_onnx(model)
    result = Int8Qdq({"nodes_to_exclude": ("conv", "matmul")})(
        RouteState(graph), RouteContext(BACKEND, tuple(feeds_for(model, 2, 0))))
    assert not result.modified and result.stats["quantized_nodes"] == 0
    assert [n.op for n in graph.nodes] == ["Conv", "Relu", "GlobalAveragePool", "Flatten",
                                           "MatMul"]


def test_already_quantized_models_are_not_applicable(tmp_path: Path) -> None:
    model = conv_matmul()
    onnx.save(model, tmp_path / "fp32.onnx")
    quantize_dynamic(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx", op_types_to_quantize=[
        "MatMul"], weight_type=QuantType.QInt8)
    dynamic = gs.import_onnx(onnx.load(tmp_path / "dynamic.onnx"))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op for n in dynamic.nodes}
    _, qdq = season(Int8Qdq, model)
    for graph, found in [(dynamic, "DynamicQuantizeLinear, MatMulInteger"),
                         (gs.import_onnx(qdq), "DequantizeLinear, QuantizeLinear")]:
        assert Int8Qdq().applicable(graph, BACKEND) == (
            f"the model is quantized already ({found}); quantizing it again would stack "
            "Q/DQ on quantized tensors")
    assert Int8Qdq().applicable(gs.import_onnx(model), BACKEND) is None


def test_not_applicable_without_ops_or_on_other_backends() -> None:
    relu = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], {})
    assert Int8Qdq().applicable(gs.import_onnx(relu), BACKEND) == (
        "no Conv/MatMul/Gemm node to quantize")

    class Other(OnnxRuntimeBackend):
        name = "other"

    assert Int8Qdq().why_not(gs.import_onnx(conv_matmul()), Other()) == (
        "applies only to backends onnxruntime, openvino, tensorrt")


def test_fp8_is_not_applicable_on_the_cpu_provider() -> None:
    reason = Fp8Qdq().applicable(gs.import_onnx(conv_matmul()), BACKEND)
    assert reason is not None
    assert reason.startswith("ONNX Runtime's CPUExecutionProvider has no FP8 (float8e4m3fn) "
                             "kernels for Conv/MatMul")
    assert "TensorRT" in reason


def test_fp8_on_the_cpu_is_only_emulated(tmp_path: Path) -> None:
    # What the reason above rests on: the CPU runs FP8 Q/DQ, but Conv stays FP32.
    model = conv_matmul()
    result, quantized = season(Fp8Qdq, model)
    assert result.modified and result.stats["quantized_nodes"] == 2
    assert quantized.opset_import[0].version == 19
    fp8 = {t.name for t in quantized.graph.initializer
           if t.data_type == TensorProto.FLOAT8E4M3FN}
    assert "w_quantized" in fp8
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    session = ort.InferenceSession(quantized.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    feed = feeds_for(model, 1, seed=7)[0]
    expected = run(model, feed, optimize=False)
    # measured 0.53 of max|y| 7.14: FP8 e4m3 keeps 3 mantissa bits
    assert np.abs(session.run(None, feed)[0] - expected).max() < 0.1 * np.abs(expected).max()
    optimized = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert "QuantizeLinear" in optimized and "DequantizeLinear" in optimized
    assert not [op for op in optimized if op.startswith("QLinear") or "Integer" in op]




def test_tune_int8_on_a_small_model(registry: Registry, tmp_path: Path) -> None:
    onnx.save(conv_matmul(), tmp_path / "m.onnx")
    result = tune(quick_spec(model=tmp_path / "m.onnx", seasonings=("int8-qdq",),
                             search="exhaustive", output=tmp_path / "out"),
                  registry)
    int8 = [t for t in result.trials if t.route.startswith("int8-qdq")]
    assert len(int8) == 2 * 2  # per_channel x symmetric; other values are pin-only
    for trial in int8:
        if trial.status == "skipped":  # coarser than a finer route that failed
            finer = next(t for t in int8 if trial.reason.startswith(
                f"not built: quantizes more coarsely than route '{t.route}' ("))
            assert finer.status == "accuracy-failed", trial.reason
            continue
        assert trial.status in ("ok", "accuracy-failed"), (trial.route, trial.reason)
        assert trial.reason
        # Conv and MatMul; with the chain ops also Relu, GlobalAveragePool and Flatten,
        # less the Relu that asymmetric activations fold into the Conv's output scale
        chain, asym = "op_types=[" in trial.route, "symmetric_activations=false" in trial.route
        expected = 2 if not chain else 4 if asym else 5
        assert trial.passes[0]["stats"]["quantized_nodes"] == expected
        assert trial.accuracy["y"]["cos"] > 0.998


def test_tune_int8_skips_a_quantized_model(registry: Registry, tmp_path: Path) -> None:
    _, qdq = season(Int8Qdq, conv_matmul())
    onnx.save(qdq, tmp_path / "q.onnx")
    result = tune(quick_spec(model=tmp_path / "q.onnx", seasonings=("int8-qdq", "ort-threads"),
                             search="exhaustive", output=tmp_path / "out"),
                  registry)
    assert result.not_applicable["int8-qdq"].startswith("the model is quantized already")
    assert ("int8-qdq", "skipped", result.not_applicable["int8-qdq"]) in [
        (t.route, t.status, t.reason) for t in result.trials]
    # named alone, nothing is left to search: a usage error with the reason
    with pytest.raises(UsageError, match=r"routetune.tune\(seasonings=...\) int8-qdq: none "
                       "applies here "
                       r"\(int8-qdq: the model is quantized already"):
        tune(quick_spec(model=tmp_path / "q.onnx", seasonings=("int8-qdq",),
                        output=tmp_path / "out2"), registry)


@pytest.mark.slow
def test_tune_int8_ppocr_cls(model_path: Callable[[str], Path], registry: Registry,
                             tmp_path: Path) -> None:
    # base + the first 4 int8 routes: per-channel MinMax, symmetric or not, both op sets
    result = tune(quick_spec(model=model_path("ppocr-cls"), shapes="x:1x3x48x192",
                             seasonings=("int8-qdq",), search="exhaustive",
                             max_trials=5, output=tmp_path / "out"), registry)
    int8 = [t for t in result.trials if t.route.startswith("int8-qdq")]
    assert len(int8) == 4
    for trial in int8:
        if trial.status == "skipped":  # coarser than a finer route that failed
            assert trial.reason.startswith("not built: quantizes more coarsely than route "
                                           "'int8-qdq"), trial.reason
            continue
        assert trial.status in ("ok", "accuracy-failed"), (trial.route, trial.reason)
        stats = trial.passes[0]["stats"]
        assert stats["quantized_nodes"] >= 54  # 53 Conv and the MatMul
        assert trial.passes[0]["note"].startswith("308 Constant nodes became initializers")
        # on these synthesised uniform-noise inputs every route measured cos 0.978..0.984
        # and failed the default l0 bound; on the example's text images per-tensor routes pass
        (accuracy,) = trial.accuracy.values()
        assert accuracy["cos"] > 0.95


def test_a_model_that_computes_in_float16_is_declined_not_broken() -> None:
    """Zoo sweep: int8-qdq on an FP16 classifier wrote a float32 DequantizeLinear scale
    for float16 data, an invalid model. Declined up front, and inside a route (after
    fp16) with the same reason."""
    w = (np.arange(80, dtype=np.float32).reshape(8, 10) / 80).astype(np.float16)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 10])],
                       {"w": w})
    reason = Int8Qdq().applicable(gs.import_onnx(model), BACKEND)
    assert reason is not None and reason.startswith(
        "the model computes in float16 already (MatMul 'mm' reads 'x')")
    feeds = ({"x": np.ones((2, 8), np.float16)},)
    with pytest.raises(ValueError, match="Q/DQ quantization takes an FP32 model"):
        Int8Qdq()(RouteState(gs.import_onnx(model)), RouteContext(BACKEND, feeds))
    assert Int8Qdq().applicable(gs.import_onnx(conv_matmul()), BACKEND) is None


def passthrough(first: bool, weight_output: bool = False) -> onnx.ModelProto:
    """x f32[1,3,16,16] -> Conv -> Relu -> y, with x itself a graph output too (first or
    last), and optionally the Conv's weight as an output: legal ONNX that ONNX Runtime's
    quantizer 1.32 meets with "Graph is not a DAG" (issue 39)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])
    x_out = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    outputs = [x_out, y] if first else [y, x_out]
    if weight_output:
        outputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 3, 3, 3]))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "passthrough",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])], outputs, [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize(("first", "weight_output"), [(False, False), (True, True)])
def test_a_graph_input_passed_through_as_an_output_is_quantized_around(
        registry: Registry, tmp_path: Path, first: bool, weight_output: bool) -> None:
    model = passthrough(first, weight_output)
    onnx.save(model, tmp_path / "m.onnx")
    result = tune(quick_spec(model=tmp_path / "m.onnx", seasonings=("int8-qdq",),
                             search="exhaustive", output=tmp_path / "out",
                             accuracy="cos>=0.99", keep="all"), registry)
    int8 = [t for t in result.trials if t.route.startswith("int8-qdq")]
    assert len(int8) == 4
    for trial in int8:  # none crashed: every route was built, run and judged
        assert trial.status in ("ok", "accuracy-failed"), (trial.route, trial.reason)
        record = trial.passes[-1]
        assert record["stats"]["quantized_nodes"] == 1
        assert "1 graph output(s) that pass a graph input through (x) left out of the " \
               "quantizer and kept as they are" in record["note"]
        assert trial.accuracy["x"]["cos"] == pytest.approx(1.0, abs=1e-12)  # passed through
        candidate = onnx.load(tmp_path / "out" / str(trial.artifact))
        assert [o.name for o in candidate.graph.output] == [
            o.name for o in model.graph.output]


def test_a_model_whose_outputs_all_pass_inputs_through_is_declined() -> None:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="dead")], "all-through",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")])
    found = Int8Qdq().applicable(gs.import_onnx(helper.make_model(graph)), OnnxRuntimeBackend())
    assert found == "every graph output is a graph input: no output is computed"


def _sequence_model() -> onnx.ModelProto:
    """x f32[1,S,16] -> MatMul(16x16) -> Relu -> MatMul(16x8) -> y f32[1,S,8]: a dynamic
    sequence length, as a text or audio encoder has."""
    rng = np.random.default_rng(3)
    arrays = {"w1": (rng.standard_normal((16, 16)) / 4).astype(np.float32),
              "w2": (rng.standard_normal((16, 8)) / 4).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, "S", 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 8])],
                      arrays)


@pytest.mark.parametrize("calibration", ["minmax", "entropy", "percentile"])
def test_every_calibration_takes_input_sets_of_different_lengths(calibration: str) -> None:
    """Validation inputs of sequence lengths 5, 9 and 5: ONNX Runtime's histogram
    calibrators raised "inhomogeneous shape after 2 dimensions" (issue 39, kind 6)."""
    model = _sequence_model()
    rng = np.random.default_rng(4)
    feeds = tuple({"x": rng.standard_normal((1, n, 16)).astype(np.float32)} for n in (5, 9, 5))
    state = RouteState(gs.import_onnx(model))
    result = Int8Qdq({"calibration": calibration})(state, RouteContext(BACKEND, feeds))
    assert result.modified and result.stats["quantized_nodes"] == 2
    if calibration != "minmax":
        assert f"{calibration} histograms collected over 2 groups" in result.note
    quantized = gs.export_onnx(state.graph)
    for feed in feeds:
        want = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
        got = ort.InferenceSession(quantized.SerializeToString()).run(None, feed)[0]
        assert got.shape == want.shape
        cos = float(np.dot(got.ravel(), want.ravel())
                    / np.linalg.norm(got) / np.linalg.norm(want))
        assert cos > 0.99, (calibration, cos)


def test_histograms_of_one_shape_are_the_quantizers_own(tmp_path: Path) -> None:
    """Input sets of one shape make one group: the ranges equal quantize_static's."""
    model = _sequence_model()
    rng = np.random.default_rng(5)
    feeds = tuple({"x": rng.standard_normal((1, 7, 16)).astype(np.float32)} for _ in range(3))
    ours = RouteState(gs.import_onnx(model))
    Int8Qdq({"calibration": "percentile"})(ours, RouteContext(BACKEND, feeds))
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    from routetune.plugins.onnxruntime.calibration import _Feeds

    onnx.save(model, tmp_path / "m.onnx")
    quantize_static(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), _Feeds(feeds),
                    quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                    calibrate_method=CalibrationMethod.Percentile,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})

    def scales(graph: onnx.GraphProto) -> dict[str, float]:  # the activations' ranges
        return {t.name: float(numpy_helper.to_array(t)) for t in graph.initializer
                if t.name.endswith("_scale") and not t.name.startswith("w")}

    theirs = scales(onnx.load(tmp_path / "q.onnx").graph)
    assert theirs and scales(gs.export_onnx(ours.graph).graph) == theirs
