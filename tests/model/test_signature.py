"""A model's signature: what the route memory compares models by."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import conv_bn, layernorm, matmul_chain

from routetune.model.signature import ModelSignature


def _signature(path: Path, feeds: dict[str, np.ndarray] | None = None) -> ModelSignature:
    return ModelSignature.of(onnx.load(path), feeds or {})


def test_a_deeper_model_of_the_same_blocks_is_alike_and_another_kind_is_not(
        tmp_path: Path) -> None:
    shallow = _signature(matmul_chain(tmp_path / "a.onnx", depth=4, width=64))
    deep = _signature(matmul_chain(tmp_path / "b.onnx", depth=12, width=64))
    conv = _signature(conv_bn(tmp_path / "c.onnx"))
    assert shallow.similarity(shallow) == pytest.approx(1.0)
    assert deep.similarity(shallow) > 0.8
    assert conv.similarity(shallow) < 0.3
    assert deep.key != shallow.key
    assert shallow.ops["MatMul"] == 4
    assert shallow.parameters == sum(int(np.prod(t.dims)) for t in onnx.load(
        tmp_path / "a.onnx").graph.initializer)


def test_the_signature_holds_the_shapes_fed_and_round_trips_through_json(
        tmp_path: Path) -> None:
    path = layernorm(tmp_path / "ln.onnx")
    feeds = {"x": np.zeros((4, 64), np.float32)}
    sig = _signature(path, feeds)
    assert sig.inputs == (("float32", (4, 64)),)
    again = ModelSignature.from_json(sig.to_json())
    assert again == sig and again.key == sig.key


@pytest.mark.parametrize("data", [
    [], {"ops": {"Conv": -1}, "parameters": 1, "inputs": []},
    {"ops": {"Conv": 1}, "parameters": 1.5, "inputs": []},
    {"ops": {"Conv": 1}, "parameters": 1, "inputs": [["float32", ["a"]]]},
    {"ops": {"x" * 300: 1}, "parameters": 1, "inputs": []},
])
def test_a_malformed_signature_is_refused(data: object) -> None:
    with pytest.raises(ValueError):
        ModelSignature.from_json(data)
