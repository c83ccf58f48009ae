"""The TensorRT timing cache one output folder shares between its build workers.

Several build workers (``--build-workers``) build at once, and each starts from the
cache on disk and adds the tactics it timed. The file is read under an exclusive lock
(`fcntl.flock` on ``timing.cache.lock``); after a build the worker takes the lock
again, reads the file as it is now, merges its own cache into it
(``ITimingCache.combine``, as Polygraphy's timing-cache saving does) and replaces the
file through a temporary name unique to the process, so that no build's tactics are
lost and no reader sees half a file. TensorRT-RTX keeps no timing cache (its calls are
accepted and do nothing), so there the file stays as the builds left it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of the cache file `path` (``<path>.lock``), blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read(path: Path) -> bytes:
    """The cache file's bytes under its lock; empty when there is none yet."""
    with locked(path):
        return path.read_bytes() if path.exists() else b""


def merge(path: Path, config: Any) -> int:
    """Merge the cache of `config` (an ``IBuilderConfig`` after a build) into the file.

    Under the lock: the file as it is now is loaded into a new cache of `config`'s
    kind, the build's cache is combined into it (mismatching entries ignored: another
    device's or version's), and the result replaces the file atomically.

    Returns:
        The size of the file written, in bytes.
    """
    built = config.get_timing_cache()
    with locked(path):
        on_disk = path.read_bytes() if path.exists() else b""
        merged = config.create_timing_cache(on_disk) if on_disk else None
        if merged is not None and merged.combine(built, True):
            pass  # the file's entries and this build's
        else:  # no file yet, or one TensorRT cannot read (logged by the build)
            merged = built
        data = bytes(merged.serialize())
        write_atomic(path, data)
    return len(data)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary name unique to this process and moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
