"""A third-party seasoning plugin: one build seasoning for the ONNX Runtime backend."""

from __future__ import annotations

import os
import signal
import time

from routetune import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo, hookimpl

BREAK = os.environ.get("ROUTETUNE_DEMO_BREAK", "")
"""How the tests break this plugin: ``import`` (or ``1``), ``hook`` (a misspelled hook),
``register`` (its registration raises), ``ctrl-c`` (a Ctrl-C arrives while it imports)."""

if BREAK in ("1", "import"):
    raise ImportError("routetune_demo was told to break")

if BREAK == "ctrl-c":  # as in an extension module's initialisation (onnxruntime's): the
    try:  # KeyboardInterrupt that the handler raises becomes an ImportError
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler runs first
    except KeyboardInterrupt as e:
        raise ImportError("initialization failed") from e


class SingleThread(Seasoning):
    """Run ONNX Runtime on one intra-op thread.

    1. Sets ``onnxruntime.intra_op_num_threads`` to 1.
    """

    info = SeasoningInfo(
        name="demo-single-thread",
        stage="build",
        summary="one intra-op thread (from the routetune-demo package)",
        backends=frozenset({"onnxruntime"}),
    )

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set one intra-op thread."""
        state.settings["onnxruntime.intra_op_num_threads"] = 1
        return PassResult(modified=True, stats={"options": 1})


@hookimpl
def routetune_register_seasonings(registry) -> None:  # noqa: ANN001
    """Register the demo seasoning."""
    if BREAK == "register":
        raise KeyError("demo-single-thread")
    registry.add_seasoning(SingleThread)


if BREAK == "hook":
    @hookimpl
    def routetune_register_seasonnings(registry) -> None:  # noqa: ANN001 - misspelled
        """A hook routetune does not have."""
