"""Optuna: its TPE sampler as a search strategy (``--search tpe``).

Optuna is imported only when a search starts (``pip install 'routetune[optuna]'``), so
``routetune seasonings`` lists the strategy either way.
"""

from __future__ import annotations

from routetune.hookspecs import hookimpl
from routetune.plugins.optuna.tpe import Tpe
from routetune.registry import Registry


@hookimpl
def routetune_register_strategies(registry: Registry) -> None:
    """Register ``--search tpe``."""
    registry.add_strategy(Tpe)
