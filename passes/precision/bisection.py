"""Precision repair in the search: after an accuracy failure, find how few nodes must stay FP32.

``precision-repair``'s refinement (`RepairRefinement`, `routetune.refinement`):
the search loop calls it after each batch when the seasoning is offered.

After each batch of routes a strategy asks for, the loop picks, for each precision
seasoning (``fp16``, ``int8-qdq`` …) not repaired yet, the fastest of the batch's routes
whose precision step failed the accuracy constraint (speed relative to the base route,
as measured alongside it): the route worth the most if repaired. A route no faster than
the base route, or out of the race (`routetune.timing.race`: it cannot reach
``--min-speedup`` or the leader), is not repaired, and the doubling stops at a failing
count whose route is no faster or out of the race: more FP32 nodes only slow a route
down. The route gets
``precision-repair{count=k}`` inserted right after that step: k = 1 first, then the
most nodes it may keep (all ranked nodes up to `SMALL`, else half of them): if that
still fails, no smaller k can pass, and the repair stops after two trials. Otherwise
k gallops up from the largest failing count (2, 4, 8, …) and is bisected below the
smallest passing one (exponential search: J. L. Bentley and A. C. Yao, "An almost
optimal algorithm for unbounded searching", Information Processing Letters 5, 1976):
O(2 log n) trials for n ranked nodes, each built, checked, measured and stored like
any other, so the winner may be a repaired route that keeps a few nodes in FP32. The
galloping and the bisection stop at a failing count that is no faster than the bar or
out of the race: every count left between it and the passing one keeps more nodes in
FP32, so none can be faster.
Accuracy is assumed to improve as more nodes stay FP32 (the premise of Polygraphy's
``debug precision`` bisection).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from routetune.judging.ranking import rank_key
from routetune.records.trial import Status, Trial
from routetune.refinement import Refinement, Skip, Visit
from routetune.registry import Registry
from routetune.routes.route import Route, Step
from routetune.seasoning import SeasoningInfo
from routetune.timing.race import Bar

REPAIR = "precision-repair"
"""The seasoning the refinement inserts (`routetune.passes.precision.repair`)."""

SMALL = 8
"""Up to this many ranked nodes the repair may keep all of them in FP32; above it, at
most half: a route with most of its nodes back in FP32 is the FP32 model again, slower
for its Casts (PP-OCRv4 det needed 293 of 308 FP16 nodes back, and ran at 0.85x)."""


EVEN = Bar(1.0, "the base route's speed")
"""The bar without a search around it: a repaired route must be able to beat the base."""


def repair_point(route: Route, registry: Registry) -> int | None:
    """Where ``precision-repair`` goes in `route`: right after its precision step.

    Returns:
        The index to insert at, or None when the route has no precision step, more than
        one (``int8-qdq,fp16``: the repair could redo only the last, while the error may
        come from the first), or a repair already. (A precision seasoning that records
        no `Lowering` makes the repair step fail, and that is recorded like any other.)
    """
    if REPAIR not in registry.seasonings or REPAIR in route.names:
        return None
    found = [i for i, step in enumerate(route)
             if registry.seasoning(step.name).info.stage == "precision"]
    return found[0] + 1 if len(found) == 1 else None


def repairs(done: Sequence[tuple[Route, Trial]], registry: Registry, repaired: set[str],
            bar: Bar = EVEN) -> list[tuple[Route, int, str | None]]:
    """The failing routes to repair after a batch: the fastest per precision seasoning.

    Args:
        done: The batch's routes and trials.
        registry: The installed seasonings.
        repaired: Names of precision seasonings repaired already; they are left out.
        bar: The speed-up a route must be able to reach to win (the search's racing bar,
            `routetune.search.leader.Leader.bar`): a failing route whose interval lies
            below it is not repaired.

    Returns:
        ``(route, insertion point, why not)`` by seasoning name: ``why not`` is None for
        a route to repair, or the reason a failing route is not worth repairing (it
        cannot reach `bar`).
    """
    fastest: dict[str, tuple[Route, Trial, int]] = {}
    for route, trial in done:
        at = repair_point(route, registry)
        if (trial.status != Status.ACCURACY_FAILED or at is None
                or route.steps[at - 1].name in repaired):
            continue
        name = route.steps[at - 1].name
        if name not in fastest or rank_key(trial) < rank_key(fastest[name][1]):
            fastest[name] = (route, trial, at)
    out = []
    for name in sorted(fastest):
        route, trial, at = fastest[name]
        why = None if reaches(trial, bar) and trial.raced is None else (
            f"not repaired: '{route}', the fastest route of {name} that failed accuracy, "
            + (_short_of(trial, bar) if trial.raced is None else
               f"is out of the race ({trial.speedup:.2f}x, below {trial.raced:.3g}x)")
            + "; keeping nodes in FP32 would only slow it down")
        out.append((route, at, why))
    return out


def repair_route(route: Route, at: int, count: int) -> Route:
    """`route` with ``precision-repair{count=count}`` inserted at `at` (canonical text)."""
    step = Step(REPAIR) if count == 1 else Step.of(REPAIR, {"count": count})
    return Route(tuple(route.steps[:at] + (step,) + route.steps[at:]))


def bisect_repair(route: Route, at: int, visit: Callable[[Route], Trial | None],
                  skip: Callable[[Route, str], object] = lambda route, why: None,
                  bar: Bar = EVEN) -> list[Trial]:
    """Try repaired variants of a failing `route` until the smallest passing count is known.

    Args:
        route: A route that failed the accuracy constraint.
        at: Where to insert the repair step (`repair_point`).
        visit: Evaluates a route and returns its trial; None when a budget stops the search.
        skip: Records the next count's route as not tried, with the reason, when the
            doubling stops before a route passes.
        bar: The speed-up a route must be able to reach to win (`repairs`): the doubling
            stops at a failing count whose interval lies below it, since more FP32
            nodes only slow the route down.

    Returns:
        The trials of the repaired routes, in the order they ran.
    """
    trials: list[Trial] = []
    failing, passing, count = 0, None, 1
    probed = False  # whether the most nodes it may keep has been tried
    while True:
        trial = visit(repair_route(route, at, count))
        if trial is None:
            return trials
        trials.append(trial)
        ranked = _ranked(trial)
        if trial.status == Status.OK:
            passing = count
        elif trial.status == Status.ACCURACY_FAILED and ranked:
            failing = count
        else:  # the repair itself failed, or nothing is left to keep in FP32
            return trials
        limit = ranked if ranked <= SMALL else ranked // 2
        if passing is None:
            if (count >= limit or not reaches(trial, bar)  # more FP32 nodes: slower
                    or trial.raced is not None):
                if count < ranked:
                    skip(repair_route(route, at, min(2 * count, ranked)), (
                        f"repair stopped: with {count} of {ranked} nodes in FP32 it "
                        + _short_of(trial, bar)
                        if not reaches(trial, bar) else
                        f"repair stopped: with {count} of {ranked} nodes in FP32 it is out "
                        f"of the race ({trial.speedup:.2f}x, below {trial.raced:.3g}x)"
                        if trial.raced is not None else
                        f"repair stopped: {count} of {ranked} nodes in FP32 still fail, so "
                        "no fewer can pass" + ("" if limit == ranked else "; keeping more "
                                               "than half of them is the FP32 model again")))
                return trials
            if not probed and 2 * count < limit:  # the most it may keep, right away
                probed, count = True, limit
            else:
                count = min(2 * count, limit)
        elif passing - failing <= 1:
            return trials
        elif failing == count and (not reaches(trial, bar) or trial.raced is not None):
            # every count left keeps more nodes in FP32 than this failing one: no faster
            skip(repair_route(route, at, min(2 * failing, (failing + passing) // 2)), (
                f"repair stopped: with {count} of {ranked} nodes in FP32 it "
                + (_short_of(trial, bar) if trial.raced is None else
                   f"is out of the race ({trial.speedup:.2f}x, below {trial.raced:.3g}x)")
                + f", and every count up to {passing} (which passes) keeps more in FP32"))
            return trials
        else:  # gallop up from the largest failing count, bisect below the passing one
            count = min(2 * failing, (failing + passing) // 2)


def reaches(trial: Trial, bar: Bar = EVEN) -> bool:
    """Whether the trial's speed-up over the base route may reach `bar`.

    False when the 95% interval of its speed-up (measured alongside the base route) lies
    below ``bar.speedup``: keeping more nodes in FP32 would not make it faster, so a
    repair of it cannot win. True when it was not measured against the base route.
    """
    relative = trial.relative
    return (relative is None or trial.base_latency is None
            or relative.ci_low * bar.speedup <= 1.0)


def _short_of(trial: Trial, bar: Bar) -> str:
    """Why `trial` cannot reach `bar`, for a note: "is no faster than …" or "cannot reach …"."""
    relative = trial.relative
    top = "" if relative is None else f", at best {1.0 / relative.ci_low:.2f}x"
    if bar.speedup <= 1.0:
        return f"is no faster than the base route ({trial.speedup:.2f}x{top})"
    return f"cannot reach {bar.speedup:.3g}x, {bar.source} ({trial.speedup:.2f}x{top})"


def _ranked(trial: Trial) -> int:
    """How many nodes the repair step ranked, from the trial's pass record."""
    for record in trial.passes:
        if str(record.get("step", "")).startswith(REPAIR):
            return int(record.get("stats", {}).get("ranked", 0))
    return 0


