from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import conv_bn
from onnx import TensorProto, helper
from quick import quick_spec

from routetune.errors import PostconditionError, UsageError
from routetune.model.loading import prepare, sanitize
from routetune.model.postconditions import check_candidate
from routetune.registry import Registry
from routetune.run.tuning import tune


def test_prepare_reads_specs_and_hashes(tmp_path: Path) -> None:
    model = prepare(conv_bn(tmp_path / "m.onnx"))
    assert [str(s) for s in model.inputs] == ["x float32[N,3,32,32]"]
    assert [s.name for s in model.outputs] == ["y"]
    assert len(model.source_sha256) == 64
    assert model.signature == (("x", TensorProto.FLOAT), ("y", TensorProto.FLOAT))


def test_sanitize_names_nodes_drops_initializer_inputs_and_names_dims() -> None:
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, "?", "?"]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, "?", "?"])], [w])
    model = sanitize(helper.make_model(graph))
    assert [n.name for n in model.graph.node] == ["Mul_0", "Relu_1"]
    assert [i.name for i in model.graph.input] == ["x"]
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["x_dim0", "x_dim1", "x_dim2"]


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), (b"hello world", "not a"), (b"", r"the file is empty \(0 bytes\)")],
)
def test_bad_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "m.onnx"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        prepare(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = conv_bn(tmp_path / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="not a valid ONNX file"):
        prepare(tmp_path / "cut.onnx")


def test_check_candidate(tmp_path: Path) -> None:
    model = prepare(conv_bn(tmp_path / "m.onnx"))
    check_candidate(model.proto, model.signature)
    renamed = onnx.load_from_string(model.data)
    renamed.graph.output[0].name = "z"
    renamed.graph.node[-1].output[0] = "z"
    with pytest.raises(PostconditionError, match="changed the model's signature"):
        check_candidate(renamed, model.signature)
    broken = onnx.load_from_string(model.data)
    broken.graph.node[0].input[0] = "missing"
    with pytest.raises(PostconditionError, match="checker rejects"):
        check_candidate(broken, model.signature)


def test_a_backends_own_operator_is_left_to_the_backend_and_the_rest_still_checked(
        tmp_path: Path) -> None:
    from onnx import helper

    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

    ort_ops = frozenset(OnnxRuntimeBackend().operator_schemas())
    model = prepare(conv_bn(tmp_path / "m.onnx"))
    rms = onnx.load_from_string(model.data)  # the Relu becomes ONNX Runtime's RMSNorm
    relu = next(n for n in rms.graph.node if n.op_type == "Relu")
    scale = onnx.numpy_helper.from_array(np.ones(32, np.float32), "rms_scale")
    rms.graph.initializer.append(scale)
    relu.CopyFrom(helper.make_node("SimplifiedLayerNormalization", [relu.input[0], "rms_scale"],
                                   list(relu.output), name=relu.name, axis=-1, epsilon=1e-6))
    with pytest.raises(PostconditionError, match="No Op registered for SimplifiedLayer"):
        check_candidate(rms, model.signature)  # a backend without it: the checker decides
    check_candidate(rms, model.signature, backend_ops=ort_ops)
    assert rms.graph.node[2].domain == ""  # judged on a copy; the model is unchanged
    rms.graph.node[0].input[0] = "missing"  # anything else is still the checker's
    with pytest.raises(PostconditionError, match="checker rejects"):
        check_candidate(rms, model.signature, backend_ops=ort_ops)



def test_layer_normalization_below_opset_17_is_left_to_onnx_runtime() -> None:
    """ONNX defines LayerNormalization from opset 17; ONNX Runtime registers it from
    opset 1 and its transformer optimizer writes it into older models (PP-OCRv4's
    recogniser is opset 12). Only a backend that runs it may keep it."""
    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

    ones = onnx.numpy_helper.from_array(np.ones(8, np.float32), "scale")
    zeros = onnx.numpy_helper.from_array(np.zeros(8, np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="ln",
                          axis=-1, epsilon=1e-5)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [ones, zeros])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    signature = (("x", TensorProto.FLOAT), ("y", TensorProto.FLOAT))
    with pytest.raises(PostconditionError, match="LayerNormalization"):
        check_candidate(model, signature)  # a backend without it: the checker decides
    check_candidate(model, signature,
                    backend_ops=frozenset(OnnxRuntimeBackend().operator_schemas()))
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": x})[0]  # and ONNX Runtime does run it
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-5)


# --- graphs stored out of order, and whole checker messages (real-models issue) -------

def _reversed(src: Path, dst: Path) -> Path:
    model = onnx.load(src)
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, dst)
    return dst


