"""``fold-if``: an If whose condition is constant once shapes are known becomes its branch."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from routetune.feeds.profile import ShapeProfile
from routetune.passes.graph.fold_if import FoldIf
from routetune.plugins.tensorrt.backend import TensorRtBackend
from routetune.seasoning import RouteContext, RouteState


def batch_check(batch: int | str = "N") -> onnx.ModelProto:
    """x f32[N,4]; If 'is_single' (Shape(x)[0] == 1): then Relu 'then_relu', else Neg
    'else_neg'; -> y."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"], name="then_relu")],
                             "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT,
                                                                        [batch, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"], name="else_neg")],
                              "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT,
                                                                         [batch, 4])])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], name="batch", axis=0),
        helper.make_node("Equal", ["n", "one"], ["single"], name="is_one"),
        helper.make_node("If", ["single"], ["y"], name="is_single", then_branch=then,
                         else_branch=other),
    ]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1])]
    graph = helper.make_graph(
        nodes, "batch_check", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def fold(model: onnx.ModelProto, profile: ShapeProfile) -> tuple[onnx.ModelProto, dict]:
    graph = gs.import_onnx(model)
    result = FoldIf()(RouteState(graph), RouteContext(TensorRtBackend(profile)))
    exported = gs.export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    return exported, dict(result.stats)


def test_a_profile_that_fixes_the_batch_takes_one_branch(assert_equivalent) -> None:  # noqa: ANN001
    model = batch_check()
    for batch, kept in ((1, "then_relu"), (3, "else_neg")):
        folded, stats = fold(model, ShapeProfile({"x": ((batch, 4),) * 3}))
        assert stats == {"folded": 1, "if_nodes": 1}
        assert [n.name for n in folded.graph.node] == [kept, "y_fold_if"]
        x = np.random.default_rng(0).standard_normal((batch, 4)).astype(np.float32)
        assert_equivalent(model, folded, {"x": x}, atol=0)


def test_a_dynamic_batch_keeps_the_if() -> None:
    folded, stats = fold(batch_check(), ShapeProfile({"x": ((1, 4), (2, 4), (8, 4))}))
    assert stats == {"folded": 0, "if_nodes": 1}
    assert "If" in [n.op_type for n in folded.graph.node]
