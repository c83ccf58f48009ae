"""The search strategy interface: ask for routes, tell what they scored.

Strategies do no I/O, no timing and no building: `routetune.search.loop` owns those
(Optuna's ask/tell split). A strategy sees only the route space and stored trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from routetune.composer import RouteSpace
from routetune.route import Route, parse_route
from routetune.trial import Trial


@dataclass(frozen=True)
class SearchConfig:
    """Settings shared by every strategy.

    Args:
        beam_width: Routes kept per depth by beam search (``--beam-width``).
        seed: For strategies that sample; the built-ins are deterministic.
    """

    beam_width: int = 3
    seed: int = 0


class Strategy:
    """Base class of search strategies.

    The loop measures the base route first and tells it to the strategy, then calls
    `ask` until it returns an empty list, telling every route it asked for.

    Args:
        space: The routes that may be tried.
        config: The search settings.
    """

    name: ClassVar[str]

    def __init__(self, space: RouteSpace, config: SearchConfig) -> None:
        self.space = space
        self.config = config

    def ask(self) -> list[Route]:
        """The next routes to try; an empty list when the search is done."""
        raise NotImplementedError

    def tell(self, route: Route, trial: Trial) -> None:
        """Report the trial of a route that `ask` returned (or of the base route)."""

    def planned(self) -> int | None:
        """How many routes this strategy expects to try in all, if known."""
        return None


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


def rank_key(trial: Trial) -> Rank:
    """Sort key of accurate trials: faster first, then fewer steps, then by text.

    Speed is the p50 relative to the base route measured alongside (`Trial.relative`:
    the inverse of the paired speed-up), never milliseconds of different moments.
    """
    relative = trial.relative
    return Rank(relative.p50 if relative else float("inf"),
                trial.latency.p50 if trial.latency else float("inf"),
                len(parse_route(trial.route)), trial.route)
