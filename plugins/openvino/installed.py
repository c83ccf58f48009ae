"""The installed OpenVINO and this CPU as its CPU plugin reports it.

Apart from the backend (`routetune.plugins.openvino.backend`) so that the property
seasonings (`routetune.plugins.openvino.properties`) can read the CPU's precisions
without importing the backend. `missing` and `installed_version` read the installed
distribution's metadata; `core` and `cpu_facts` import openvino.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

from routetune.install import pip_install

DEVICE = "CPU"


def missing() -> str | None:
    """None with the openvino package installed; else why not, in one line."""
    if importlib.util.find_spec("openvino") is None:
        return f"the openvino package is not installed; {pip_install('openvino')}"
    return None


def installed_version() -> str:
    """The installed openvino distribution's version (``2026.4.1``); empty without it."""
    try:
        return importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class CpuFacts:
    """What OpenVINO's CPU plugin reports about this CPU.

    Args:
        name: ``FULL_DEVICE_NAME`` (``AMD EPYC``, ``Intel(R) Xeon(R) ...``).
        capabilities: ``OPTIMIZATION_CAPABILITIES`` (``FP32``, ``BF16``, ``FP16``, ``INT8`` …).
        default_precision: The default ``INFERENCE_PRECISION_HINT`` (``f32``, ``bf16``).
        version: ``openvino.get_version()``, the full build string.
    """

    name: str
    capabilities: tuple[str, ...]
    default_precision: str
    version: str


@functools.cache
def core() -> Any:
    """The process's ``openvino.Core`` (one per process: it owns the plugin's threads)."""
    import openvino as ov

    return ov.Core()


@functools.cache
def cpu_facts() -> CpuFacts:
    """Read `CpuFacts` from the installed OpenVINO (imports it)."""
    import openvino as ov

    ov_core = core()
    precision = ov_core.get_property(DEVICE, "INFERENCE_PRECISION_HINT")
    return CpuFacts(str(ov_core.get_property(DEVICE, "FULL_DEVICE_NAME")),
                    tuple(ov_core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")),
                    precision.get_type_name(), ov.get_version())
