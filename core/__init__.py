"""routetune: find the fastest inference engine for an ONNX model within an accuracy constraint."""

from __future__ import annotations

import pluggy

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
from routetune.hookspecs import PROJECT
from routetune.profile import ShapeProfile
from routetune.route import Route, Step, parse_route
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marker for hook implementations: ``@routetune.hookimpl``."""

from routetune.api import tune  # noqa: E402 - last: it imports the whole tuner

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
