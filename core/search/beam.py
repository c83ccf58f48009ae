"""Beam search: grow routes one seasoning at a time, keeping the fastest accurate ones.

Depth 0 is the base route. At depth d every route of the beam is extended by one
seasoning (every parameter choice, every ordering that can matter); the ``beam_width``
fastest of the routes of depth d that are accurate, still in the race and shown faster
than the base route (`routetune.judging.ranking.shown_faster`: beyond their 95% interval)
on a measurement that may decide a winner (`routetune.search.strategy.Result.trusted`)
form the next beam. A route out of the race (`routetune.timing.race`: it cannot reach
``--min-speedup``, or the leader) or one the paired blocks cannot tell from the base
route is not built on: forward selection adds a step only when its test is significant.
The search ends at the depth limit, or when no route of a depth passes.

Within a depth, routes are asked in the order the route memory (`learn`) expects their
new step to pay: the expected log speed-up of the step times its chance to hold
(`routetune.records.prior.Prior.step`), then the chance to fail; a step it knows
nothing of counts as no effect; among equals, a quantizer's finest choices come first
(`routetune.search.coarser`). The order decides only which routes a time budget
reaches first: a beam that runs to its end measures the same routes with or without a
memory (but for those a finer quantization's failure rules out first), and no route
wins without being measured in this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from routetune.judging.ranking import rank_key, shown_faster
from routetune.options import option
from routetune.records.prior import Prior
from routetune.records.trial import Status
from routetune.routes.route import Route
from routetune.search.coarser import coarseness
from routetune.search.strategy import Result, Strategy


@dataclass(frozen=True)
class BeamOptions:
    """The beam search's options."""

    beam_width: int = option(3, help="Routes kept per depth (the fastest accurate ones).",
                             minimum=1)


class Beam(Strategy):
    """Grows routes one seasoning at a time from the fastest accurate ones shown faster."""

    name = "beam"
    Options = BeamOptions
    options: BeamOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._beam: list[Route] = [Route()]
        self._seen: set[Route] = {Route()}
        self._depth_results: list[tuple[Route, Result]] = []
        self._started = False
        self._prior = Prior()

    def learn(self, prior: Prior) -> None:
        """Take the memory's prior: it orders the routes of each depth (module docstring)."""
        self._prior = prior

    def _order(self, parent: Route, route: Route) -> tuple[float, float, int]:
        """Sort key of `route`, one step beyond `parent`: the memory's hopes first.

        Among steps the memory cannot tell apart, a quantizer's finest choices first
        (`routetune.search.coarser.coarseness`): should they fail the accuracy
        constraint, the coarser ones are not built.
        """
        had = {str(s) for s in parent}
        new = [s for s in route if str(s) not in had]
        if not new:
            return 0.0, 0.1, 0
        mean, _, fail, _ = self._prior.step(new[0])
        return -(1.0 - fail) * mean, fail, coarseness(new[0], self.space.infos[new[0].name].params)

    def ask(self) -> list[Route]:
        """The next depth's routes: every extension of the current beam not yet tried."""
        if self._started:
            accurate = [(r, t) for r, t in self._depth_results
                        if t.status == Status.OK and t.trusted and not t.out_of_race
                        and shown_faster(t)]
            accurate.sort(key=lambda rt: rank_key(rt[1]))
            self._beam = [r for r, _ in accurate[: self.options.beam_width]]
        self._started = True
        self._depth_results = []
        frontier: list[tuple[tuple[float, float, int], Route]] = []
        for route in self._beam:
            for ext in self.space.extensions(route):
                if ext not in self._seen:
                    self._seen.add(ext)
                    frontier.append((self._order(route, ext), ext))
        frontier.sort(key=lambda kr: kr[0])  # stable: the space's order among equals
        return [ext for _, ext in frontier]

    PLANNED_IS_BOUND = True

    def planned(self) -> int:
        """An upper bound: every depth grows ``beam_width`` routes by every one-step extension."""
        first = len(self.space.extensions(Route()))
        depths = max(self.space.max_depth - 1, 0)
        return min(first + depths * self.options.beam_width * first, self.space.size() - 1)

    def tell(self, route: Route, result: Result) -> None:
        """Record a result of the current depth."""
        if not route.is_base:
            self._depth_results.append((route, result))
