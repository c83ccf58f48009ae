"""fp16/bf16 on small named graphs and on the real PP-OCRv4 detector, with real ORT sessions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from graphs import conv_bn, layernorm
from onnx import TensorProto, helper, numpy_helper
from quick import quick_spec

from routetune.feeds.examples import get_example
from routetune.model.loading import PreparedModel, prepare
from routetune.model.postconditions import cast_faults, check_candidate
from routetune.passes.graph.fuse_bn_into_conv import FuseBnIntoConv
from routetune.passes.precision.mixed import Bf16, Fp16
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.registry import Registry
from routetune.run.tuning import tune
from routetune.seasoning import PassResult, RouteContext, RouteState

BACKEND = OnnxRuntimeBackend()


def ctx(feeds: list[dict[str, np.ndarray]]) -> RouteContext:
    return RouteContext(BACKEND, tuple(feeds), "base",
                        lambda model: BACKEND.evaluate(model, feeds))


def convert(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], cls=Fp16,  # noqa: ANN001
            **params: object) -> tuple[PassResult, onnx.ModelProto]:
    graph = gs.import_onnx(model)
    result = cls(params)(RouteState(graph), ctx(feeds))
    out = gs.export_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    return result, out


def run(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feed))


def low_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes that write a float16 tensor, the inserted Casts left out."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.value_info, *inferred.graph.output]}
    return {n.name for n in model.graph.node
            if any(types.get(o) == TensorProto.FLOAT16 for o in n.output)
            and not (n.op_type == "Cast" and n.name.endswith(("_to_float16", "_to_fp32")))}


def narrow_widen_pairs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    producer = {o: n for n in model.graph.node for o in n.output}
    pairs = []
    for n in model.graph.node:
        if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT:
            src = producer.get(n.input[0])
            narrows = src is not None and src.op_type == "Cast" and (
                src.attribute[0].i == TensorProto.FLOAT16)
            if narrows:
                pairs.append((src.name, n.name))
    return pairs


def make(nodes: list, inputs: list, outputs: list, inits: list = (),
         opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # onnx >= 1.19 writes IR 11+, which older onnxruntime refuses
    onnx.checker.check_model(model, full_check=True)
    return model


def f32(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_written_out_layernorm_keeps_the_squares_in_fp32(tmp_path: Path) -> None:
    # ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div, |x - mean| ~ 400
    model = onnx.load(layernorm(tmp_path / "ln.onnx"))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 64)) * 150).astype(np.float32)
    x[:, 0] = 400.0
    result, out = convert(model, [{"x": x}])
    # sq reaches 160000 > 65504; var, var_eps and std stay above data_max 512 or feed it
    assert low_nodes(out) == {"mean", "sub", "div"}
    assert result.stats["kept_data_max"] == 4
    assert "pow: 'sq' reaches" in result.note
    assert not narrow_widen_pairs(out)
    np.testing.assert_allclose(run(out, {"x": x})[0], run(model, {"x": x})[0], atol=2e-3)


def test_bn_variance_out_of_fp16_range_keeps_bn_fp32_or_fuses_first() -> None:
    rng = np.random.default_rng(1)
    var = np.full(8, 1e8, np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(8, np.float32) * 5e3, "scale"),
             numpy_helper.from_array(np.zeros(8, np.float32), "bias"),
             numpy_helper.from_array(np.zeros(8, np.float32), "mean"),
             numpy_helper.from_array(var, "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"],
                              name="bn"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    model = make(nodes, [f32("x", [1, 3, 8, 8])], [f32("y", [1, 8, 8, 8])], inits)
    feed = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    result, out = convert(model, [feed])
    assert "bn" not in low_nodes(out) and {"conv", "relu"} <= low_nodes(out)
    assert result.stats["init_overflow_values"] == 8  # counted, not clamped
    assert "constant 'var' has 8 values above 65504" in result.note
    ref, got = run(model, feed)[0], run(out, feed)[0]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
    # fuse-bn-into-conv first: the variance disappears into the weights, all of it runs low
    graph = gs.import_onnx(model)
    FuseBnIntoConv()(RouteState(graph), ctx([feed]))
    result, fused = convert(gs.export_onnx(graph), [feed])
    assert low_nodes(fused) == {"conv", "relu"}
    assert result.stats["init_overflow_values"] == 0


def test_cast_from_int64_and_resize_scales_load_in_onnxruntime() -> None:
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Cast", ["mask"], ["maskf"], name="cast_mask", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "maskf"], ["masked"], name="mul"),
        helper.make_node("Resize", ["masked", "", "scales"], ["y"], name="resize", mode="nearest"),
    ]
    model = make(nodes, [f32("x", [1, 2, 4, 4]),
                         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 2, 4, 4])],
                 [f32("y", [1, 2, 8, 8])], [scales], opset=13)
    feed = {"x": np.random.default_rng(2).random((1, 2, 4, 4), np.float32),
            "mask": np.ones((1, 2, 4, 4), np.int64)}
    _, out = convert(model, [feed])
    cast = next(n for n in out.graph.node if n.name == "cast_mask")
    assert cast.attribute[0].i == TensorProto.FLOAT16
    resize = next(n for n in out.graph.node if n.name == "resize")
    scales_init = next(i for i in out.graph.initializer if i.name == resize.input[2])
    assert scales_init.data_type == TensorProto.FLOAT  # the spec keeps scales float
    np.testing.assert_allclose(run(out, feed)[0], run(model, feed)[0], atol=1e-3)


def test_large_value_between_blocked_ops_never_narrows() -> None:
    big = numpy_helper.from_array(np.array(1e5, np.float32), "big")
    nodes = [helper.make_node("Mul", ["x", "big"], ["up"], name="scale_up"),
             helper.make_node("Relu", ["up"], ["mid"], name="relu"),
             helper.make_node("Div", ["mid", "big"], ["y"], name="scale_down")]
    model = make(nodes, [f32("x", [16])], [f32("y", [16])], [big])
    feed = {"x": np.linspace(-1, 1, 16, dtype=np.float32)}
    result, out = convert(model, [feed], nodes_to_exclude=("scale_up", "scale_down"))
    assert low_nodes(out) == set()
    assert [n.op_type for n in out.graph.node] == ["Mul", "Relu", "Div"]
    assert not narrow_widen_pairs(out)
    assert result.stats["kept_excluded"] == 2 and result.stats["kept_data_max"] == 1


def test_if_subgraph_keeps_its_outer_inputs_fp32() -> None:
    then_g = helper.make_graph([helper.make_node("Relu", ["h"], ["t_out"], name="then_relu")],
                               "then", [], [f32("t_out", [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e_out"], name="else_neg")],
                               "else", [], [f32("e_out", [4])])
    nodes = [helper.make_node("Tanh", ["x"], ["h"], name="tanh"),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g,
                              else_branch=else_g)]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    model = make(nodes, [f32("x", [4]), cond], [f32("y", [4])])
    feed = {"x": np.array([-1, 0, 1, 2], np.float32), "cond": np.array(True)}
    result, out = convert(model, [feed])
    assert result.stats["kept_subgraph"] == 1 and result.stats["kept_blocked"] == 1
    np.testing.assert_allclose(run(out, feed)[0], run(model, feed)[0])


def test_already_low_or_quantized_models_are_not_converted_again(tmp_path: Path) -> None:
    half = make([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])])
    reason = Fp16().applicable(gs.import_onnx(half), BACKEND)
    assert reason == "the model is already in low precision (mostly float16 tensors)"
    from onnxruntime.quantization import quantize_dynamic

    w = numpy_helper.from_array(np.random.default_rng(3).random((16, 16), np.float32), "w")
    fp32 = make([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
                [f32("x", [2, 16])], [f32("y", [2, 16])], [w], opset=13)
    onnx.save(fp32, tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"))
    reason = Fp16().applicable(gs.import_onnx(onnx.load(tmp_path / "q.onnx")), BACKEND)
    assert reason.startswith("the model is already quantized (DynamicQuantizeLinear")
    assert "MatMulInteger" in reason


def partly_converted() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x f32 -> Cast(f16) -> Relu(f16) -> Cast(f32) -> + x -> MatMul(Cast(W f16 -> f32)) -> y.

    Half done by hand, as models exported with some layers already in FP16 are: an FP32
    tensor already cast to FLOAT16 once, and an FP16 weight widened for an FP32 MatMul.
    """
    w = numpy_helper.from_array(np.random.default_rng(4).standard_normal((8, 8))
                                .astype(np.float16), "w16")
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="to_half", to=TensorProto.FLOAT16),
        helper.make_node("Relu", ["x16"], ["r16"], name="relu"),
        helper.make_node("Cast", ["r16"], ["r"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Add", ["r", "x"], ["s"], name="add"),
        helper.make_node("Cast", ["w16"], ["w"], name="widen_w", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="matmul"),
    ]
    model = make(nodes, [f32("x", [4, 8])], [f32("y", [4, 8])], [w])
    return model, {"x": np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)}


