"""The ``int32-limits`` seasoning: INT64 sentinels in Slice bounds become INT32 limits.

Exporters write "to the end" as ``ends = INT64_MAX`` (and "from the start" backwards as
``INT64_MIN``). TensorRT computes shapes in INT32 and its parser warns about, or
refuses, INT64 values it cannot cast. ONNX Slice clamps ``starts`` and ``ends`` to
``[0, dim]`` (Slice-13 spec), so any bound beyond the INT32 range slices the same as
the INT32 limit for every dimension shorter than 2**31: the rewrite is exact there.
Other INT64 constants outside the INT32 range are reported, not changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import constant_value
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

INT32 = np.iinfo(np.int32)
SLICE_BOUNDS = (1, 2)
"""Slice's ``starts`` and ``ends`` inputs (Slice-10 and later)."""


class Int32Limits(Seasoning):
    """Clamp Slice ``starts``/``ends`` constants to the INT32 range; report other INT64s.

    1. For every Slice (graph and subgraphs) whose ``starts`` or ``ends`` is an INT64
       constant with values outside [INT32_MIN, INT32_MAX], the input becomes a new
       initializer with those values clamped (a new one, so that other users of the old
       constant keep it).
    2. Every other INT64 constant with a value outside the INT32 range is counted and
       named in the note (``out_of_range``).
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="int32-limits", stage="graph", searched=False,
        backends=frozenset({"tensorrt"}),
        summary="TensorRT preflight: INT64 sentinels in Slice bounds become INT32 limits")

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """`supports`; the pass itself finds nothing to do on most graphs."""
        return self.supports(backend)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Clamp the Slice bounds of `state.graph` in place."""
        graph = state.model_graph()
        clamped = 0
        seen: set[str] = set()
        for sub in (graph, *graph.subgraphs(recursive=True)):
            for node in sub.nodes:
                if node.op != "Slice":
                    continue
                for i in SLICE_BOUNDS:
                    if i >= len(node.inputs):
                        continue
                    value = constant_value(node.inputs[i])
                    if value is None or value.dtype != np.int64 or not _out_of_range(value):
                        continue
                    seen.add(node.inputs[i].name)
                    node.inputs[i] = gs.Constant(f"{node.inputs[i].name}_int32_limits_{node.name}",
                                                 np.clip(value, INT32.min, INT32.max))
                    clamped += 1
        others = sorted(
            name for sub in (graph, *graph.subgraphs(recursive=True))
            for name, t in sub.tensors().items()
            if name not in seen and t.outputs and (v := constant_value(t)) is not None
            and v.dtype == np.int64 and _out_of_range(v))
        note = (f"INT64 constants outside the INT32 range left as they are: "
                f"{', '.join(others[:5])}" if others else "")
        return PassResult(modified=bool(clamped),
                          stats={"clamped": clamped, "out_of_range": len(others)}, note=note)


def _out_of_range(value: np.ndarray) -> bool:
    return bool(value.size) and (value.max() > INT32.max or value.min() < INT32.min)
