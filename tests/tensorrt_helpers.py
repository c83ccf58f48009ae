"""TensorRT test helpers: the installed TensorRT, a small dynamic-batch model, settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from routetune.feeds.profile import ShapeProfile
from routetune.plugins.tensorrt.backend import NS, TensorRtBackend
from routetune.plugins.tensorrt.module import find_tensorrt

TRT = find_tensorrt()
needs_trt = pytest.mark.skipif(TRT.module is None, reason=f"tensorrt backend: {TRT.reason}")

PROFILE = ShapeProfile({"x": ((1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))})


def conv(path: Path, dims: list[int | str] | None = None) -> Path:
    """x f32[N,3,32,32] -> Conv 'conv0' (8 channels, 3x3, pad 1) -> Relu 'relu0' -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3],
                           np.random.default_rng(0).random(216).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu0")], "conv", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def settings(backend: TensorRtBackend, **changes: object) -> dict:
    return backend.full_settings({NS + k: v for k, v in changes.items()})