def test_a_partly_converted_model_comes_out_without_redundant_casts() -> None:
    model, feed = partly_converted()
    assert cast_faults(model) == frozenset()
    result, out = convert(model, [feed])
    # rule 4 would turn to_float and widen_w into float16 -> float16 Casts, and add would
    # cast x to float16 a second time: rule 7 removes all three
    assert cast_faults(out) == frozenset()
    assert result.stats["same_type_casts"] == 2 and result.stats["duplicate_casts"] == 1
    assert {"add", "matmul", "relu"} <= low_nodes(out)
    check_candidate(out, prepare_proto(model).signature)
    np.testing.assert_allclose(run(out, feed)[0], run(model, feed)[0], rtol=1e-2, atol=1e-2)
    full = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(full.run(None, feed)[0], run(model, feed)[0], rtol=1e-2,
                               atol=1e-2)  # and ONNX Runtime's optimiser takes it


def test_cast_faults_name_same_type_and_repeated_casts() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["a"], name="c1", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["b"], name="c2", to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["x"], ["c"], name="c3", to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["b"], ["d"], name="c4", to=TensorProto.FLOAT),
             helper.make_node("Sum", ["a", "d"], ["s"], name="sum"),
             helper.make_node("Cast", ["c"], ["y"], name="c5", to=TensorProto.FLOAT)]
    model = make(nodes, [f32("x", [2])], [f32("y", [2]), f32("s", [2])])
    assert cast_faults(model) == {
        "Cast 'c1' casts 'x' to FLOAT, the type it already has",
        "Cast 'c3' casts 'x' to FLOAT16 again (as 'c2' does)",
    }


