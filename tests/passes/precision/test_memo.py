"""Per-process memos of the FP32 analyses (ranges, rankings): computed once per model and inputs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from graphs import conv_bn

from routetune.passes.precision.memo import ProcessMemo
from routetune.passes.precision.ranges import tensor_ranges
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.seasoning import RouteContext

BACKEND = OnnxRuntimeBackend()


def counting_ctx(feeds: list[dict[str, np.ndarray]], runs: list[int]) -> RouteContext:
    """A context whose FP32 runtime (the real one) counts the models it is given."""
    def evaluate(model: onnx.ModelProto) -> Iterable[dict[str, Any]]:
        runs.append(len(model.graph.output))
        return BACKEND.evaluate(model, feeds)
    return RouteContext(BACKEND, tuple(feeds), "base", evaluate)


def test_the_ranges_of_one_graph_and_inputs_are_measured_once(tmp_path: Path) -> None:
    model = onnx.load(conv_bn(tmp_path / "m.onnx", batch=1))
    rng = np.random.default_rng(20261206)  # inputs no other test gives this process
    feeds = [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}]
    runs: list[int] = []
    first = tensor_ranges(gs.import_onnx(model), counting_ctx(feeds, runs))
    again = tensor_ranges(gs.import_onnx(model), counting_ctx(feeds, runs))
    assert len(runs) == 1 and runs[0] > 1  # one run, with the intermediates as outputs
    assert again == first and first.amax["y"] > 0
    bigger = [{"x": 10 * feeds[0]["x"]}]  # other inputs: other ranges, measured afresh
    other = tensor_ranges(gs.import_onnx(model), counting_ctx(bigger, runs))
    assert len(runs) == 2 and other.amax["x"] == pytest.approx(10 * first.amax["x"])


def test_a_memo_keeps_its_last_results_and_computes_the_others_again(tmp_path: Path) -> None:
    model = onnx.load(conv_bn(tmp_path / "m.onnx", batch=1))
    memo: ProcessMemo[int] = ProcessMemo(2)
    calls: list[int] = []

    def compute(i: int) -> int:
        calls.append(i)
        return i

    contexts = [RouteContext(BACKEND, ({"x": np.full((1,), i, np.float32)},))
                for i in range(3)]
    for i, ctx in enumerate(contexts):
        assert memo.get([model], ctx, lambda i=i: compute(i)) == i
    assert memo.get([model], contexts[2], lambda: compute(9)) == 2  # kept
    assert memo.get([model], contexts[0], lambda: compute(0)) == 0  # dropped: again
    assert memo.get([model], contexts[2], lambda: compute(9), b"ov") == 9  # extra keys too
    assert calls == [0, 1, 2, 0, 9]
