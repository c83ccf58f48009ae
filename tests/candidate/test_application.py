"""What a route's model keeps of the user's model besides its graph (issue 39, kind 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from graphs import conv_bn
from onnx import TensorProto, helper, numpy_helper

from routetune.registry import Registry
from routetune.routes.route import parse_route
from routetune.testing import _candidate

PROPS = {"author": "me", "names": "{0: 'cat', 1: 'dog'}", "stride": "32", "task": "detect"}


def _carrying(model: onnx.ModelProto, path: Path) -> Path:
    """`model` with everything a deployment reads besides the graph, saved at `path`."""
    model.producer_name, model.producer_version = "myexporter", "9.9"
    model.doc_string, model.model_version, model.domain = "a model", 7, "ai.example"
    model.opset_import.append(helper.make_opsetid("com.example.unused", 1))
    helper.set_model_props(model, PROPS)
    onnx.save(model, path)
    return path


def _fields(model: onnx.ModelProto) -> tuple[object, ...]:
    return (model.producer_name, model.producer_version, model.doc_string,
            model.model_version, model.domain, dict((p.key, p.value) for p in
                                                    model.metadata_props),
            sorted((o.domain, o.version) for o in model.opset_import if o.domain != ""
                   and o.domain != "com.microsoft"))


def test_every_rewrite_keeps_what_the_model_carries_besides_its_graph(
        registry: Registry, tmp_path: Path) -> None:
    """fuse-bn-into-conv, fp16 and int8-qdq each write the model again through
    onnx-graphsurgeon, which drops metadata_props, doc_string and model_version."""
    source = _carrying(onnx.load(conv_bn(tmp_path / "c.onnx")), tmp_path / "m.onnx")
    want = _fields(onnx.load(source))
    candidate = _candidate(registry, source, tmp_path / "work", "onnxruntime")
    for route in ("fuse-bn-into-conv", "fp16", "fuse-bn-into-conv,int8-qdq"):
        data, passes, _ = candidate.applier.apply(parse_route(route))
        assert all(p["modified"] for p in passes), route  # each pass rewrote the graph
        assert _fields(onnx.load_from_string(data)) == want, route


def test_local_functions_are_inlined_once_and_said(registry: Registry,
                                                   tmp_path: Path) -> None:
    """A model whose layers are local functions: the preparation inlines them, so that
    fp16 converts their MatMuls, and the route computes what the model did."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16))
                                .astype(np.float32), "w")
    block = helper.make_function(
        "pkg", "Block", ["a", "b"], ["o"],
        [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["o"])],
        [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Block", ["x", "w"], ["h"], domain="pkg"),
         helper.make_node("Block", ["h", "w"], ["y"], domain="pkg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    model = helper.make_model(graph, functions=[block], ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("pkg", 1)])
    source = _carrying(model, tmp_path / "f.onnx")
    candidate = _candidate(registry, source, tmp_path / "work", "onnxruntime")
    assert candidate.inputs.model.changes == ("inlined 1 local function (pkg::Block)",)
    data, passes, _ = candidate.applier.apply(parse_route("fp16"))
    fp16 = onnx.load_from_string(data)
    assert not fp16.functions and [n.op_type for n in fp16.graph.node].count("MatMul") == 2
    assert passes[0]["modified"] and _fields(fp16) == _fields(onnx.load(source))
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    want = ort.InferenceSession(source).run(None, {"x": x})[0]
    got = ort.InferenceSession(data).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0.02, atol=0.05)
