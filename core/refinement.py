"""Refinements: routes a seasoning adds to a search after each batch the strategy ran.

A strategy proposes routes; a refinement follows up on what a batch found, such as
``precision-repair`` re-running the fastest route that failed the accuracy constraint
with a few nodes kept in FP32 (`routetune.passes.precision.bisection`). A seasoning
class names its refinement (`routetune.seasoning.Seasoning.refinement`); the search
loop makes one per run when that seasoning is offered, and calls `after_batch` after
every batch, in the batch's order. Its trials are built, measured and stored like any
other, and compete for the win, but are not told to the strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from routetune.records.trial import Trial
from routetune.routes.route import Route
from routetune.timing.race import Bar

if TYPE_CHECKING:
    from routetune.registry import Registry
    from routetune.seasoning import SeasoningInfo

Visit = Callable[[Route], "Trial | None"]
"""Runs (or reads from the store) one route's trial; None when a budget stopped the
search, after which the refinement must return."""

Skip = Callable[[Route, str], object]
"""Records a route as not tried, with the reason (a ``skipped`` trial)."""


class Refinement:
    """Follow-up routes after each batch of a search (subclass it; one per run).

    Args:
        registry: The installed plugins.
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    @classmethod
    def why_idle(cls, offered: Sequence[SeasoningInfo]) -> str | None:
        """Why this refinement can do nothing with the seasonings offered; None if it can.

        The reason names the fix; ``--seasonings`` then fails in one line.
        """
        return None

    def after_batch(self, done: Sequence[tuple[Route, Trial]], visit: Visit,
                    skip: Skip, bar: Bar) -> None:
        """Follow up on a batch's routes and trials, in the batch's order.

        `bar` is the speed-up a route must be able to reach to win now (the search's
        racing bar: ``--min-speedup``, or the leading route's lower end).
        """
