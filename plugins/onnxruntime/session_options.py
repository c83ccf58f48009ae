"""ONNX Runtime build seasonings: session options and session config entries.

Each sets namespaced options of the ``onnxruntime`` backend (see
``routetune.plugins.onnxruntime.backend``); none imports onnxruntime. The option
meanings are ONNX Runtime's: ``SessionOptions`` attributes, and the config keys of
``onnxruntime_session_options_config_keys.h``.
"""

from __future__ import annotations

import os
from typing import ClassVar

from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
    set_options,
)

NS = "onnxruntime."
ORT = frozenset({"onnxruntime"})
"""The CPU backend: thread, spinning and MLAS options do nothing useful on a GPU."""
ANY_ORT = frozenset({"onnxruntime", "onnxruntime-cuda"})


def _thread_choices() -> tuple[int, ...]:
    cores = os.cpu_count() or 1
    return tuple(sorted({1, max(1, cores // 2), cores}))


class OrtOptLevel(Seasoning):
    """Lower ONNX Runtime's graph optimisation level (the backend default is ``all``).

    1. Sets ``onnxruntime.graph_optimization_level`` to ``level``.
    """

    info = SeasoningInfo(
        name="ort-opt-level",
        stage="build",
        summary="session graph optimisation level below the default 'all'",
        params=(Param("level", ("disable", "basic", "extended"), "extended",
                      "GraphOptimizationLevel: ORT_DISABLE_ALL, _BASIC or _EXTENDED"),),
        backends=ANY_ORT,
    )

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the optimisation level."""
        return set_options(state, {NS + "graph_optimization_level": self.params["level"]})


class OrtParallel(Seasoning):
    """Run independent graph branches in parallel (ExecutionMode.ORT_PARALLEL).

    1. Sets ``onnxruntime.execution_mode`` to ``parallel``.
    2. Sets ``onnxruntime.inter_op_num_threads`` to ``inter_op_threads`` (0: ORT chooses).
    """

    info = SeasoningInfo(
        name="ort-parallel",
        stage="build",
        summary="parallel execution mode, with inter-op threads",
        params=(Param("inter_op_threads", (0, 2), 0, "inter_op_num_threads; 0: ORT chooses"),),
        backends=ORT,
    )

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the execution mode and inter-op threads."""
        return set_options(state, {NS + "execution_mode": "parallel",
                            NS + "inter_op_num_threads": self.params["inter_op_threads"]})


class OrtThreads(Seasoning):
    """Pin the intra-op thread count (the default 0 lets ONNX Runtime choose).

    1. Sets ``onnxruntime.intra_op_num_threads`` to ``intra_op``; the choices are 1,
       half the cores and all cores of this machine (``os.cpu_count()``).
    """

    info = SeasoningInfo(
        name="ort-threads",
        stage="build",
        summary="intra-op thread count",
        params=(Param("intra_op", _thread_choices(), 1, "intra_op_num_threads"),),
        backends=ORT,
    )

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the intra-op thread count."""
        return set_options(state, {NS + "intra_op_num_threads": self.params["intra_op"]})


class _ConfigEntries(Seasoning):
    """Sets fixed session config entries (``onnxruntime.config.<key>``)."""

    entries: ClassVar[dict[str, str]]

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the entries."""
        return set_options(state, {NS + "config." + k: v for k, v in self.entries.items()})


class OrtNoSpinning(_ConfigEntries):
    """Let idle worker threads sleep instead of spinning.

    1. Sets config ``session.intra_op.allow_spinning`` and
       ``session.inter_op.allow_spinning`` to ``"0"`` (default ``"1"``).
    """

    info = SeasoningInfo(
        name="ort-no-spinning",
        stage="build",
        summary="session config: thread pools do not spin while idle",
        backends=ORT,
    )
    entries = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


class OrtDenormalAsZero(_ConfigEntries):
    """Flush denormal floats to zero (FTZ/DAZ), which can avoid slow denormal arithmetic.

    1. Sets config ``session.set_denormal_as_zero`` to ``"1"`` (default ``"0"``).
    """

    info = SeasoningInfo(
        name="ort-denormal-as-zero",
        stage="build",
        summary="session config: treat denormal floats as zero",
        backends=ORT,
    )
    entries = {"session.set_denormal_as_zero": "1"}


class OrtNoPrepacking(_ConfigEntries):
    """Keep weights in their original layout instead of pre-packing them for MLAS.

    1. Sets config ``session.disable_prepacking`` to ``"1"`` (default ``"0"``).
    """

    info = SeasoningInfo(
        name="ort-no-prepacking",
        stage="build",
        summary="session config: do not pre-pack constant weights",
        backends=ORT,
    )
    entries = {"session.disable_prepacking": "1"}


SEASONINGS = (OrtOptLevel, OrtParallel, OrtThreads, OrtNoSpinning, OrtDenormalAsZero,
              OrtNoPrepacking)
