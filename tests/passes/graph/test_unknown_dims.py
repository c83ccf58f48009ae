"""``name-unknown-dims``: each '?' dimension gets its own name, so TensorRT can build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from routetune.errors import BuildError
from routetune.passes.graph.unknown_dims import NameUnknownDims
from routetune.plugins.tensorrt.backend import NS, TensorRtBackend
from routetune.plugins.tensorrt.module import find_tensorrt
from routetune.profile import ShapeProfile


def paddle_style() -> onnx.ModelProto:
    """x f32[-1,3,?,?] -> Conv (4 channels, 3x3) -> y f32[-1,4,?,?], as Paddle2ONNX writes."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng(0).random(108).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, "?", "?"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_each_placeholder_gets_a_name(season) -> None:  # noqa: ANN001
    done = season(NameUnknownDims, paddle_style())
    dims = [[d.dim_param or d.dim_value for d in t.type.tensor_type.shape.dim]
            for t in (done.model.graph.input[0], done.model.graph.output[0])]
    assert dims == [[-1, 3, "x_dim2", "x_dim3"], [-1, 4, "y_dim2", "y_dim3"]]
    assert dict(done.result.stats) == {"renamed": 4}
    assert not season(NameUnknownDims, done.model).result.modified


@pytest.mark.skipif(find_tensorrt().module is None, reason=find_tensorrt().reason)
def test_tensorrt_builds_only_after_renaming(season, tmp_path: Path) -> None:  # noqa: ANN001
    """With both spatial dims named '?', TensorRT requires 48 == 192 and fails."""
    profile = ShapeProfile({"x": ((1, 3, 48, 192),) * 3})
    backend = TensorRtBackend(profile)
    before, after = tmp_path / "before.onnx", tmp_path / "after.onnx"
    onnx.save(paddle_style(), before)
    onnx.save(season(NameUnknownDims, paddle_style()).model, after)
    with pytest.raises(BuildError, match="could not build the engine"):
        backend.build(before, backend.full_settings({}), tmp_path)
    engine = backend.build(after, backend.full_settings({}), tmp_path)
    assert engine.size_bytes > 0 and engine.settings[NS + "profile"] == str(profile)
