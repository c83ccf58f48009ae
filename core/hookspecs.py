"""Hook specifications of routetune's plugin system (pluggy project ``routetune``).

A plugin is a module or object with functions marked by `routetune.hookimpl`, exposed
through the ``routetune`` entry-point group. The built-ins register through the same
group as third-party packages. Hooks run in no guaranteed order; registries sort what
they hold by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from routetune.registry import Registry

PROJECT = "routetune"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marker for hook implementations: ``@routetune.hookimpl`` (the package re-exports it)."""


@hookspec
def routetune_register_seasonings(registry: Registry) -> None:
    """Register seasoning classes with ``registry.add_seasoning(cls)``.

    Called once per plugin manager, when the registry is built (before any search).

    Args:
        registry: The registry to add to. Adding a name another plugin already added
            raises `PluginError` naming both plugins.

    .. versionadded:: 0.1
    """


@hookspec
def routetune_register_backends(registry: Registry) -> None:
    """Register backend classes with ``registry.add_backend(cls)``.

    Called once per plugin manager, when the registry is built.

    Args:
        registry: The registry to add to.

    .. versionadded:: 0.1
    """


@hookspec
def routetune_register_strategies(registry: Registry) -> None:
    """Register search strategy classes with ``registry.add_strategy(cls)``.

    Called once per plugin manager, when the registry is built.

    Args:
        registry: The registry to add to.

    .. versionadded:: 0.1
    """


@hookspec
def routetune_register_metrics(registry: Registry) -> None:
    """Register accuracy metrics with ``registry.add_metric(metric)``.

    Called once per plugin manager, when the registry is built. A metric's name can
    then be used in ``--accuracy`` expressions. A `routetune.judging.metrics.Metric`
    compares two arrays; a `routetune.judging.metrics.TaskMetric` sees an output of
    every validation input set at once and may take a parameter (``mask_iou@0.3``).

    Args:
        registry: The registry to add to.

    .. versionadded:: 0.1
    """


@hookspec
def routetune_register_executors(registry: Registry) -> None:
    """Register executors with ``registry.add_executor(cls)``.

    Called once per plugin manager, when the registry is built. An executor says where
    a search's trials run (`routetune.execution.executor.Executor`); its ``name`` is the
    ``--executor`` value. The built-ins, ``local`` and ``in-process``, register through
    this hook too (`routetune.execution`); Ray's in `routetune.plugins.ray`.

    Args:
        registry: The registry to add to.
    """
