from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from routetune.passes.graph.fold_constants import FoldConstants
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.seasoning import RouteContext, RouteState

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(HEADER + text)
    onnx.checker.check_model(model, full_check=True)
    return model


def initializer_types(model: onnx.ModelProto) -> dict[str, int]:
    return {t.name: t.data_type for t in model.graph.initializer}


def test_folds_a_constant_subgraph(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x) => (float[2,3] y) {
      [c0] a = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
      [c1] b = Constant <value = float[3] {0.5, 0.5, 0.5}> ()
      [add] ab = Add(a, b)
      [mul] y = Mul(x, ab)
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert out.ops == ["Mul"]
    assert initializer_types(out.model) == {"ab": onnx.TensorProto.FLOAT}
    assert_equivalent(model, out.model, random_feeds(model))


def test_is_a_noop_without_anything_to_fold(season):
    model = parse("""
    g (float[2,3] x, float[3] w) => (float[2,3] y) <float[3] w = {1.0, 2.0, 3.0}> {
      [relu] r = Relu(x)
      [mul] y = Mul(r, w)
    }
    """)
    out = season(FoldConstants, model)
    assert not out.result.modified
    assert out.ops == ["Relu", "Mul"]


def test_applicable():
    backend = OnnxRuntimeBackend()
    plain = parse("g (float[2] x) => (float[2] y) { [relu] y = Relu(x) }")
    shape = parse("g (float[2] x) => (int64[1] y) { [shape] y = Shape(x) }")
    assert FoldConstants().applicable(gs.import_onnx(plain), backend) == "no constants to fold"
    assert FoldConstants().applicable(gs.import_onnx(shape), backend) is None


def test_constant_attributes_fold_to_float32_and_int64(season, random_feeds, assert_equivalent):
    # onnx-graphsurgeon reads value_float(s) with np.array: float64, which ORT refuses
    # in Mul(float, double).
    model = parse("""
    g (float[2,3] x) => (float[3,2] y, float[3] z) {
      [c0] a = Constant <value_float = 2.0> ()
      [c1] b = Constant <value_floats = [1.0, 2.0, 3.0]> ()
      [c2] s = Constant <value_ints = [3, 2]> ()
      [c3] k = Constant <value_int = 1> ()
      [m0] ab = Mul(a, b)
      [m1] t = Mul(x, ab)
      [reshape] y = Reshape(t, s)
      [gather] z = Gather <axis = 0> (t, k)
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert out.result.stats["normalized_constants"] == 4
    assert sorted(out.ops) == ["Gather", "Mul", "Reshape"]
    assert initializer_types(out.model) == {
        "ab": onnx.TensorProto.FLOAT,
        "s": onnx.TensorProto.INT64,
        "k": onnx.TensorProto.INT64,
    }
    assert_equivalent(model, out.model, random_feeds(model))


def test_constant_attributes_in_subgraphs_fold_to_float32(season, assert_equivalent):
    model = parse("""
    g (float[2] x, bool c) => (float[2] y) {
      [if] y = If(c) <
        then_branch = t () => (float[2] a) {
          [k0] k = Constant <value_float = 2.0> ()
          [mul] a = Mul(x, k)
        },
        else_branch = e () => (float[2] b) { [relu] b = Relu(x) }
      >
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    then_branch = out.model.graph.node[0].attribute[0].g
    assert [t.data_type for t in then_branch.initializer] == [onnx.TensorProto.FLOAT]
    x = np.array([1.0, -2.0], np.float32)
    for c in (True, False):
        assert_equivalent(model, out.model, {"x": x, "c": np.array(c)})


def test_keeps_user_inputs_that_folding_leaves_unused(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x, float[3,2] like) => (float[3,2] y) {
      [shape] s = Shape(like)
      [reshape] y = Reshape(x, s)
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert out.ops == ["Reshape"]
    assert [i.name for i in out.model.graph.input] == ["x", "like"]
    assert out.model.graph.input[1] == model.graph.input[1]  # name, dtype and shape
    assert_equivalent(model, out.model, random_feeds(model))


def test_drops_initializer_backed_inputs(season, random_feeds):
    # ONNX Runtime treats an initializer listed as an input as overridable, not as a
    # user input: the user-visible signature is get_inputs(), which excludes it.
    model = parse("""
    g (float[2,3] x, float[3] w) => (float[2,3] y) <float[3] w = {1.0, 2.0, 3.0}> {
      [c0] b = Constant <value = float[3] {1.0, 1.0, 1.0}> ()
      [add] wb = Add(w, b)
      [mul] y = Mul(x, wb)
    }
    """)
    out = season(FoldConstants, model)
    assert out.ops == ["Mul"]
    assert [i.name for i in out.model.graph.input] == ["x"]
    sessions = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (model, out.model)
    ]
    assert [[i.name for i in s.get_inputs()] for s in sessions] == [["x"], ["x"]]

    graph = gs.import_onnx(model)
    graph.inputs.append(gs.Constant("stray", np.ones(3, np.float32)))
    FoldConstants()(RouteState(graph=graph), RouteContext(backend=OnnxRuntimeBackend()))
    assert [t.name for t in graph.inputs] == ["x"]


def test_shape_inference_lets_a_shape_gather_reshape_chain_fold(
    season, random_feeds, assert_equivalent
):
    # `r` has no declared shape: only shape inference tells that Shape(r) is static.
    model = parse("""
    g (float[2,3,4] x) => (float[2,12] y) {
      [relu] r = Relu(x)
      [shape] s = Shape(r)
      [c0] i = Constant <value = int64 {0}> ()
      [gather] n = Gather <axis = 0> (s, i)
      [c1] axes = Constant <value = int64[1] {0}> ()
      [unsqueeze] n1 = Unsqueeze(n, axes)
      [c2] rest = Constant <value = int64[1] {-1}> ()
      [concat] target = Concat <axis = 0> (n1, rest)
      [reshape] y = Reshape(r, target)
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert out.ops == ["Relu", "Reshape"]
    assert onnx.numpy_helper.to_array(out.model.graph.initializer[0]).tolist() == [2, -1]
    assert len(out.model.graph.value_info) == 0  # inferred types are not left behind
    assert_equivalent(model, out.model, random_feeds(model))


@pytest.mark.slow
def test_ppocr_classifier(ppocr_cls_path, season, random_feeds, assert_equivalent):
    model = onnx.load(ppocr_cls_path)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert "Constant" not in out.ops
    assert out.ops.count("Reshape") < [n.op_type for n in model.graph.node].count("Reshape")
    assert onnx.TensorProto.DOUBLE not in initializer_types(out.model).values()
    feeds = random_feeds(model, x=(1, 3, 48, 192))
    assert_equivalent(model, out.model, feeds, atol=1e-4)
    again = season(FoldConstants, out.model)
    assert not again.result.modified


def test_leaves_what_onnx_runtime_cannot_evaluate(season):
    # No numerical check: ONNX Runtime has no kernel for the custom op, which is why it
    # must stay while the constants in front of it fold.
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "test.custom" : 1]>
    g (float[3] x) => (float[3] y) {
      [c0] a = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
      [add] ab = Add(a, a)
      [custom] z = test.custom.Mystery(ab)
      [mul] y = Mul(x, z)
    }
    """)
    out = season(FoldConstants, model)
    assert out.result.modified
    assert out.ops == ["Mystery", "Mul"]
    assert list(initializer_types(out.model)) == ["ab"]


@pytest.mark.parametrize("returned", ["a constant", "an outer value"])
def test_a_nested_if_with_a_constant_condition_is_inlined_with_its_outputs_bound(
        season, assert_equivalent, returned):
    # Silero VAD 6.2.3: inside If_0's branches, the decoder's If_1 has a condition that
    # folds, and its taken branch returns a constant. onnx-graphsurgeon's flattening left
    # that output without a producer ("... is not output of any previous nodes").
    value = ("[k] r = Constant <value = float[2] {3.0, 4.0}> ()" if returned == "a constant"
             else "[id] r = Identity(x)")
    model = parse(f"""
    g (float[2] x, bool c) => (float[2] y) {{
      [if0] y = If(c) <
        then_branch = t () => (float[2] a) {{
          [one] one = Constant <value = int64[1] {{1}}> ()
          [eq] k = Equal(one, one)
          [if1] inner = If(k) <
            then_branch = tt () => (float[2] r) {{ {value} }},
            else_branch = te () => (float[2] s) {{ [neg] s = Neg(x) }}
          >
          [add] a = Add(inner, x)
        }},
        else_branch = e () => (float[2] b) {{ [relu] b = Relu(x) }}
      >
    }}
    """)
    out = season(FoldConstants, model)
    assert out.result.modified and out.result.stats["inlined_ifs"] == 1
    then_branch = out.model.graph.node[0].attribute[0].g
    assert "If" not in [n.op_type for n in then_branch.node]
    x = np.array([1.0, -2.0], np.float32)
    for c in (True, False):
        assert_equivalent(model, out.model, {"x": x, "c": np.array(c)})


def test_shape_start_and_end_fold_to_the_slice_of_the_shape(season, random_feeds,
                                                           assert_equivalent):
    # onnx node test test_shape_end_1: Shape(end=1) of a [3, 4, 5] tensor is [3];
    # onnx-graphsurgeon folded the whole shape
    model = parse("""
    g (float[3,4,5] x) => (int64[1] y) { [shape] y = Shape <end = 1> (x) }
    """)
    out = season(FoldConstants, model)
    assert [list(onnx.numpy_helper.to_array(t)) for t in out.model.graph.initializer] == [[3]]
    assert_equivalent(model, out.model, random_feeds(model))


def test_a_shape_with_start_folds_the_dims_it_selects(season, assert_equivalent):
    # Shape(start=1) of [N, 3, 4] then Gather(1): the answer is 4 (the dims it selects
    # are static, N is not among them); onnx-graphsurgeon's Shape-Gather folding read
    # index 1 of the whole shape and gave 3
    model = parse("""
    g (float[N,3,4] x) => (int64 y) {
      [shape] s = Shape <start = 1> (x)
      [one] i = Constant <value = int64 {1}> ()
      [gather] y = Gather(s, i)
    }
    """)
    out = season(FoldConstants, model)
    x = np.zeros((2, 3, 4), np.float32)
    assert_equivalent(model, out.model, {"x": x})
    (y,) = ort.InferenceSession(out.model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert int(y) == 4 and out.ops == []  # folded whole, to the right value


def test_a_shape_with_start_that_cannot_fold_keeps_its_attributes(season, assert_equivalent):
    model = parse("""
    g (float[N,3,4] x) => (int64[2] y) { [shape] y = Shape <end = 2> (x) }
    """)
    out = season(FoldConstants, model)
    assert [(n.op_type, [a.name for a in n.attribute]) for n in out.model.graph.node] == [
        ("Shape", ["end"])]  # N is dynamic: left as it was, not as Shape and Slice
    assert not out.result.modified
    assert_equivalent(model, out.model, {"x": np.zeros((2, 3, 4), np.float32)})
