"""OpenVINO CPU properties as build seasonings, for every property that can change speed.

The CPU plugin reports its properties (``SUPPORTED_PROPERTIES``); each writable one is
accounted for here:

- `SEARCHED`: the properties routetune sets, with the values a seasoning tries; each
  seasoning below sets one (as the ``openvino.<PROPERTY>`` option of the ``openvino``
  backend), declared as data (`option_seasoning`).
- `LEFT_OUT`: properties that cannot make one synchronous inference faster, or that
  the backend sets itself, each with the reason.

``tests/plugins/openvino`` fails when the installed OpenVINO reports a writable property
that is in neither. ``ov-precision`` (``INFERENCE_PRECISION_HINT``) is registered lazily:
its choices are the types this CPU computes natively (``OPTIMIZATION_CAPABILITIES``),
which only an imported OpenVINO can tell (`precision_seasoning`). Nothing else here
imports openvino. Property names and values: OpenVINO's ``openvino.properties`` Python
API and the "CPU Device" page of its documentation (2026.4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from routetune.option_seasoning import FromParam, OptionSeasoning, option_seasoning, set_options
from routetune.plugins.openvino.installed import cpu_facts, missing
from routetune.seasoning import Param, PassResult, RouteContext, RouteState, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

NS = "openvino."
OV = frozenset({"openvino"})

SEARCHED: dict[str, str] = {
    "PERFORMANCE_HINT": "ov-hint: THROUGHPUT instead of the base LATENCY",
    "NUM_STREAMS": "ov-streams: 2 or more streams (the LATENCY hint makes one)",
    "INFERENCE_NUM_THREADS": "ov-threads: 1, half the cores, all cores (0: OpenVINO chooses)",
    "ENABLE_CPU_PINNING": "ov-no-pinning: threads not pinned to cores",
    "ENABLE_HYPER_THREADING": "ov-no-hyper-threading: one thread per physical core",
    "SCHEDULING_CORE_TYPE": "ov-core-type: P-cores or E-cores only, on a hybrid CPU",
    "TBB_PARTITIONER": "ov-tbb-partitioner: TBB's static or auto partitioner",
    "CPU_DENORMALS_OPTIMIZATION": "ov-denormals: flush denormals to zero (FTZ/DAZ)",
    "INFERENCE_PRECISION_HINT": "ov-precision: a type the CPU computes natively (bf16, f16)",
}
"""The CPU properties routetune searches, by OpenVINO name, with their seasonings."""

LEFT_OUT: dict[str, str] = {
    "EXECUTION_MODE_HINT": "ACCURACY only forces f32 inference precision, which "
                           "ov-precision{type=f32} sets where f32 is not the default",
    "PERFORMANCE_HINT_NUM_REQUESTS": "caps parallel requests for the THROUGHPUT hint; "
                                     "routetune times one request at a time",
    "ENABLE_CPU_RESERVATION": "reserves cores against other models in the same process; "
                              "routetune runs one",
    "MODEL_DISTRIBUTION_POLICY": "splits a model over CPU sockets (tensor parallel) for "
                                 "LLM-sized weights; not searched yet",
    "ENABLE_TENSOR_PARALLEL": "the switch of MODEL_DISTRIBUTION_POLICY's tensor "
                              "parallelism; not searched yet",
    "PERF_COUNT": "per-layer profiling counters: slower, never faster",
    "LOG_LEVEL": "logging",
    "DEVICE_ID": "there is one CPU device",
    "CPU_SPARSE_WEIGHTS_DECOMPRESSION_RATE": "sparse INT8 weights on AMX CPUs only; an "
                                            "ONNX model brings dense weights",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "quantizes activations of weight-compressed "
                                       "(int4/int8 weight-only) layers, which ONNX models "
                                       "from routetune do not have",
    "KV_CACHE_PRECISION": "the KV cache of OpenVINO's PagedAttention (LLM pipelines)",
    "KEY_CACHE_PRECISION": "the KV cache of OpenVINO's PagedAttention (LLM pipelines)",
    "VALUE_CACHE_PRECISION": "the KV cache of OpenVINO's PagedAttention (LLM pipelines)",
    "KEY_CACHE_GROUP_SIZE": "the KV cache of OpenVINO's PagedAttention (LLM pipelines)",
    "VALUE_CACHE_GROUP_SIZE": "the KV cache of OpenVINO's PagedAttention (LLM pipelines)",
    "ENABLE_WEIGHTLESS": "leaves weights out of cached blobs: cache size, not speed",
    "WEIGHTS_PATH": "where weightless cached blobs find their weights (write-only)",
    "CACHE_DIR": "set by the backend: the output folder's artifacts/openvino-cache",
}
"""CPU properties that routetune does not search, with the reason."""

UNSET = ""
"""An option value that leaves the property to OpenVINO's default (not passed)."""


def cores() -> int:
    """This machine's logical CPU count."""
    return os.cpu_count() or 1