def prepare_proto(model: onnx.ModelProto) -> PreparedModel:
    return PreparedModel(Path("m.onnx"), "", model, model.SerializeToString(),
                         (), ())


def test_bf16_is_not_applicable_on_the_cpu_provider_and_that_is_true() -> None:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
                 [f32("x", [2, 4])], [f32("y", [2, 4])], [w])
    assert Bf16().applicable(gs.import_onnx(model), BACKEND) == (
        "ONNX Runtime's CPUExecutionProvider has no bfloat16 kernels "
        "(MatMul and Add give NOT_IMPLEMENTED)")
    feed = {"x": np.ones((2, 4), np.float32)}
    graph = gs.import_onnx(model)  # converted without asking the backend: valid ONNX...
    Bf16()(RouteState(graph), RouteContext(BACKEND))
    out = gs.export_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        run(out, feed)  # ...that the CPU provider cannot run
    # asked (rule 8), the backend names the MatMul and bf16 keeps it in FP32
    result, out = convert(model, [feed], cls=Bf16)
    assert result.stats["kept_no_kernel"] == 1 and not result.modified
    assert "matmul: the backend has no bfloat16 kernel: " in result.note
    run(out, feed)


def test_a_tensor_declared_with_unknown_dims_still_becomes_float16() -> None:
    # torch's exporter writes value_info with symbolic dims ('unk__0') that shape
    # inference makes concrete; the type change must outlive that loan (BERT export)
    ints = [numpy_helper.from_array(np.array([v], np.int64), n)
            for n, v in (("start", 0), ("end", 3), ("axis", 1))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "start", "end", "axis"], ["s"], name="slice"),
         helper.make_node("Relu", ["s"], ["y"], name="relu")],
        "g", [f32("x", [2, 6])], [f32("y", [2, 3])], ints,
        value_info=[helper.make_tensor_value_info("s", TensorProto.FLOAT, ["unk__0", "unk__1"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    _, out = convert(model, [{"x": x}])  # convert() runs the full checker
    types = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    assert types.get("s") == TensorProto.FLOAT16
    np.testing.assert_array_equal(run(out, {"x": x})[0], x[:, :3])


def test_keep_io_types_false_gives_a_model_that_takes_and_returns_float16(
        tmp_path: Path) -> None:
    model = onnx.load(conv_bn(tmp_path / "m.onnx", batch=1))
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    result, out = convert(model, [{"x": x}], keep_io_types=False)
    assert [(v.name, v.type.tensor_type.elem_type) for v in (*out.graph.input, *out.graph.output)
            ] == [("x", TensorProto.FLOAT16), ("y", TensorProto.FLOAT16)]
    assert not [n.name for n in out.graph.node if n.op_type == "Cast"]
    assert result.stats["casts"] == 0
    got = run(out, {"x": x.astype(np.float16)})[0]
    assert got.dtype == np.float16
    ref = run(model, {"x": x})[0]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


def test_keep_io_types_false_runs_in_the_search(registry: Registry, tmp_path: Path) -> None:
    class Fp16Io(Fp16):
        info = replace(Fp16.info, name="fp16-io", params=tuple(
            replace(p, choices=(False,), default=False) if p.name == "keep_io_types" else p
            for p in Fp16.info.params))

    registry.add_seasoning(Fp16Io)
    opts = quick_spec(model=conv_bn(tmp_path / "m.onnx", batch=1), output=tmp_path / "out",
                      seasonings=("fp16-io",), accuracy="rel_l2<=0.01")
    trial = next(t for t in tune(opts, registry).trials if t.route == "fp16-io")
    assert trial.status == "ok", trial.reason  # the runner casts the float32 inputs
    assert trial.accuracy["y"]["rel_l2"] < 1e-2


def test_real_ppocr_det_fp16_matches_fp32(model_path: Callable[[str], Path]) -> None:
    example = get_example("ppocr-det")
    model = prepare(model_path("ppocr-det"))
    feeds = example.make_inputs(example.shapes, 0, 2)
    result, out = convert(model.proto, feeds)
    assert result.stats["init_overflow_values"] > 0  # the BN variance of ~9.8e7
    assert result.stats["low_nodes"] > 250
    for feed in feeds:
        ref, got = run(model.proto, feed)[0], run(out, feed)[0]
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


def layer_norm(outputs: int) -> onnx.ModelProto:
    """One LayerNormalization (opset 17) over (4, 64), with its Mean output when 2."""
    names = ["y", "mean"][:outputs]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "bias")]
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], names, name="ln")
    outs = [f32("y", [4, 64])] + ([f32("mean", [4, 1])] if outputs == 2 else [])
    return make([node], [f32("x", [4, 64])], outs, inits, opset=17)


