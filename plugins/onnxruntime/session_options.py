"""ONNX Runtime build seasonings: session options and session config entries.

Each sets namespaced options of the ``onnxruntime`` backend (see
``routetune.plugins.onnxruntime.backend``), declared as data (`option_seasoning`); none
imports onnxruntime. The option meanings are ONNX Runtime's: ``SessionOptions``
attributes, and the config keys of ``onnxruntime_session_options_config_keys.h``.
"""

from __future__ import annotations

import os

from routetune.option_seasoning import FromParam, option_seasoning
from routetune.seasoning import Param, SeasoningInfo

NS = "onnxruntime."
CONFIG = NS + "config."
ORT = frozenset({"onnxruntime"})
"""The CPU backend: thread, spinning and MLAS options do nothing useful on a GPU."""
ANY_ORT = frozenset({"onnxruntime", "onnxruntime-cuda"})


def _thread_choices() -> tuple[int, ...]:
    cores = os.cpu_count() or 1
    return tuple(sorted({1, max(1, cores // 2), cores}))


OrtOptLevel = option_seasoning("OrtOptLevel", SeasoningInfo(
    name="ort-opt-level", stage="build", backends=ANY_ORT,
    summary="session graph optimisation level below the default 'all'",
    params=(Param("level", ("disable", "basic", "extended"), "extended",
                  "GraphOptimizationLevel: ORT_DISABLE_ALL, _BASIC or _EXTENDED"),)),
    {NS + "graph_optimization_level": FromParam("level")},
    """Lower ONNX Runtime's graph optimisation level (the backend default is ``all``).

    1. Sets ``onnxruntime.graph_optimization_level`` to ``level``.
    """)

OrtParallel = option_seasoning("OrtParallel", SeasoningInfo(
    name="ort-parallel", stage="build", backends=ORT,
    summary="parallel execution mode, with inter-op threads",
    params=(Param("inter_op_threads", (0, 2), 0, "inter_op_num_threads; 0: ORT chooses"),)),
    {NS + "execution_mode": "parallel",
     NS + "inter_op_num_threads": FromParam("inter_op_threads")},
    """Run independent graph branches in parallel (ExecutionMode.ORT_PARALLEL).

    1. Sets ``onnxruntime.execution_mode`` to ``parallel``.
    2. Sets ``onnxruntime.inter_op_num_threads`` to ``inter_op_threads`` (0: ORT chooses).
    """)

OrtThreads = option_seasoning("OrtThreads", SeasoningInfo(
    name="ort-threads", stage="build", backends=ORT, summary="intra-op thread count",
    params=(Param("intra_op", _thread_choices(), 1, "intra_op_num_threads"),)),
    {NS + "intra_op_num_threads": FromParam("intra_op")},
    """Pin the intra-op thread count (the default 0 lets ONNX Runtime choose).

    1. Sets ``onnxruntime.intra_op_num_threads`` to ``intra_op``; the choices are 1,
       half the cores and all cores of this machine (``os.cpu_count()``).
    """)

OrtNoSpinning = option_seasoning("OrtNoSpinning", SeasoningInfo(
    name="ort-no-spinning", stage="build", backends=ORT,
    summary="session config: thread pools do not spin while idle"),
    {CONFIG + "session.intra_op.allow_spinning": "0",
     CONFIG + "session.inter_op.allow_spinning": "0"},
    """Let idle worker threads sleep instead of spinning.

    1. Sets config ``session.intra_op.allow_spinning`` and
       ``session.inter_op.allow_spinning`` to ``"0"`` (default ``"1"``).
    """)

OrtDenormalAsZero = option_seasoning("OrtDenormalAsZero", SeasoningInfo(
    name="ort-denormal-as-zero", stage="build", backends=ORT,
    summary="session config: treat denormal floats as zero"),
    {CONFIG + "session.set_denormal_as_zero": "1"},
    """Flush denormal floats to zero (FTZ/DAZ), which can avoid slow denormal arithmetic.

    1. Sets config ``session.set_denormal_as_zero`` to ``"1"`` (default ``"0"``).
    """)

OrtNoPrepacking = option_seasoning("OrtNoPrepacking", SeasoningInfo(
    name="ort-no-prepacking", stage="build", backends=ORT,
    summary="session config: do not pre-pack constant weights"),
    {CONFIG + "session.disable_prepacking": "1"},
    """Keep weights in their original layout instead of pre-packing them for MLAS.

    1. Sets config ``session.disable_prepacking`` to ``"1"`` (default ``"0"``).
    """)

SEASONINGS = (OrtOptLevel, OrtParallel, OrtThreads, OrtNoSpinning, OrtDenormalAsZero,
              OrtNoPrepacking)
