"""The calling thread's floating-point environment, kept from engines that change it.

Some engines turn on flush-to-zero and denormals-are-zero (FTZ/DAZ) in the thread that
creates them, and leave them on: ONNX Runtime's ``session.set_denormal_as_zero``
(``ort-denormal-as-zero``) and OpenVINO's ``CPU_DENORMALS_OPTIMIZATION`` do, in the
thread that makes the session or compiles the model. In a worker that runs many trials,
every later trial and its accuracy check would then compute with denormals zeroed.

`contained` runs a build or an open with the thread's environment saved and restored
around it, and says whether the engine left a different one. `guarded_runner` then runs
that engine's calls under the environment it set up, and restores the thread's after
each call, so the engine computes as it would alone and nothing leaks to the next trial.

The environment is read and written with C99 ``fegetenv``/``fesetenv`` (``<fenv.h>``)
from the C maths library; on x86-64 it holds the SSE control and status register
(MXCSR), whose FTZ (bit 15) and DAZ (bit 6) flags are what such engines set. Where no C
maths library can be loaded (Windows), nothing is saved and nothing is guarded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from routetune.backend import Feed, Runner

ENV_BYTES = 64
"""Bytes reserved for a ``fenv_t``: 32 on x86-64 glibc, 8 on aarch64; room to spare."""

_TINY = np.array([1e-40], np.float32)  # a float32 denormal (the smallest normal: 1.2e-38)


@functools.cache
def _libm() -> Any:
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.fegetenv, lib.fesetenv  # noqa: B018 - present, or AttributeError
    except (OSError, AttributeError):
        return None
    return lib


@dataclass(frozen=True)
class FloatEnv:
    """A saved floating-point environment (``fenv_t`` bytes)."""

    raw: bytes

    @classmethod
    def current(cls) -> FloatEnv | None:
        """The calling thread's environment; None where it cannot be read."""
        lib = _libm()
        if lib is None:
            return None
        buf = ctypes.create_string_buffer(ENV_BYTES)
        if lib.fegetenv(buf) != 0:
            return None
        return cls(buf.raw)

    def apply(self) -> None:
        """Make this the calling thread's environment (``fesetenv``)."""
        _libm().fesetenv(ctypes.create_string_buffer(self.raw, ENV_BYTES))


FLUSH_BITS = {"x86_64": (28, 0x8040), "aarch64": (0, 1 << 24)}
"""Where glibc's ``fenv_t`` keeps the flush flags, by machine: (byte offset of a 32-bit
control register, its flush bits). x86-64: MXCSR (``__mxcsr``, after 28 bytes of x87
state) with FTZ 0x8000 and DAZ 0x0040 (Intel SDM vol. 1, 10.2.3); aarch64: FPCR
(``__fpcr``, first) with FZ, bit 24 (Arm ARM, FPCR)."""


def flushing() -> FloatEnv | None:
    """The calling thread's environment with FTZ and DAZ turned on.

    For an engine that computes in the calling thread and expects them there: ONNX
    Runtime's ``session.set_denormal_as_zero``, which sets them only at the process's
    first such session. None where the layout is not known or the result does not flush.
    """
    ours = FloatEnv.current()
    where = FLUSH_BITS.get(platform.machine().lower().replace("amd64", "x86_64"))
    if ours is None or where is None or not sys.platform.startswith("linux"):
        return None
    offset, bits = where
    (register,) = struct.unpack_from("=I", ours.raw, offset)
    raw = bytearray(ours.raw)
    struct.pack_into("=I", raw, offset, register | bits)
    env = FloatEnv(bytes(raw))
    try:
        env.apply()
        works = flushes_denormals()
    finally:
        ours.apply()
    return env if works else None


def flushes_denormals() -> bool:
    """Whether the calling thread computes with denormals zeroed (FTZ or DAZ is on).

    Checked by what it does: a float32 denormal times one is zero under either flag.
    """
    return float((_TINY * np.float32(1.0))[0]) == 0.0


@dataclass
class Left:
    """What a `contained` block left behind.

    Args:
        env: The environment the block left in the thread, when it differs from the one
            before in how it treats denormals; None when it does not (or cannot be read).
    """

    env: FloatEnv | None = None


@contextmanager
def contained() -> Iterator[Left]:
    """Run a block (an engine's build or open) and restore the thread's environment after.

    Yields a `Left` that, once the block is done, holds the environment the block set up
    if it treats denormals differently from the thread's; give it to `guarded_runner`.
    """
    left = Left()
    ours = FloatEnv.current()
    if ours is None:
        yield left
        return
    flushed = flushes_denormals()
    try:
        yield left
    finally:
        if flushes_denormals() != flushed:
            left.env = FloatEnv.current()
        ours.apply()


def within(env: FloatEnv, call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` run under `env`, with the thread's environment restored after each call.

    The buffers are made once, here: a timed call pays three ctypes calls (about 1 µs on
    this project's 2-vCPU test machine, measured with `timeit`), not their set-up.
    """
    lib = _libm()
    engine = ctypes.create_string_buffer(env.raw, ENV_BYTES)
    ours = ctypes.create_string_buffer(ENV_BYTES)
    get, put = lib.fegetenv, lib.fesetenv

    def run() -> Any:
        get(ours)
        put(engine)
        try:
            return call()
        finally:
            put(ours)
    return run


class GuardedRunner(Runner):
    """A runner whose every call runs under its engine's floating-point environment.

    It adds one ``fegetenv`` and two ``fesetenv`` calls (`within`) to every timed call of
    the engines that need it, and nothing to the others.
    """

    def __init__(self, inner: Runner, env: FloatEnv) -> None:
        self.inner = inner
        self.env = env

    @property
    def host_copies(self) -> bool:  # type: ignore[override]
        """The wrapped runner's."""
        return self.inner.host_copies

    @property
    def calls_like_infer(self) -> bool:  # type: ignore[override]
        """The wrapped runner's."""
        return self.inner.calls_like_infer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close(self) -> None:
        """Close the wrapped runner."""
        self.inner.close()

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """The wrapped runner's, under the engine's environment."""
        return within(self.env, lambda: self.inner.infer(feed))()

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """The wrapped runner's call, run under the engine's environment."""
        return within(self.env, self.inner.prepare(feed))

    def prepare_end_to_end(self, feed: Feed) -> Callable[[], None]:
        """The wrapped runner's call, run under the engine's environment."""
        return within(self.env, self.inner.prepare_end_to_end(feed))

    def timed(self, call: Callable[[], None]) -> float:
        """The wrapped runner's timing (CUDA events on a GPU)."""
        return self.inner.timed(call)

    def wall_timed(self, call: Callable[[], None]) -> float:
        """The wrapped runner's wall-clock timing."""
        return self.inner.wall_timed(call)

    def synchronize(self) -> None:
        """The wrapped runner's."""
        self.inner.synchronize()


def guarded_runner(runner: Runner, env: FloatEnv | None) -> Runner:
    """`runner` under `env`, the environment its build or open left; as is when None."""
    return runner if env is None else GuardedRunner(runner, env)
