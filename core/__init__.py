"""routetune: find the fastest inference engine for an ONNX model within an accuracy constraint.

The package's face: what a user calls (`tune`) and every name a plugin needs, whatever
its kind (CONTRIBUTING.md): `Seasoning`, `Backend`, `Strategy`, `Metric` and
`TaskMetric`, `Executor`, `Refinement`, the `Registry` its hooks fill, `hookimpl`,
`option` for its options and `StashKey` for what its steps share. The contract kit is
`routetune.testing`. The names whose modules load the tuner (ONNX, the worker pool) are
imported on first use (`_LAZY`), so that ``import routetune`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from routetune.backend import Backend, Engine, OptionSpec, Runner
from routetune.errors import (
    BackendError,
    BuildError,
    EngineNotRunnable,
    PluginError,
    PostconditionError,
    RoutetuneError,
    SeasoningError,
    StorageError,
    UsageError,
)
from routetune.feeds.profile import ShapeProfile
from routetune.hookspecs import hookimpl
from routetune.options import option
from routetune.registry import Registry
from routetune.routes.route import Route, Step, parse_route
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)
from routetune.stash import StashKey

__version__ = "0.1.0"

if TYPE_CHECKING:
    from routetune.api import tune
    from routetune.execution.executor import Executor, ExecutorSettings, InlineExecutor
    from routetune.judging.metrics import Metric, TaskMetric, TaskParam
    from routetune.refinement import Refinement
    from routetune.search.strategy import Strategy

_LAZY = {
    "tune": "routetune.api",
    "Strategy": "routetune.search.strategy",
    "Metric": "routetune.judging.metrics",
    "TaskMetric": "routetune.judging.metrics",
    "TaskParam": "routetune.judging.metrics",
    "Executor": "routetune.execution.executor",
    "ExecutorSettings": "routetune.execution.executor",
    "InlineExecutor": "routetune.execution.executor",
    "Refinement": "routetune.refinement",
}
"""Names imported on first use, by the module that defines them: ``routetune.tune`` pulls in
the whole tuner (ONNX, the recipe schema, the worker pool), which ``import routetune``
alone should not."""


def __getattr__(name: str) -> Any:
    """Import a name of `_LAZY` on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'routetune' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendError",
    "BuildError",
    "Engine",
    "EngineNotRunnable",
    "Executor",
    "ExecutorSettings",
    "InlineExecutor",
    "Metric",
    "OptionSpec",
    "Param",
    "PassResult",
    "PluginError",
    "PostconditionError",
    "Refinement",
    "Registry",
    "Route",
    "RouteContext",
    "RouteState",
    "RoutetuneError",
    "Runner",
    "Seasoning",
    "ShapeProfile",
    "SeasoningError",
    "SeasoningInfo",
    "StashKey",
    "Step",
    "StorageError",
    "Strategy",
    "TaskMetric",
    "TaskParam",
    "UsageError",
    "__version__",
    "hookimpl",
    "option",
    "parse_route",
    "tune",
]
