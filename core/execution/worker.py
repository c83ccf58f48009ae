"""What runs inside a worker subprocess of `routetune.execution.local_pool.LocalPool`.

Workers are started with ``spawn``, never ``fork``: CUDA contexts and ONNX Runtime
thread pools must not be inherited. `init` runs once per worker; each task then runs one
phase of one trial on the worker's `Candidate`, with the worker's stdout and stderr (file
descriptors 1 and 2, so C libraries' output too) appended to the trial's log,
``artifacts/logs/<fingerprint[:16]>.log``. `faulthandler` writes a Python traceback
there when the worker dies of a signal, and the pool reads the log's tail into the
trial's reason.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from routetune.candidate.candidate import Candidate
from routetune.candidate.records import Built, Measured, Outcome, StoredEngine
from routetune.errors import describe
from routetune.execution.handoff import Address, receive
from routetune.logs import captured
from routetune.records.trial import Confirmation, Status
from routetune.routes.route import Route
from routetune.timing.race import Bar

_candidate: Candidate | None = None
_failed: BaseException | None = None
_memory_mb: int | None = None
_timeout_s: float | None = None

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when its parent dies (Linux)."""


def init(address: Address, key: bytes, gpu: str | None, memory_mb: int | None,
         timeout_s: float | None = None) -> None:
    """Set up a worker: signals, device, plugins, then the model, then the memory limit.

    Workers start before the search's process has its inputs ready (the FP32 reference
    outputs, the base pipeline), so that both load their libraries at once: a worker
    then waits for its `TrialInputs` from the search's `Handoff` (in memory, never a
    file).

    Args:
        address: The handoff's socket.
        key: The handoff's authentication key.
        gpu: The value of ``CUDA_VISIBLE_DEVICES`` for this worker (one GPU), or None.
        memory_mb: An address-space limit (``RLIMIT_AS``) in MiB, set after start-up,
            so that a runaway allocation raises `MemoryError` instead of taking the
            machine; None for none.
        timeout_s: The pool's per-phase timeout; half a second before it, the worker
            writes every thread's Python stack to the trial's log.
    """
    global _candidate, _failed, _memory_mb, _timeout_s
    _memory_mb, _timeout_s = memory_mb, timeout_s
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked at spawn (signals)
    _die_with_parent()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    faulthandler.enable()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        from routetune.plugin_manager import load_registry

        registry = load_registry()
        _candidate = Candidate(registry, receive(address, key))
    except BaseException as e:  # told with every task: the pool reports it per trial
        _failed = e
    if memory_mb is not None:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


Timed = tuple[Outcome, float, float, int]
"""A phase's outcome, its start and end (Unix time, s) and the worker's pid."""


def ping() -> None:
    """Nothing: scheduled once per pool so that its workers start at once."""


def build(route: Route, fingerprint: str, log: Path) -> Timed:
    """The build phase of one trial (`Candidate.build`)."""
    return run_phase(log, f"build {route}", {}, lambda: _live().build(route, fingerprint),
                     _timeout_s, _memory_mb)


def measure(route: Route, fingerprint: str, built: Built, log: Path,
            bar: Bar | None = None) -> Timed:
    """The measure phase of one trial (`Candidate.measure`), racing against `bar`."""
    return run_phase(log, f"measure {route}", built,
                     lambda: _live().measure(route, fingerprint, built, bar), _timeout_s,
                     _memory_mb)


def run_phase(log: Path, what: str, fields: Built, run: Callable[[], Outcome],
              timeout_s: float | None = None, memory_mb: int | None = None,
              restore: bool = False) -> Timed:
    """Run a phase with its output in `log`; a Python stack dump there before a timeout.

    Whatever the phase raises, even `SystemExit` or `KeyboardInterrupt` from plugin
    code (this worker ignores Ctrl-C), becomes a ``crashed`` outcome.

    Args:
        log: The trial's log (appended).
        what: The log's header for this phase (``build fp16``).
        fields: The trial's fields so far, kept in a ``crashed`` outcome.
        run: The phase.
        timeout_s: The executor's per-phase timeout (s): half a second before it, every
            thread's Python stack is written to `log`; None for none.
        memory_mb: The worker's ``--worker-memory`` (MiB), named in an out-of-memory
            reason; None for none.
        restore: Give the process its stdout and stderr back after the phase
            (`routetune.logs.captured`).
    """
    with captured(log, what, restore=restore):
        t0 = time.time()
        if timeout_s is not None and timeout_s > 1:  # where it hung, for the reason
            faulthandler.dump_traceback_later(timeout_s - 0.5)
        try:
            outcome = run()
        except BaseException as e:
            outcome = Outcome(Status.CRASHED, describe(e, where=True), Measured(**fields))
        finally:
            faulthandler.cancel_dump_traceback_later()
        if memory_mb is not None and "out of memory" in outcome.reason:
            outcome = replace(outcome, reason=f"{outcome.reason} (limit: --worker-memory "
                                              f"{memory_mb} MiB; raise it)")
        return outcome, t0, time.time(), os.getpid()


def confirm(stored: StoredEngine, log: Path) -> Confirmation:
    """`Candidate.confirm` in this worker, its output to `log`."""
    with captured(log, "confirm", restore=False):
        return _live().confirm(stored)


def outputs(stored: StoredEngine, log: Path) -> list[dict[str, np.ndarray]] | None:
    """`Candidate.outputs` in this worker, its output to `log`."""
    with captured(log, "outputs", restore=False):
        return _live().outputs(stored)


def _live() -> Candidate:
    if _candidate is None:
        raise RuntimeError(f"the worker could not start: {type(_failed).__name__}: {_failed}")
    return _candidate


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the search process dies (kill -9 included)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the line above
            os._exit(1)
