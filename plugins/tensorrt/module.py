"""Which TensorRT Python module to use: TensorRT 11, else TensorRT-RTX.

``tensorrt`` (11.x, strongly typed networks only) is used when importable. Otherwise
TensorRT-RTX, whose builder API is the same subset: ``tensorrt_rtx`` (NVIDIA's own
wheel) or ``tensorrt_rtx_bindings`` (PyPI's ``tensorrt-rtx-cu13-bindings``). TensorRT
10 and older are refused: they build weakly typed networks with FP16/INT8 builder
flags, which routetune does not use (precision comes from the ONNX graph).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

from routetune.install import pip_install

CANDIDATES = ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings")
MIN_TENSORRT_MAJOR = 11


@dataclass(frozen=True)
class TensorRtModule:
    """The module in use, or why there is none.

    Args:
        module: The imported module, or None.
        name: Its import name (``tensorrt``, ``tensorrt_rtx_bindings`` …), or "".
        version: Its ``__version__``, or "".
        reason: Why no module is usable (one line); "" when one is.
    """

    module: ModuleType | None
    name: str = ""
    version: str = ""
    reason: str = ""

    @property
    def rtx(self) -> bool:
        """Whether this is TensorRT-RTX (no timing cache, no build routes)."""
        return self.name.startswith("tensorrt_rtx")

    def __str__(self) -> str:
        return f"{self.name} {self.version}" if self.module else f"none ({self.reason})"


@functools.cache
def find_tensorrt() -> TensorRtModule:
    """Import the first usable module of `CANDIDATES`; cached for the process."""
    skipped = []
    for name in CANDIDATES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            skipped.append(f"{name}: {e}")
            continue
        version = str(getattr(module, "__version__", "?"))
        if name == "tensorrt" and _major(version) < MIN_TENSORRT_MAJOR:
            skipped.append(f"tensorrt {version} is older than 11 (weakly typed builds)")
            continue
        return TensorRtModule(module, name, version)
    reason = ("no TensorRT Python module (" + "; ".join(skipped)[:300] + "); install "
              "tensorrt>=11 from NVIDIA's index, or TensorRT-RTX with "
              f"`{pip_install('tensorrt')}`")
    return TensorRtModule(None, reason=reason)


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0
