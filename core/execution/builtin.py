"""The built-in executors, registered as a plugin's executor is (entry point ``execution``)."""

from __future__ import annotations

from routetune.execution.executor import InlineExecutor
from routetune.execution.local_pool import LocalPool
from routetune.hookspecs import hookimpl
from routetune.registry import Registry


@hookimpl
def routetune_register_executors(registry: Registry) -> None:
    """Register the built-in executors: ``local`` (worker processes) and ``in-process``."""
    registry.add_executor(LocalPool)
    registry.add_executor(InlineExecutor)
