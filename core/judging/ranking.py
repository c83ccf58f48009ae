"""Ranking: which accurate trial is better, by its speed against the base route.

The order the verdict confirms routes in (`routetune.judging.verdict`), strategies keep
routes by (beam, mixed), and reports list them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from routetune.records.trial import Status, Trial
from routetune.routes.route import Route
from routetune.timing.measure import Latency


class Ranked(Protocol):
    """What a ranking reads: a stored `Trial`, or the result a strategy is told."""

    @property
    def latency(self) -> Latency | None:
        """The route's latency (ms); None when it was not measured."""

    @property
    def relative(self) -> Latency | None:
        """Its latency relative to the base route's, measured alongside (a ratio)."""

    @property
    def steps(self) -> Route:
        """The route."""


class Rank(NamedTuple):
    """How good an accurate trial is; smaller sorts first (`rank_key`).

    Args:
        relative: p50 over the base route's measured alongside (a ratio; inf without
            a base measurement).
        ms: p50 in ms, which decides only when no trial has a base measurement (the
            base route could not be built); inf when unmeasured.
        steps: The route's seasonings, parameters not counted
            (``fp16{op_types_to_exclude=[Softmax,Pow]}`` is one step).
        text: The route's text, so that the order is total.
    """

    relative: float
    ms: float
    steps: int
    text: str


def rank_key(trial: Ranked) -> Rank:
    """Sort key of accurate trials: faster first, then fewer steps, then by text.

    Speed is the p50 relative to the base route measured alongside (`Trial.relative`:
    the inverse of the paired speed-up), never milliseconds of different moments.
    """
    relative = trial.relative
    steps = trial.steps
    return Rank(relative.p50 if relative else float("inf"),
                trial.latency.p50 if trial.latency else float("inf"), len(steps), str(steps))


def shown_faster(trial: Ranked) -> bool:
    """Whether a route ran faster than the base route beyond noise.

    True when the upper end of the 95% interval of its latency relative to the base
    route measured alongside (`Trial.relative`, the inverse of the paired speed-up) is
    below 1: the paired blocks reject "no faster" at 2.5% one-sided. It is the screen a
    route passes before anything is built on it or spent on it: a beam or an ascent
    extends only such routes (forward selection, which adds a variable only when its
    test is significant: M. A. Efroymson, "Multiple regression analysis", in *Mathematical
    Methods for Digital Computers*, Wiley 1960), and only such routes are confirmed. A
    first positive is timed again (`routetune.candidate.pairing.replicated`) before it
    counts.
    """
    relative = trial.relative
    return relative is not None and relative.ci_high < 1.0


def ranked(trials: Sequence[Trial], winner: Trial | None = None) -> list[Trial]:
    """The trials as a reader wants them: the winner, the accurate by `rank_key`, the rest.

    The rest (failed, skipped) keep `rank_key`'s order too (measured ones by speed).
    """
    rest = sorted((t for t in trials if t is not winner),
                  key=lambda t: ((0 if t.status == Status.OK else 1), *rank_key(t)))
    return ([winner] if winner is not None else []) + rest
