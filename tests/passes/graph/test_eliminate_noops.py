from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_graphsurgeon as gs
import pytest

from routetune.passes.graph.eliminate_noops import EliminateNoops
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(HEADER + text)
    onnx.checker.check_model(model, full_check=True)
    return model


def producer_of(model: onnx.ModelProto, name: str) -> str:
    return next(n.op_type for n in model.graph.node if name in n.output)


def test_removes_identity_between_nodes(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x) => (float[2,3] y) {
      [relu] r = Relu(x)
      [id] i = Identity(r)
      [neg] y = Neg(i)
    }
    """)
    out = season(EliminateNoops, model)
    assert out.result.modified
    assert out.result.stats == {"Identity": 1}
    assert out.ops == ["Relu", "Neg"]
    assert_equivalent(model, out.model, random_feeds(model))


def test_renames_the_producer_of_a_graph_output(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
      [relu] r = Relu(x)
      [id0] i = Identity(r)
      [id1] y = Identity(i)
      [neg] z = Neg(r)
    }
    """)
    out = season(EliminateNoops, model)
    assert out.result.stats == {"Identity": 2}
    assert out.ops == ["Relu", "Neg"]
    assert producer_of(out.model, "y") == "Relu"
    assert out.model.graph.output == model.graph.output
    assert_equivalent(model, out.model, random_feeds(model))


def test_removes_identity_of_a_graph_input_feeding_a_node(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x) => (float[2,3] y) {
      [id] i = Identity(x)
      [relu] y = Relu(i)
    }
    """)
    out = season(EliminateNoops, model)
    assert out.ops == ["Relu"]
    assert_equivalent(model, out.model, random_feeds(model))


def test_rewires_consumers_inside_subgraphs(season, assert_equivalent):
    model = parse("""
    g (float[2] x, bool c) => (float[2] y) {
      [id] i = Identity(x)
      [if] y = If(c) <
        then_branch = t () => (float[2] a) { [neg] a = Neg(i) },
        else_branch = e () => (float[2] b) { [relu] b = Relu(i) }
      >
    }
    """)
    out = season(EliminateNoops, model)
    assert out.ops == ["If"]
    x = np.array([1.0, -2.0], np.float32)
    for c in (True, False):
        assert_equivalent(model, out.model, {"x": x, "c": np.array(c)})


@pytest.mark.parametrize(
    "text",
    [
        # input -> output: removing it would drop an output or rename an input
        "g (float[2] x) => (float[2] y) { [id] y = Identity(x) }",
        # both ends are graph outputs
        "g (float[2] x) => (float[2] r, float[2] y) { [relu] r = Relu(x) [id] y = Identity(r) }",
        # an initializer copied to an output
        "g (float[2] x) => (float[2] y, float[2] z) <float[2] w = {1.0, 2.0}> "
        "{ [id] y = Identity(w) [mul] z = Mul(x, w) }",
    ],
    ids=["input-to-output", "output-to-output", "initializer-to-output"],
)
def test_keeps_noops_the_signature_needs(season, random_feeds, assert_equivalent, text):
    model = parse(text)
    out = season(EliminateNoops, model)
    assert not out.result.modified
    assert out.result.stats == {"kept": 1}
    assert out.ops == [n.op_type for n in model.graph.node]
    assert_equivalent(model, out.model, random_feeds(model))


def test_is_a_noop_without_noops(season):
    model = parse("g (float[2] x) => (float[2] y) { [relu] y = Relu(x) }")
    out = season(EliminateNoops, model)
    assert not out.result.modified
    assert out.ops == ["Relu"]
    reason = EliminateNoops().applicable(gs.import_onnx(model), OnnxRuntimeBackend())
    assert reason == "no Identity, Dropout or Cast node"


def test_removes_inference_dropout_and_its_constants(season, random_feeds, assert_equivalent):
    model = parse("""
    g (float[2,3] x) => (float[2,3] y) {
      [c0] ratio = Constant <value = float {0.5}> ()
      [c1] training = Constant <value = bool {0}> ()
      [drop0] d0 = Dropout(x, ratio, training)
      [drop1] d1, unused_mask = Dropout(d0)
      [relu] y = Relu(d1)
    }
    """)
    out = season(EliminateNoops, model)
    assert out.result.stats == {"Dropout": 2}
    assert out.ops == ["Relu"]
    assert_equivalent(model, out.model, random_feeds(model))


@pytest.mark.parametrize(
    "dropout",
    [
        "[drop] d, mask = Dropout(x)\n [cast] m = Cast <to = 1> (mask)",  # mask used
        '[c0] t = Constant <value = bool {1}> ()\n [drop] d = Dropout(x, "", t)',
    ],
    ids=["mask-used", "training-mode-true"],
)
def test_keeps_dropout_that_is_not_a_noop(season, dropout):
    model = parse(f"""
    g (float[2,3] x) => (float[2,3] y) {{
      {dropout}
      [relu] y = Relu(d)
    }}
    """)
    out = season(EliminateNoops, model)
    assert not out.result.modified
    assert "Dropout" in out.ops


def test_keeps_dropout_with_runtime_training_mode(season):
    model = parse("""
    g (float[2,3] x, bool t) => (float[2,3] y) {
      [drop] d = Dropout(x, "", t)
      [relu] y = Relu(d)
    }
    """)
    assert not season(EliminateNoops, model).result.modified


def test_removes_cast_to_the_inferred_input_type(season, random_feeds, assert_equivalent):
    # `r`, `i` and `n` have no declared type: only shape inference knows Cast(i) is a
    # no-op. It must run before the Identity in front of the Cast is disconnected.
    model = parse("""
    g (float[2,3] x, int64[2] s) => (float[2,3] y, int64[2] z) {
      [relu] r = Relu(x)
      [id] i = Identity(r)
      [same] c = Cast <to = 1> (i)
      [y] y = Neg(c)
      [neg] n = Neg(s)
      [widen] w = Cast <to = 1> (n)
      [narrow] z = Cast <to = 7> (w)
    }
    """)
    out = season(EliminateNoops, model)
    assert out.result.stats == {"Identity": 1, "Cast": 1}
    assert out.ops == ["Relu", "Neg", "Neg", "Cast", "Cast"]
    feeds = random_feeds(model)
    feeds["s"] = feeds["s"].astype("int64")
    assert_equivalent(model, out.model, feeds)


@pytest.mark.slow
def test_ppocr_classifier(ppocr_cls_path, season, random_feeds, assert_equivalent):
    model = onnx.load(ppocr_cls_path)
    out = season(EliminateNoops, model)
    assert out.result.modified
    assert out.result.stats == {"Identity": 1}
    assert "Identity" not in out.ops
    assert producer_of(out.model, "save_infer_model/scale_0.tmp_1") == "Softmax"
    feeds = random_feeds(model, x=(1, 3, 48, 192))
    assert_equivalent(model, out.model, feeds, atol=1e-4)
