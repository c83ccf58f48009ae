from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from graphs import conv_bn
from onnx import TensorProto, helper

from routetune.errors import PostconditionError, UsageError
from routetune.model import check_candidate, prepare, sanitize


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
    [(None, "no such file"), (b"hello world", "not a"), (b"", "not an ONNX model")],
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