def test_a_graph_stored_out_of_order_is_sorted_not_refused(tmp_path: Path) -> None:
    model = _reversed(conv_bn(tmp_path / "m.onnx"), tmp_path / "reversed.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(onnx.load(model), full_check=True)
    import onnxruntime as ort  # which runs it as stored

    ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    prepared = prepare(model)
    assert [n.op_type for n in prepared.proto.graph.node] == [
        "Conv", "BatchNormalization", "Relu", "Identity"]


def test_a_subgraph_reading_an_outer_value_is_sorted_after_its_producer(tmp_path: Path) -> None:
    then = helper.make_graph([helper.make_node("Identity", ["h"], ["t"], name="then_id")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                        [2])])
    other = helper.make_graph([helper.make_node("Neg", ["h"], ["e"], name="else_neg")],
                              "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT,
                                                                         [2])])
    nodes = [  # the If reads 'h' inside its branches, and is stored before h's producer
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    prepared = prepare(path)
    assert [n.name for n in prepared.proto.graph.node] == ["relu", "if"]


def test_a_checker_message_is_kept_whole_on_one_line(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["res"], name="add"),
             helper.make_node("Relu", ["res"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                     [2])])
    path = tmp_path / "dangling.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(UsageError) as info:
        prepare(path)
    text = str(info.value)
    assert "\n" not in text and not text.rstrip().endswith(":"), text
    assert "nowhere" in text


def test_subgraph_nodes_get_unique_names_too(tmp_path: Path) -> None:
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], [name], name="")], name, [],
                                 [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Relu"),
                            else_branch=branch("e", "Relu"), name="if")
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    proto = prepare(path).proto
    names = [proto.graph.node[0].name] + [
        a.g.node[0].name for a in proto.graph.node[0].attribute]
    assert all(names) and len(set(names)) == 3, names
    check_candidate(proto, prepare(path).signature)  # the base model meets the contract


# --- value_info repeating a graph output (real-models issue, kind 6) -------------------

def _with_repeat(graph: onnx.GraphProto, name: str, elem: int) -> None:
    repeat = graph.value_info.add()  # the type without its shape
    repeat.name = name
    repeat.type.tensor_type.elem_type = elem


@pytest.mark.parametrize("where", ["output", "input"])
def test_a_value_info_repeating_an_input_or_output_is_dropped(tmp_path: Path,
                                                              where: str) -> None:
    # ddddocr 1.6.1's common_old.onnx, saved by ONNX Runtime's optimiser, repeats its output
    # '387' in value_info without the shape; ONNX GraphSurgeon then exported the output
    # without a shape and every graph pass was build-failed by the checker.
    import onnx_graphsurgeon as gs

    model = onnx.load(conv_bn(tmp_path / "m.onnx"))
    _with_repeat(model.graph, "y" if where == "output" else "x", TensorProto.FLOAT)
    onnx.checker.check_model(model)  # valid as given
    exported = gs.export_onnx(gs.import_onnx(model))
    with pytest.raises(onnx.checker.ValidationError, match="'shape' of 'type' is required"):
        onnx.checker.check_model(exported)
    path = tmp_path / "repeat.onnx"
    onnx.save(model, path)
    prepared = prepare(path).proto
    assert not [v for v in prepared.graph.value_info if v.name in ("x", "y")]
    onnx.checker.check_model(gs.export_onnx(gs.import_onnx(prepared)))


def _with_temperature(path: Path) -> Path:
    """y = (x @ w) / temperature, ``temperature`` an initializer (2.0) and a graph input:
    a constant a caller may override, which ONNX Runtime takes as an input."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    t = helper.make_tensor("temperature", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Div", ["m", "temperature"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("temperature", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w, t])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_overridable_initializer_the_user_feeds_stays_an_input(tmp_path: Path) -> None:
    """Not fed, it is a constant (its default); fed (--inputs), an input of the model
    every route starts from, and the preparation says so (issue 39, kind 7)."""
    path = _with_temperature(tmp_path / "t.onnx")
    assert [s.name for s in prepare(path).inputs] == ["x"] and not prepare(path).changes
    fed = prepare(path, fed={"x", "temperature"})
    assert [s.name for s in fed.inputs] == ["x", "temperature"]
    assert [t.name for t in fed.proto.graph.initializer] == ["w"]
    assert fed.changes == ("temperature: overridable initializer fed, so an input "
                           "(no default) of every route",)
    x = np.ones((2, 4), np.float32)
    session = ort.InferenceSession(fed.data)
    got = session.run(None, {"x": x, "temperature": np.array([0.5], np.float32)})[0]
    np.testing.assert_allclose(got, x * 2)  # the value fed, not the default


def test_an_overridable_initializer_in_the_inputs_file_is_tuned_with(
        registry: Registry, tmp_path: Path) -> None:
    path = _with_temperature(tmp_path / "t.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32),
             temperature=np.array([0.5], np.float32))
    result = tune(quick_spec(model=path, inputs=tmp_path / "in.npz", output=tmp_path / "out",
                             seasonings=("fp16",), accuracy="cos>=0.99"), registry)
    winner = onnx.load(result.files["model"])
    assert [i.name for i in winner.graph.input] == ["x", "temperature"]
    record = json.loads(result.files["run"].read_text())
    assert record["model"]["prepared"] == [
        "temperature: overridable initializer fed, so an input (no default) of every route"]
