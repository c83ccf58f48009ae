"""Seasonings that misbehave on purpose: each must end as one recorded trial.

For routetune's isolation tests (tests/execution/test_local_pool.py) only. Every seasoning
but ``chaos-drop-waste`` and ``chaos-slow`` breaks the worker that applies it in its own
way; ``chaos-drop-waste`` is the healthy route that must win (on tests/graphs.py
`wasteful`); ``chaos-slow`` builds slowly, for the time budget's tests.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time

import numpy

from routetune import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
    hookimpl,
)

SLOW_S = 12.0
"""How long ``chaos-slow`` takes to apply (s)."""


def _info(name: str, summary: str, params: tuple[Param, ...] = ()) -> SeasoningInfo:
    return SeasoningInfo(name=name, stage="graph", summary=summary, params=params,
                         backends=frozenset({"onnxruntime"}))


class Abort(Seasoning):
    """Calls ``os.abort()``: the worker dies of SIGABRT."""

    info = _info("chaos-abort", "os.abort()")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Abort."""
        print("chaos-abort: about to abort", flush=True)
        os.abort()


class Segfault(Seasoning):
    """Reads address 0 through ctypes: the worker dies of SIGSEGV."""

    info = _info("chaos-segfault", "null pointer dereference")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Dereference a null pointer."""
        ctypes.string_at(0)
        return PassResult(False)


class Hang(Seasoning):
    """Sleeps for an hour: the trial times out."""

    info = _info("chaos-hang", "sleeps past any timeout")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Sleep."""
        time.sleep(3600)
        return PassResult(False)


class Hog(Seasoning):
    """Allocates 256 MiB blocks until the worker's address-space limit stops it.

    Refuses (ValueError) when no limit is set, so that it never takes a machine down.
    """

    info = _info("chaos-oom", "allocates memory until RLIMIT_AS stops it")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Allocate until MemoryError."""
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            raise ValueError("chaos-oom runs only under an address-space limit")
        blocks = []
        while True:  # numpy.empty maps pages without touching them: quick to exhaust
            blocks.append(numpy.empty(2**28, numpy.uint8))


class Exit(Seasoning):
    """Calls ``sys.exit(3)``: plugin code that ends the process the polite way."""

    info = _info("chaos-exit", "sys.exit(3)")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Exit."""
        sys.exit(3)


class Flaky(Seasoning):
    """Renames the first node after the variant, except with ``variant=b``: it raises."""

    info = _info("chaos-flaky", "raises on variant b only",
                 (Param("variant", ("a", "b", "c"), "a", "which variant"),))

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Raise on variant b."""
        if self.params["variant"] == "b":
            raise RuntimeError("chaos-flaky: variant b is broken")
        state.graph.nodes[0].name = f"renamed_{self.params['variant']}"
        return PassResult(True, {"renamed": 1})


class DropWaste(Seasoning):
    """Removes the branch that `wasteful` multiplies by zero: exact and much faster."""

    info = _info("chaos-drop-waste", "remove x*0 branches")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Replace the Add of the wasted branch by an Identity of its live input."""
        add = next(n for n in state.graph.nodes if n.name == "add")
        add.op, add.inputs = "Identity", [add.inputs[0]]
        state.graph.cleanup().toposort()
        return PassResult(True, {"removed": 1})


class Slow(Seasoning):
    """Sleeps `SLOW_S` seconds, then renames the first node: a slow build."""

    info = _info("chaos-slow", f"sleeps {SLOW_S:g} s, then renames a node")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Sleep, then rename."""
        time.sleep(SLOW_S)
        state.graph.nodes[0].name = "slow"
        return PassResult(True, {"renamed": 1})


@hookimpl
def routetune_register_seasonings(registry) -> None:  # noqa: ANN001
    """Register the chaos seasonings."""
    for cls in (Abort, Segfault, Hang, Hog, Exit, Flaky, DropWaste, Slow):
        registry.add_seasoning(cls)
