"""routetune: find the fastest inference engine for an ONNX model within an accuracy constraint."""

from __future__ import annotations

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
from routetune.routes.route import Route, Step, parse_route
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from routetune.api import tune


def __getattr__(name: str) -> Any:
    """Import ``routetune.tune`` on first use.

    It pulls in the whole tuner (ONNX, the recipe schema, the worker pool), which
    ``import routetune`` alone should not.
    """
    if name == "tune":
        from routetune.api import tune

        return tune
    raise AttributeError(f"module 'routetune' has no attribute {name!r}")

__all__ = [
    "Backend",
    "BackendError",
    "BuildError",
    "Engine",
    "EngineNotRunnable",
    "OptionSpec",
    "Param",
    "PassResult",
    "PluginError",
    "PostconditionError",
    "Route",
    "RouteContext",
    "RouteState",
    "RoutetuneError",
    "Runner",
    "Seasoning",
    "ShapeProfile",
    "SeasoningError",
    "SeasoningInfo",
    "Step",
    "StorageError",
    "UsageError",
    "__version__",
    "hookimpl",
    "parse_route",
    "tune",
]