class RepairRefinement(Refinement):
    """After each batch, repair its fastest accuracy failure per precision seasoning.

    Each precision seasoning is repaired once per run (`repairs`, then `bisect_repair`).
    """

    def __init__(self, registry: Registry) -> None:
        super().__init__(registry)
        self.repaired: set[str] = set()  # precision seasonings repaired already

    @classmethod
    def why_idle(cls, offered: Sequence[SeasoningInfo]) -> str | None:
        """None when a precision seasoning is searched; else the fix."""
        if any(i.stage == "precision" and i.searched for i in offered):
            return None
        return (f"{REPAIR} repairs the failures of a precision seasoning; add fp16, bf16, "
                "int8-qdq or fp8-qdq")

    def after_batch(self, done: Sequence[tuple[Route, Trial]], visit: Visit,
                    skip: Skip, bar: Bar = EVEN) -> None:
        """Repair the batch's fastest accuracy failure of each precision seasoning.

        Only a failing route whose interval reaches `bar` (the search's racing bar) is
        repaired, and the doubling stops below it (`repairs`, `bisect_repair`).
        """
        for route, at, why_not in repairs(done, self.registry, self.repaired, bar):
            if why_not:
                skip(repair_route(route, at, 1), why_not)
                continue
            self.repaired.add(route.steps[at - 1].name)
            bisect_repair(route, at, visit, skip, bar)
