"""The strict-FP16 check on small float16 graphs, run by real ONNX Runtime CPU sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import layernorm
from naive_fp16 import NaiveFp16
from onnx import TensorProto, helper
from quick import quick_spec

from routetune.judging.strict_fp16 import mentions_float16, strict_fp16_overflows
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.registry import Registry
from routetune.run.tuning import tune

BACKEND = OnnxRuntimeBackend()


def half_op(op: str, width: int, **attrs: object) -> onnx.ModelProto:
    """x f32[1,width] -> Cast(to_half) -> op (named 'op') -> Cast(to_float) -> y."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], name="to_half", to=TensorProto.FLOAT16),
        helper.make_node(op, ["h"], ["r"], name="op", **attrs),
        helper.make_node("Cast", ["r"], ["y"], name="to_float", to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, width])],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx >= 1.19 writes IR 11+, which older onnxruntime refuses
    return model


def check(model: onnx.ModelProto, x: np.ndarray) -> list[str]:
    found = strict_fp16_overflows(model, lambda m: BACKEND.evaluate(m, [{"x": x}]))
    assert set(found) <= {"op"}
    return list(found.values())


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceSumSquare"])
def test_reductions_that_overflow_only_in_a_float16_accumulator_are_caught(op: str) -> None:
    model = half_op(op, 4096)  # all axes
    # every value and the result fit float16; the running sums do not
    x = np.full((1, 4096), 4.0 if op == "ReduceSumSquare" else 300.0, np.float32)
    if op == "ReduceSum":
        x[:, 2048:] = -300.0  # the sum is 0; each half sums to 614400
    emulated = next(BACKEND.evaluate(model, [{"x": x}]))["y"]
    assert np.isfinite(emulated).all()  # the CPU provider accumulates in float32
    found = check(model, x)
    assert len(found) == 1 and found[0].startswith(f"{op} 'op': 1 of 1 values overflow")
    assert check(model, np.full((1, 4096), 0.01, np.float32)) == []


def test_an_exp_that_overflows_is_reported() -> None:
    found = check(half_op("Exp", 8), np.array([[12.0] + [0.0] * 7], np.float32))
    assert found == ["Exp 'op': 1 of 8 values overflow in float16 (up to 1.63e+05 in "
                     "float32 arithmetic)"]


def test_softmax_is_recomputed_stably() -> None:
    x = np.linspace(-20, 20, 64, dtype=np.float32)[None]
    assert check(half_op("Softmax", 64, axis=-1), x) == []


def test_only_models_with_float16_tensors_are_checked(tmp_path: Path) -> None:
    assert mentions_float16(half_op("Exp", 8))
    assert not mentions_float16(onnx.load(layernorm(tmp_path / "ln.onnx")))


def test_a_layernorm_whose_variance_overflows_in_float16_never_wins(
        registry: Registry, tmp_path: Path) -> None:
    # |x - mean| ~ 200: each square (4e4) fits float16, their sum over 2048 values does not
    model = layernorm(tmp_path / "ln.onnx", rows=4, width=2048)
    x = np.random.default_rng(0).uniform(-200, 200, (4, 2048)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    registry.add_seasoning(NaiveFp16)
    opts = quick_spec(model=model, output=tmp_path / "out", search="exhaustive",
                      seasonings=("fp16", "naive-fp16"), inputs=tmp_path / "x.npz",
                      accuracy="rel_l2<=0.01", max_depth=1)
    trials = {t.route: t for t in tune(opts, registry).trials}
    naive = trials["naive-fp16"]
    assert naive.status == "accuracy-failed"
    assert naive.accuracy["y"]["rel_l2"] < 0.01  # the CPU run alone would have passed it
    assert naive.reason.startswith("strict FP16 check")
    assert naive.reason.count("overflow in float16") == 1
    assert "ReduceMean 'var': 4 of 4 values overflow" in naive.reason
    assert trials["fp16"].status == "ok"  # its range analysis kept the variance in FP32
    assert trials["fp16"].reason.startswith("strict FP16 check: no overflow")
    assert "var: 'sq' reaches 4.071e+04 > data_max 512" in trials["fp16"].passes[0]["note"]
