"""CUDA helpers shared by the GPU backends, through CuPy: device facts and event timing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any


def visible_gpus() -> tuple[str, ...]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` values, one per GPU.

    From ``CUDA_VISIBLE_DEVICES`` when it is set, else from ``nvidia-smi -L`` (which
    does not create a CUDA context here), else one GPU, ``0``. A measuring worker per
    GPU gets one of these values as its own ``CUDA_VISIBLE_DEVICES``.
    """
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return tuple(d.strip() for d in given.split(",") if d.strip())
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
            if gpus:
                return tuple(str(i) for i in range(len(gpus)))
        except (OSError, subprocess.SubprocessError):
            pass
    return ("0",)


def cuda_versions() -> dict[str, str]:
    """GPU name, compute capability, driver and CUDA runtime versions (device 0).

    Raises:
        ImportError: CuPy is not installed.
        cupy.cuda.runtime.CUDARuntimeError: No usable CUDA device or driver.
    """
    import cupy

    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def dotted(v: int) -> str:
        return f"{v // 1000}.{v % 1000 // 10}"

    return {"gpu": name, "cuda_driver": dotted(runtime.driverGetVersion()),
            "cuda_runtime": dotted(runtime.runtimeGetVersion()),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "cupy": cupy.__version__}


def event_timed(stream: Any, call: Callable[[], None]) -> float:
    """Run `call` between two CUDA events recorded on `stream`; their gap in ms.

    ``cudaEventElapsedTime`` has a resolution of about 0.5 µs (CUDA Runtime API docs).
    """
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    call()
    end.record(stream)
    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end))


def device_memory_used() -> int:
    """Bytes in use on the current CUDA device (``cudaMemGetInfo``: total minus free).

    Device-wide: another process's allocations on the same GPU count too (the machine's
    conditions name such processes, `routetune.timing.conditions`).
    """
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)
