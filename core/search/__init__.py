"""Search: strategies (exhaustive, beam, one-at-a-time, mixed, learned) and the search loop."""

from __future__ import annotations

from routetune.hookspecs import hookimpl
from routetune.registry import Registry
from routetune.search.beam import Beam
from routetune.search.exhaustive import Exhaustive
from routetune.search.learned import Learned
from routetune.search.mixed import Mixed
from routetune.search.one_at_a_time import OneAtATime


@hookimpl
def routetune_register_strategies(registry: Registry) -> None:
    """Register the built-in strategies: exhaustive, beam, one-at-a-time, mixed, learned."""
    for cls in (Exhaustive, Beam, OneAtATime, Mixed, Learned):
        registry.add_strategy(cls)
