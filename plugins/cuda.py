"""CUDA helpers shared by the GPU backends, through CuPy: device facts and event timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