def _thread_choices() -> tuple[int, ...]:
    return tuple(sorted({1, max(1, cores() // 2), cores()}))


OvHint = option_seasoning("OvHint", SeasoningInfo(
    name="ov-hint", stage="build", backends=OV,
    summary="PERFORMANCE_HINT THROUGHPUT instead of LATENCY",
    params=(Param("mode", ("THROUGHPUT",), "THROUGHPUT",
                  "PERFORMANCE_HINT other than the base LATENCY"),)),
    {NS + "PERFORMANCE_HINT": FromParam("mode", str)},
    """Set OpenVINO's performance hint (``PERFORMANCE_HINT``; the base sets ``LATENCY``).

    1. Sets ``openvino.PERFORMANCE_HINT`` to ``mode``. THROUGHPUT makes several streams,
       each with a share of the cores: one request then runs on fewer threads, which
       pays only for models too small to use every core.
    """)

OvStreams = option_seasoning("OvStreams", SeasoningInfo(
    name="ov-streams", stage="build", backends=OV,
    summary="NUM_STREAMS: more than the LATENCY hint's one stream",
    params=(Param("streams", tuple(sorted({2, max(2, cores())})), 2,
                  "NUM_STREAMS; each stream gets a share of the cores"),)),
    {NS + "NUM_STREAMS": FromParam("streams")},
    """Set the number of CPU streams (``NUM_STREAMS``; the LATENCY hint makes one).

    1. Sets ``openvino.NUM_STREAMS`` to ``streams``; routetune times one request at a
       time, which runs on one stream's threads.
    """)

OvThreads = option_seasoning("OvThreads", SeasoningInfo(
    name="ov-threads", stage="build", backends=OV, summary="INFERENCE_NUM_THREADS",
    params=(Param("threads", _thread_choices(), 1, "INFERENCE_NUM_THREADS"),)),
    {NS + "INFERENCE_NUM_THREADS": FromParam("threads")},
    """Pin the inference thread count (the default 0 lets OpenVINO choose).

    1. Sets ``openvino.INFERENCE_NUM_THREADS`` to ``threads``; the choices are 1, half
       the cores and all cores of this machine (``os.cpu_count()``).
    """)

OvNoPinning = option_seasoning("OvNoPinning", SeasoningInfo(
    name="ov-no-pinning", stage="build", backends=OV,
    summary="ENABLE_CPU_PINNING off: threads float between cores"),
    {NS + "ENABLE_CPU_PINNING": "NO"},
    """Do not pin inference threads to cores (``ENABLE_CPU_PINNING=NO``).

    1. Sets ``openvino.ENABLE_CPU_PINNING`` to ``NO`` (OpenVINO pins on Linux by default).
    """)

OvNoHyperThreading = option_seasoning("OvNoHyperThreading", SeasoningInfo(
    name="ov-no-hyper-threading", stage="build", backends=OV,
    summary="ENABLE_HYPER_THREADING off: one thread per physical core"),
    {NS + "ENABLE_HYPER_THREADING": "NO"},
    """Use one logical core per physical core (``ENABLE_HYPER_THREADING=NO``).

    1. Sets ``openvino.ENABLE_HYPER_THREADING`` to ``NO``; it matters only on a CPU with
       SMT, where sibling threads share one core's vector units.
    """)

OvTbbPartitioner = option_seasoning("OvTbbPartitioner", SeasoningInfo(
    name="ov-tbb-partitioner", stage="build", backends=OV,
    summary="TBB_PARTITIONER: how TBB splits a layer's work between threads",
    params=(Param("partitioner", ("STATIC", "AUTO"), "STATIC", "TBB_PARTITIONER"),)),
    {NS + "TBB_PARTITIONER": FromParam("partitioner", str)},
    """Pick TBB's partitioner (``TBB_PARTITIONER``; unset, OpenVINO picks per layer).

    1. Sets ``openvino.TBB_PARTITIONER`` to ``partitioner``: STATIC splits work evenly
       once, AUTO balances it at run time.
    """)

OvDenormals = option_seasoning("OvDenormals", SeasoningInfo(
    name="ov-denormals", stage="build", backends=OV,
    summary="CPU_DENORMALS_OPTIMIZATION: denormals computed as zero (FTZ/DAZ)"),
    {NS + "CPU_DENORMALS_OPTIMIZATION": "YES"},
    """Compute with denormal floats flushed to zero (``CPU_DENORMALS_OPTIMIZATION=YES``).

    1. Sets ``openvino.CPU_DENORMALS_OPTIMIZATION`` to ``YES``: OpenVINO turns on FTZ and
       DAZ in its inference threads, which avoids slow denormal arithmetic on models
       whose activations decay towards zero; the accuracy check says whether the zeroed
       values mattered. Compiling also turns them on in the calling thread, for the rest
       of the process (OpenVINO 2026.4.1); the search keeps that out of the thread
       (`routetune.timing.float_env`), so later trials and accuracy checks are unchanged.
    """)


def hybrid_cpu(sysfs: Path = Path("/sys/devices")) -> bool:
    """Whether this CPU has two core types (Intel P- and E-cores).

    Linux exposes one perf PMU per core type on such a CPU, ``cpu_core`` and
    ``cpu_atom`` (kernel ``arch/x86/events/intel/core.c``); other CPUs have ``cpu``.
    """
    return (sysfs / "cpu_core").is_dir() and (sysfs / "cpu_atom").is_dir()


class OvCoreType(OptionSeasoning):
    """Run on one core type of a hybrid CPU (``SCHEDULING_CORE_TYPE``).

    1. Sets ``openvino.SCHEDULING_CORE_TYPE`` to ``type`` (default ``ANY_CORE``); offered
       only on a hybrid CPU (`hybrid_cpu`), where it can change speed.
    """

    info = SeasoningInfo(
        name="ov-core-type", stage="build", backends=OV,
        summary="SCHEDULING_CORE_TYPE: P-cores or E-cores only (hybrid CPUs)",
        params=(Param("type", ("PCORE_ONLY", "ECORE_ONLY"), "PCORE_ONLY",
                      "SCHEDULING_CORE_TYPE other than ANY_CORE"),))
    sets = {NS + "SCHEDULING_CORE_TYPE": FromParam("type", str)}

    def supports(self, backend: Backend) -> str | None:
        """Why not: another backend, or a CPU with one core type."""
        return super().supports(backend) or (
            None if hybrid_cpu() else "not a hybrid CPU: every core is of one type")


PRECISIONS = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
"""``INFERENCE_PRECISION_HINT`` values, by the ``OPTIMIZATION_CAPABILITIES`` entry that
says the CPU computes the type natively."""


class OvPrecision(OptionSeasoning):
    """Compute in another floating-point type (``INFERENCE_PRECISION_HINT``).

    1. Sets ``openvino.INFERENCE_PRECISION_HINT`` to ``type``: OpenVINO runs the model's
       float32 layers in that type where it keeps accuracy reasonable. The choices are
       the types this CPU computes natively, other than OpenVINO's default here
       (`precision_seasoning`); `left_out` says why each other type is not offered.
    """

    info = SeasoningInfo(name="ov-precision", stage="build", backends=OV,
                         summary="INFERENCE_PRECISION_HINT: compute in bf16 or f16")
    sets = {NS + "INFERENCE_PRECISION_HINT": FromParam("type", str)}
    left_out: Mapping[str, str] = {}

    def supports(self, backend: Backend) -> str | None:
        """Why not: another backend, or no type to offer on this CPU."""
        return super().supports(backend) or (None if self.info.params else "; ".join(
            f"{t}: {why}" for t, why in self.left_out.items()))

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the inference precision."""
        return set_options(state, self.values())


def precision_seasoning(capabilities: Sequence[str], default: str,
                        cpu: str) -> type[OvPrecision]:
    """``ov-precision`` with the types `capabilities` name as its choices.

    Args:
        capabilities: The CPU's ``OPTIMIZATION_CAPABILITIES`` (``FP32``, ``BF16`` …).
        default: The CPU's default ``INFERENCE_PRECISION_HINT`` (``f32``, ``bf16``).
        cpu: The CPU's ``FULL_DEVICE_NAME``, for the reasons.
    """
    offered, left_out = [], {}
    listed = ", ".join(capabilities)
    for name, capability in PRECISIONS.items():
        if name == default:
            left_out[name] = f"OpenVINO's default on {cpu}: the base route computes in it"
        elif capability not in capabilities and name != "f32":
            left_out[name] = (f"{cpu} does not compute {capability} natively "
                              f"(OPTIMIZATION_CAPABILITIES: {listed})")
        else:
            offered.append(name)
    params = (Param("type", tuple(offered), offered[0],
                    "INFERENCE_PRECISION_HINT"),) if offered else ()
    not_offered = "; ".join(f"not {t}: {why}" for t, why in left_out.items())
    summary = (f"INFERENCE_PRECISION_HINT ({not_offered})" if offered
               else OvPrecision.info.summary)  # with no choice, `supports` says why
    info = SeasoningInfo(name=OvPrecision.info.name, stage="build", backends=OV,
                         summary=summary, params=params)
    return type("OvPrecision", (OvPrecision,), {
        "info": info, "left_out": left_out, "__module__": __name__,
        "__qualname__": "OvPrecision"})


def make_precision() -> type[OvPrecision]:
    """``ov-precision`` for this CPU, read from the installed OpenVINO.

    Without openvino (``routetune seasonings`` lists every seasoning), one with no
    choices, whose reason is the backend's.
    """
    why = missing()
    if why:
        info = SeasoningInfo(name=OvPrecision.info.name, stage="build", backends=OV,
                             summary=f"INFERENCE_PRECISION_HINT ({why})")
        return type("OvPrecision", (OvPrecision,), {
            "info": info, "left_out": {"bf16, f16": why}, "__module__": __name__,
            "__qualname__": "OvPrecision"})
    facts = cpu_facts()
    return precision_seasoning(facts.capabilities, facts.default_precision, facts.name)


SEASONINGS = (OvHint, OvStreams, OvThreads, OvNoPinning, OvNoHyperThreading, OvCoreType,
              OvTbbPartitioner, OvDenormals)
