"""Search: strategies (exhaustive, beam) and the loop that builds and measures routes."""

from __future__ import annotations

from routetune import hookimpl
from routetune.registry import Registry
from routetune.search.beam import Beam
from routetune.search.exhaustive import Exhaustive


@hookimpl
def routetune_register_strategies(registry: Registry) -> None:
    """Register the built-in strategies: exhaustive and beam."""
    registry.add_strategy(Exhaustive)
    registry.add_strategy(Beam)
