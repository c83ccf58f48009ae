"""Costly FP32 analyses, kept per worker process and keyed by what they read.

A precision repair converts the same model again at every rung (count 1, 2, 4, …), and
FP16 and BF16 routes of one model start from the same FP32 graph. Each conversion reads
the same activation ranges (`routetune.passes.precision.ranges.tensor_ranges`), and each
rung the same node ranking (`routetune.passes.precision.sensitivity.rank_nodes`): runs of
the whole model with every tensor as an output, on every validation input set. A
`ProcessMemo` keeps the last few such results in the build worker, keyed by the models'
bytes and the validation inputs, so only the first caller pays for the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np
import onnx

from routetune.model.loading import sha256
from routetune.seasoning import RouteContext

T = TypeVar("T")


class ProcessMemo(Generic[T]):
    """The last `size` results of one analysis, by the models and inputs it read.

    Args:
        size: Results kept; the oldest is dropped first.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: dict[str, T] = {}

    def get(self, models: Sequence[onnx.ModelProto], ctx: RouteContext,
            compute: Callable[[], T], extra: bytes = b"") -> T:
        """The result for `models` on ``ctx.feeds`` (and `extra`), computed once.

        Args:
            models: The models the analysis runs, whose serialized bytes key it.
            ctx: Its validation inputs (``ctx.feeds``) key it too.
            compute: Runs the analysis, when it is not kept.
            extra: Anything else the result depends on (a backend's name).
        """
        parts = [m.SerializeToString() for m in models] + [extra]
        parts += [np.ascontiguousarray(v).tobytes() for feed in ctx.feeds for v in feed.values()]
        key = sha256(b"\0".join(parts))
        if key not in self._kept:
            while len(self._kept) >= self.size:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = compute()
        return self._kept[key]
