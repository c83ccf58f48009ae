"""Precision repair in the search: after an accuracy failure, find how few nodes must stay FP32.

A route whose precision step (``fp16``, ``int8-qdq`` …) fails the accuracy constraint
gets ``precision-repair{count=k}`` inserted right after that step, for k = 1, 2, 4, …
until a route passes (or every ranked node is kept), then k is bisected between the
largest failing and the smallest passing count. That is O(2 log n) trials for n ranked
nodes, each one built, checked, measured and stored like any other, so the winner may
be a repaired route that keeps a few nodes in FP32. Accuracy is assumed to improve as
more nodes stay FP32 (the premise of Polygraphy's ``debug precision`` bisection).
"""

from __future__ import annotations

from collections.abc import Callable

from routetune.registry import Registry
from routetune.route import Route, Step
from routetune.store import Trial

REPAIR = "precision-repair"
"""The seasoning the loop inserts (`routetune.passes.precision.repair`)."""


def repair_point(route: Route, registry: Registry) -> int | None:
    """Where ``precision-repair`` goes in `route`: after its last precision step.

    Returns:
        The index to insert at, or None when the route has no precision step or holds
        a repair already. (A precision seasoning that records no `Lowering` makes the
        repair step fail, and that failure is recorded like any other.)
    """
    if REPAIR not in registry.seasonings or REPAIR in route.names:
        return None
    found = [i for i, step in enumerate(route)
             if registry.seasoning(step.name).info.stage == "precision"]
    return found[-1] + 1 if found else None


def bisect_repair(route: Route, at: int, visit: Callable[[Route], Trial | None]) -> list[Trial]:
    """Try repaired variants of a failing `route` until the smallest passing count is known.

    Args:
        route: A route that failed the accuracy constraint.
        at: Where to insert the repair step (`repair_point`).
        visit: Evaluates a route and returns its trial; None when a budget stops the search.

    Returns:
        The trials of the repaired routes, in the order they ran.
    """
    steps = list(route)
    trials: list[Trial] = []
    failing, passing, count = 0, None, 1
    while True:
        step = Step(REPAIR) if count == 1 else Step.of(REPAIR, {"count": count})
        trial = visit(Route(tuple(steps[:at] + [step] + steps[at:])))
        if trial is None:
            return trials
        trials.append(trial)
        ranked = _ranked(trial)
        if trial.status == "ok":
            passing = count
        elif trial.status == "accuracy-failed" and ranked:
            failing = count
        else:  # the repair itself failed, or nothing is left to keep in FP32
            return trials
        if passing is None:
            if count >= ranked:
                return trials
            count = min(2 * count, ranked)
        elif passing - failing <= 1:
            return trials
        else:
            count = (failing + passing) // 2


def _ranked(trial: Trial) -> int:
    """How many nodes the repair step ranked, from the trial's pass record."""
    for record in trial.passes:
        if str(record.get("step", "")).startswith(REPAIR):
            return int(record.get("stats", {}).get("ranked", 0))
    return 0
