"""``precision-repair``: keep the nodes that lose the most precision in FP32.

When a low-precision route fails the accuracy constraint, the search loop adds this
seasoning after the route's precision step and bisects ``count``: 1, 2, 4, … until the
route passes, then halves the gap back down (`routetune.passes.precision.bisection`). Each step is
a measured trial, so a route that keeps a few nodes in FP32 competes on speed with
everything else. The references are Polygraphy's ``debug precision`` (bisection over
layers kept in higher precision) and NNCF's accuracy control (ranking by each node's
contribution to the error, reverting the worst first); this one ranks once, by
`rank_nodes`, and redoes the conversion with the top ``count`` nodes excluded.
"""

from __future__ import annotations

import math

import onnx
import onnx_graphsurgeon as gs

from routetune.errors import one_line
from routetune.judging.strict_fp16 import mentions_float16, strict_fp16_overflows
from routetune.passes.graph.constants import copy_graph, replace_graph
from routetune.passes.precision.bisection import RepairRefinement
from routetune.passes.precision.lowering import LOWERED
from routetune.passes.precision.memo import ProcessMemo
from routetune.passes.precision.sensitivity import Sensitivity, rank_nodes
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

REPAIRED = frozenset({"fp16", "bf16", "int8-qdq", "fp8-qdq", "int4-weights",
                      "int8-weights"})
"""The built-in precision seasonings that record a `Lowering` this one can redo."""


class PrecisionRepair(Seasoning):
    """Redo the route's precision step with the ``count`` most sensitive nodes in FP32.

    The ranking compares the FP32 graph the precision step converted with its result on
    ``ctx.feeds``, node by node (`rank_nodes`). Where the backend emulates float16
    (`Backend.emulates`), the nodes the strict-FP16 check finds overflowing rank first.
    The precision step runs again with its own parameters and ``nodes_to_exclude``
    extended by the chosen nodes. The pass note names each kept node and why.

    Raises:
        ValueError: No precision step ran before it, ``count`` is below 1, or there is
            no reference runtime to rank with.
    """

    info = SeasoningInfo(
        name="precision-repair", stage="precision",
        summary="keep the nodes that add the most low-precision error in FP32; added by "
                "the search after an accuracy failure, which bisects count",
        params=(Param("count", (1,), 1, "how many of the most sensitive nodes stay FP32"),),
        after=REPAIRED, searched=False,
    )
    refinement = RepairRefinement

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Rank, pick the top ``count`` nodes, and redo the precision step without them."""
        count = int(self.params["count"])
        lowered = state.stash.get(LOWERED)
        if lowered is None:
            raise ValueError("precision-repair must follow a precision seasoning "
                             f"({', '.join(sorted(REPAIRED))}); put it right after one")
        if count < 1:
            raise ValueError(f"precision-repair count={count}: must be 1 or more")
        if ctx.evaluate is None:
            raise ValueError("precision-repair ranks nodes on the FP32 reference runtime; "
                             "none is available")
        fp32 = gs.export_onnx(copy_graph(lowered.graph), do_type_check=False)
        low = gs.export_onnx(copy_graph(state.graph), do_type_check=False)
        overflows = _overflows(fp32, low, state, ctx)
        first = {s.node for s in overflows}
        ranked, where = _rank(fp32, low, ctx)
        ranking = overflows + [s for s in ranked if s.node not in first]
        previous = lowered.seasoning
        if "op_types" in previous.params:  # Q/DQ: excluding an op it does not quantize is a no-op
            ranking = [s for s in ranking if s.op in previous.params["op_types"]]
        chosen = ranking[:count]
        excluded = set(previous.params["nodes_to_exclude"]) | {s.node for s in chosen}
        redo = type(previous)({**previous.params, "nodes_to_exclude": tuple(sorted(excluded))})
        again = RouteState(copy_graph(lowered.graph), state.settings)
        result = redo(again, ctx)
        replace_graph(state.graph, again.graph)
        if LOWERED in again.stash:  # none when the redo converted nothing: keep the first
            state.stash[LOWERED] = again.stash[LOWERED]
        kept = ", ".join(map(str, chosen))
        note = (f"kept in FP32: {kept or 'none'}; {len(ranking)} converted nodes "
                f"ranked{where}; "
                f"{previous.info.name}: {result.note}")
        stats = {"ranked": len(ranking), "kept_fp32": len(chosen),
                 "ranked_on_device": int(bool(where)), **result.stats}
        return PassResult(bool(chosen), stats, note)


_rankings: ProcessMemo[tuple[list[Sensitivity], str]] = ProcessMemo(4)
"""Rankings a worker process keeps (`_rank`): each rung of one repair ranks the same pair of
models, so only the first pays for the two runs with every tensor as an output."""


def _rank(fp32: onnx.ModelProto, low: onnx.ModelProto, ctx: RouteContext
          ) -> tuple[list[Sensitivity], str]:
    """The ranking of this pair of models, once per worker process (`_rankings`).

    Keyed by the two models' bytes, the validation inputs' and the backend's name (the
    device a model may run on when the reference cannot).
    """
    return _rankings.get([fp32, low], ctx, lambda: _ranked(fp32, low, ctx),
                         ctx.backend.name.encode())


def _ranked(fp32: onnx.ModelProto, low: onnx.ModelProto, ctx: RouteContext
            ) -> tuple[list[Sensitivity], str]:
    """`rank_nodes` with the converted model on the reference, else on the device.

    The reference (ONNX Runtime's CPU provider) has no bfloat16 kernels for most
    operators: where it cannot run `low`, `low` runs on the measured device
    (`RouteContext.run_on_device`), against the FP32 model on the reference.

    Returns:
        The ranking, and ``""`` when it ran on the reference, else a note that says
        where and why.

    Raises:
        Exception: What the reference raised, where there is no device to run on; else
            what the device raised.
    """
    assert ctx.evaluate is not None
    try:
        return rank_nodes(fp32, low, ctx.evaluate), ""
    except Exception as e:  # noqa: BLE001 - the reference's own error types
        if ctx.run_on_device is None:
            raise
        why = one_line(e, 160)
    ranked = rank_nodes(fp32, low, ctx.evaluate, evaluate_low=ctx.run_on_device)
    return ranked, f" on the device (the reference cannot run it: {why})"


def _overflows(fp32: onnx.ModelProto, low: onnx.ModelProto, state: RouteState,
               ctx: RouteContext) -> list[Sensitivity]:
    """Nodes the strict-FP16 check finds overflowing, where the device emulates float16.

    On such a device the low run matches FP32 and the error ranking sees nothing; the
    nodes that would overflow on a float16 device rank first instead.
    """
    if ctx.evaluate is None or not ctx.backend.emulates("float16", state.settings):
        return []
    if not mentions_float16(low):
        return []
    ops = {n.name: n.op_type for n in fp32.graph.node}
    found = strict_fp16_overflows(low, ctx.evaluate, limit=len(low.graph.node))
    return [Sensitivity(name, ops[name], math.inf, math.inf, line)
            for name, line in found.items() if name in ops]
