"""``int32-limits``: Slice's INT64 sentinels become INT32 limits, exactly."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from routetune.passes.graph.int32_limits import Int32Limits

I64 = np.iinfo(np.int64)


def sliced() -> onnx.ModelProto:
    """x f32[4,6] -> Slice 'tail' [1:INT64_MAX] on axis 1 -> Slice 'back' [INT64_MAX:INT64_MIN:-1]
    on axis 0 -> y; and an unrelated INT64 constant 'huge' (2**40) added to a Shape."""
    inits = [
        helper.make_tensor("starts", TensorProto.INT64, [1], [1]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [int(I64.max)]),
        helper.make_tensor("axes1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("rstarts", TensorProto.INT64, [1], [int(I64.max)]),
        helper.make_tensor("rends", TensorProto.INT64, [1], [int(I64.min)]),
        helper.make_tensor("axes0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("steps", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("huge", TensorProto.INT64, [2], [2**40, 2**40]),
    ]
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes1"], ["t"], name="tail"),
        helper.make_node("Slice", ["t", "rstarts", "rends", "axes0", "steps"], ["y"],
                         name="back"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Add", ["s", "huge"], ["z"], name="plus_huge"),
    ]
    graph = helper.make_graph(
        nodes, "sliced", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5]),
         helper.make_tensor_value_info("z", TensorProto.INT64, [2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_sentinels_are_clamped_and_other_int64s_reported(season, assert_equivalent,  # noqa: ANN001
                                                         random_feeds) -> None:  # noqa: ANN001
    model = sliced()
    done = season(Int32Limits, model)
    assert dict(done.result.stats) == {"clamped": 3, "out_of_range": 1}
    assert done.result.note == "INT64 constants outside the INT32 range left as they are: huge"
    values = {i.name: onnx.numpy_helper.to_array(i) for i in done.model.graph.initializer}
    clamped = [v for k, v in values.items() if "int32_limits" in k]
    assert sorted(int(v[0]) for v in clamped) == [-(2**31), 2**31 - 1, 2**31 - 1]
    assert_equivalent(model, done.model, random_feeds(model))


def test_nothing_to_clamp_is_a_noop(season) -> None:  # noqa: ANN001
    model = sliced()
    for init in model.graph.initializer:
        if init.name in ("ends", "rstarts", "rends", "huge"):
            value = {"ends": 6, "rstarts": 3, "rends": -5, "huge": 1}[init.name]
            init.CopyFrom(helper.make_tensor(init.name, TensorProto.INT64, list(init.dims),
                                             [value] * init.dims[0]))
    done = season(Int32Limits, model)
    assert not done.result.modified
    assert dict(done.result.stats) == {"clamped": 0, "out_of_range": 0}