def test_layernorm_runs_in_fp16_unless_its_float_only_mean_is_written() -> None:
    # LayerNormalization's U (Mean, InvStdDev) admits no float16; Y does. Only the
    # parameters bound to the node's tensors count (a spec check over every parameter
    # kept every LayerNorm, and ONNX Runtime's SkipLayerNormalization, in FP32).
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    result, out = convert(layer_norm(1), [{"x": x}])
    assert low_nodes(out) == {"ln"}, result.note
    np.testing.assert_allclose(run(out, {"x": x})[0], run(layer_norm(1), {"x": x})[0],
                               atol=1e-2)
    result, out = convert(layer_norm(2), [{"x": x}])
    assert low_nodes(out) == set()
    assert result.note == "ln: LayerNormalization has no float16 kernel in the spec"


def test_onnx_runtime_s_contrib_operators_are_judged_by_its_own_schemas() -> None:
    """The transformer optimizer's SkipLayerNormalization and BiasGelu (``com.microsoft``)
    are unknown to ``onnx.defs``; ONNX Runtime's schemas admit float16 for both."""
    from routetune.plugins.onnxruntime.transformer_fusion import TransformerFusion

    model = onnx.load(Path(__file__).parents[2] / "data" / "attention"
                      / "bert_sdpa_torchscript.onnx")
    rng = np.random.default_rng(7)
    feed = {"input_ids": rng.integers(0, 100, (2, 16)).astype(np.int64),
            "attention_mask": np.ones((2, 16), np.int64)}
    graph = gs.import_onnx(model)
    TransformerFusion({"model_type": "bert"})(RouteState(graph), ctx([feed]))
    fused = gs.export_onnx(graph)
    ops = {n.op_type for n in fused.graph.node if n.domain == "com.microsoft"}
    assert {"SkipLayerNormalization", "BiasGelu"} <= ops
    result, out = convert(fused, [feed])
    # only the two mask Wheres (a -inf constant) stay in FP32: 3 Casts in all
    assert result.stats["fp32_nodes"] == 2 and result.stats["casts"] == 3, result.note
    assert result.note.count("/attention/self/Where: constant") == 2
    contrib = [n for n in gs.import_onnx(out).nodes if n.domain == "com.microsoft"]
    assert {n.op for n in contrib} == {"SkipLayerNormalization", "BiasGelu"}
    for node in contrib:  # their weights are float16 (shape inference skips contrib ops)
        assert all(t.dtype == np.float16 for t in node.inputs if isinstance(t, gs.Constant))
    np.testing.assert_allclose(run(out, feed)[0], run(fused, feed)[0], atol=2e-2)
