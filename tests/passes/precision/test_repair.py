"""precision-repair and its sensitivity ranking, on real ONNX Runtime runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from graphs import layernorm, matmul_chain
from naive_fp16 import NaiveFp16

from routetune.judging.strict_fp16 import strict_fp16_overflows
from routetune.passes.precision.repair import PrecisionRepair
from routetune.passes.precision.sensitivity import rank_nodes
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.onnxruntime.quantize import Int8Qdq
from routetune.seasoning import RouteContext, RouteState

BACKEND = OnnxRuntimeBackend()


@pytest.fixture
def chain(tmp_path: Path) -> tuple[onnx.ModelProto, RouteContext]:
    model = onnx.load(matmul_chain(tmp_path / "chain.onnx", depth=4, width=64, batch=8))
    feeds = [{"x": np.random.default_rng(i).standard_normal((8, 64)).astype(np.float32)}
             for i in range(2)]
    return model, RouteContext(BACKEND, tuple(feeds), "base",
                               lambda m: BACKEND.evaluate(m, feeds))


def test_int8_nodes_are_ranked_by_the_error_they_add(chain) -> None:  # noqa: ANN001
    model, ctx = chain
    state = RouteState(gs.import_onnx(model))
    Int8Qdq()(state, ctx)
    ranking = rank_nodes(model, gs.export_onnx(state.graph), ctx.evaluate)
    names = [s.node for s in ranking]
    assert {n for n in names if n.startswith("matmul")} == {f"matmul{i}" for i in range(4)}
    assert [s.added for s in ranking] == sorted((s.added for s in ranking), reverse=True)
    assert ranking[0].added > 0
    assert all(s.output >= s.added for s in ranking)


def test_the_converted_model_may_run_on_the_device_and_ranks_the_same(chain) -> None:  # noqa: ANN001
    # where the reference has no kernels for the low type (bfloat16 on the CPU provider),
    # the low model runs on the measured device; on the CPU backend that device is the
    # CPU, so the ranking must come out as the reference's
    model, ctx = chain
    state = RouteState(gs.import_onnx(model))
    Int8Qdq()(state, ctx)
    low = gs.export_onnx(state.graph)
    on_device = rank_nodes(model, low, ctx.evaluate,
                           evaluate_low=lambda m: BACKEND.run_on_device(m, list(ctx.feeds)))
    assert on_device == rank_nodes(model, low, ctx.evaluate) and len(on_device) >= 4


def test_repair_redoes_the_quantization_without_the_top_nodes(chain) -> None:  # noqa: ANN001
    model, ctx = chain
    state = RouteState(gs.import_onnx(model))
    Int8Qdq()(state, ctx)
    result = PrecisionRepair({"count": 2})(state, ctx)
    assert result.modified and result.stats["kept_fp32"] == 2
    assert result.stats["ranked_on_device"] == 0  # the reference ran the Q/DQ model
    kept = [part.split(" (")[0] for part in
            result.note.split(";")[0].removeprefix("kept in FP32: ").split("), ")]
    assert len(kept) == 2 and all(k.startswith("matmul") for k in kept)
    out = gs.export_onnx(state.graph)
    onnx.checker.check_model(out, full_check=True)
    dequantized = {o for n in out.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    dq_fed = {n.name for n in out.graph.node if n.op_type == "MatMul"
              and any(i in dequantized for i in n.input)}
    assert dq_fed == {f"matmul{i}" for i in range(4)} - set(kept)  # kept ones read FP32
    assert result.stats["quantized_nodes"] == 2


def test_keeping_every_ranked_node_undoes_the_quantization(chain) -> None:  # noqa: ANN001
    model, ctx = chain
    state = RouteState(gs.import_onnx(model))
    Int8Qdq()(state, ctx)
    result = PrecisionRepair({"count": 100})(state, ctx)
    assert result.stats["kept_fp32"] == result.stats["ranked"] == 4  # the four MatMuls
    out = gs.export_onnx(state.graph)
    assert not [n for n in out.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]


def test_where_the_device_emulates_fp16_strict_overflows_rank_first(tmp_path: Path) -> None:
    # |x - mean| ~ 200 over 2048 values: the variance's float16 sum overflows, while the
    # CPU provider computes it in float32 and shows nothing wrong
    model = onnx.load(layernorm(tmp_path / "ln.onnx", rows=4, width=2048))
    feeds = [{"x": np.random.default_rng(0).uniform(-200, 200, (4, 2048)).astype(np.float32)}]
    ctx = RouteContext(BACKEND, tuple(feeds), "base", lambda m: BACKEND.evaluate(m, feeds))
    state = RouteState(gs.import_onnx(model))
    NaiveFp16()(state, ctx)
    assert list(strict_fp16_overflows(gs.export_onnx(state.graph), ctx.evaluate)) == ["var"]
    result = PrecisionRepair()(state, ctx)  # count=1
    assert result.note.startswith(
        "kept in FP32: var (ReduceMean 'var': 4 of 4 values overflow in float16")
    repaired = gs.export_onnx(state.graph)
    onnx.checker.check_model(repaired, full_check=True)
    assert strict_fp16_overflows(repaired, ctx.evaluate) == {}


def test_repair_without_a_precision_step_is_a_clear_error(chain) -> None:  # noqa: ANN001
    model, ctx = chain
    with pytest.raises(ValueError, match="must follow a precision seasoning"):
        PrecisionRepair()(RouteState(gs.import_onnx(model)), ctx)
