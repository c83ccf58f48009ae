from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from routetune.passes.graph.fuse_bn_into_conv import FuseBnIntoConv
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

C_IN, C_OUT = 4, 8
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C_IN, 8, 8])
SHAPE = [1, C_OUT, 8, 8]
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)


def bn_params(rng: np.random.Generator, channels: int, var_scale: float = 1.0) -> dict:
    params = {
        "scale": rng.uniform(0.5, 1.5, channels) * np.sqrt(var_scale),
        "offset": rng.standard_normal(channels),
        "mean": rng.standard_normal(channels) * np.sqrt(var_scale),
        "var": rng.uniform(0.5, 1.5, channels) * var_scale,
    }
    return {name: value.astype(np.float32) for name, value in params.items()}


def make_model(
    nodes: list[onnx.NodeProto],
    arrays: dict[str, np.ndarray],
    as_constant_nodes: bool = False,
    inputs: tuple = (X,),
    outputs: tuple = (Y,),
) -> onnx.ModelProto:
    """A model whose weights are initializers, or ``Constant`` nodes as in PP-OCR."""
    tensors = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    if as_constant_nodes:
        constants = [
            helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t)
            for t in tensors
        ]
        nodes, tensors = constants + nodes, []
    graph = helper.make_graph(nodes, "g", list(inputs), list(outputs), tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx >= 1.19 writes IR 11+, which older onnxruntime refuses
    onnx.checker.check_model(model, full_check=True)
    return model


def conv_bn(
    group: int = 1, bias: bool = True, var_scale: float = 1.0, as_constant_nodes: bool = False
) -> onnx.ModelProto:
    """x -> Conv(3x3, group) -> BatchNormalization -> Relu -> y."""
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((C_OUT, C_IN // group, 3, 3)).astype(np.float32)}
    if bias:
        arrays["b"] = rng.standard_normal(C_OUT).astype(np.float32)
    arrays.update(bn_params(rng, C_OUT, var_scale))
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", group=group, pads=[1] * 4),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "offset", "mean", "var"], ["n"], name="bn"
        ),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    return make_model(nodes, arrays, as_constant_nodes)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"bias": False}, {"group": 2}, {"group": 4, "bias": False}, {"as_constant_nodes": True}],
    ids=["conv", "no-bias", "grouped", "depthwise", "constant-nodes"],
)
def test_fuses(season, random_feeds, assert_equivalent, kwargs):
    model = conv_bn(**kwargs)
    out = season(FuseBnIntoConv, model)
    assert out.result.modified
    assert out.result.stats == {"fused": 1}
    assert out.ops == ["Conv", "Relu"]
    conv = out.model.graph.node[0]
    assert list(conv.output) == ["n"]  # the Conv writes the BN's output tensor
    assert len(conv.input) == 3
    assert_equivalent(model, out.model, random_feeds(model))


def test_does_not_touch_a_weight_another_conv_shares(season, random_feeds, assert_equivalent):
    rng = np.random.default_rng(1)
    arrays = {"w": rng.standard_normal((C_OUT, C_IN, 1, 1)).astype(np.float32)}
    arrays.update(bn_params(rng, C_OUT))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c0"], name="conv0"),
        helper.make_node(
            "BatchNormalization", ["c0", "scale", "offset", "mean", "var"], ["n"], name="bn"
        ),
        helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1"),
        helper.make_node("Add", ["n", "c1"], ["y"], name="add"),
    ]
    model = make_model(nodes, arrays)
    out = season(FuseBnIntoConv, model)
    assert out.ops == ["Conv", "Conv", "Add"]
    weights = {t.name: numpy_helper.to_array(t) for t in out.model.graph.initializer}
    np.testing.assert_array_equal(weights["w"], arrays["w"])
    assert out.model.graph.node[1].input[1] == "w"
    assert_equivalent(model, out.model, random_feeds(model))


def test_large_variance_fuses_to_finite_weights(season, random_feeds, assert_equivalent):
    # The PP-OCRv4 detector has BatchNormalization variances around 1e8.
    model = conv_bn(var_scale=1e8, as_constant_nodes=True)
    out = season(FuseBnIntoConv, model)
    assert out.result.stats == {"fused": 1}
    for tensor in out.model.graph.initializer:
        values = numpy_helper.to_array(tensor)
        assert values.dtype == np.float32
        assert np.isfinite(values).all()
    assert_equivalent(model, out.model, random_feeds(model), atol=1e-4)


def mismatched(case: str) -> onnx.ModelProto:
    """Conv -> BN models that must not fuse."""
    rng = np.random.default_rng(2)
    arrays = {"w": rng.standard_normal((C_OUT, C_IN, 1, 1)).astype(np.float32)}
    arrays.update(bn_params(rng, C_OUT))
    bn_inputs = ["c", "scale", "offset", "mean", "var"]
    outputs = [Y]
    inputs = [X]
    extra = []
    if case == "conv-output-is-graph-output":
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, SHAPE))
    elif case == "conv-output-has-two-consumers":
        extra = [helper.make_node("Relu", ["c"], ["r"], name="relu")]
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, SHAPE))
    elif case == "runtime-mean":
        del arrays["mean"]
        inputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, [C_OUT]))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", bn_inputs, ["y"], name="bn"),
        *extra,
    ]
    return make_model(nodes, arrays, inputs=tuple(inputs), outputs=tuple(outputs))


@pytest.mark.parametrize(
    "case", ["conv-output-is-graph-output", "conv-output-has-two-consumers", "runtime-mean"]
)
def test_does_not_fuse(season, case):
    model = mismatched(case)
    out = season(FuseBnIntoConv, model)
    assert not out.result.modified
    assert out.result.stats == {"fused": 0}
    assert out.ops == [n.op_type for n in model.graph.node]


def test_applicable():
    backend = OnnxRuntimeBackend()
    assert FuseBnIntoConv().applicable(gs.import_onnx(conv_bn()), backend) is None
    rng = np.random.default_rng(3)
    plain = make_model(
        [helper.make_node("BatchNormalization", ["x", "scale", "offset", "mean", "var"], ["y"])],
        bn_params(rng, C_IN),
        outputs=(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C_IN, 8, 8]),),
    )
    reason = FuseBnIntoConv().applicable(gs.import_onnx(plain), backend)
    assert reason == "no Conv -> BatchNormalization pair"


@pytest.mark.slow
def test_ppocr_classifier(ppocr_cls_path, season, random_feeds, assert_equivalent):
    model = onnx.load(ppocr_cls_path)
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    conv_bns = [
        n
        for n in model.graph.node
        if n.op_type == "BatchNormalization" and producers.get(n.input[0]) == "Conv"
    ]
    assert conv_bns
    out = season(FuseBnIntoConv, model)
    assert out.result.stats == {"fused": len(conv_bns)}
    assert "BatchNormalization" not in out.ops
    assert out.ops.count("Conv") == [n.op_type for n in model.graph.node].count("Conv")
    feeds = random_feeds(model, x=(1, 3, 48, 192))
    assert_equivalent(model, out.model, feeds, atol=1e-4)
