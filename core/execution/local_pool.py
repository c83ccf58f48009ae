"""`LocalPool`: the default executor, worker subprocesses on this machine.

Two kinds of workers, each a ``spawn``-started process (`routetune.execution.worker`) that
keeps its plugins, model and base-route engine loaded between trials:

- build workers (``--build-workers N``) apply routes and build engines;
- measuring workers, one per GPU (``CUDA_VISIBLE_DEVICES`` set to that GPU alone), run,
  check and time engines; one for the host when engines run on the CPU.

Scheduling: builds start in job order while a build worker is free, except that a job
whose model steps extend a running build's (``fp16,ort-cuda-nhwc`` while ``fp16``
builds) waits for it and reuses its model (`Candidate` shares route prefixes on disk);
up to `LOOKAHEAD` later jobs may start meanwhile. Measurement is
serialised per device; whether a built candidate is measured (`AfterBuild`) is decided
once a measuring worker is free for it. When engines run on the host CPU, nothing is built while a
candidate is measured, and measurements go first: a waiting measurement blocks new
builds until the running ones are done (builds would disturb the timing).

Each phase has a timeout (``--trial-timeout``); a phase that runs past it, or a worker
that dies (a signal, ``os.abort``, a segfault), becomes the trial's outcome, ``timed-out``
or ``crashed``, with the exit code or signal and the last lines of the worker's stderr.
The pool (pebble, https://github.com/noxdafox/pebble) then starts a new worker.

Every phase is appended to ``artifacts/timeline.jsonl`` as one JSON object: ``phase``
(``build``, ``measure``, or a final ``confirm``/``outputs`` call), ``route``,
``status``, ``start`` and ``end`` (Unix time, s, taken in the worker; for a dead or
killed worker and for final calls, as the search's process saw them), ``pid`` and
``gpu`` (the measuring worker's GPU, or null).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pebble

from routetune.candidate.records import BUILT, Measured, Outcome, StoredEngine, TrialInputs
from routetune.errors import describe
from routetune.execution import DEFAULT_TIMEOUT_S, worker
from routetune.execution.executor import (
    NOT_MEASURED,
    AfterBuild,
    Executor,
    ExecutorSettings,
    Job,
)
from routetune.execution.handoff import Handoff
from routetune.execution.main_guard import check_main_script
from routetune.execution.scheduling import (
    TIMELINE,
    JobFeed,
    Timeline,
    check_plugins_travel,
    died,
    exit_text,
    log_tail,
    timed_out,
)
from routetune.logs import LOGS
from routetune.records.trial import Confirmation, Status
from routetune.registry import Registry
from routetune.signals import spawning_quietly
from routetune.timing.conditions import STATUS_GLOB, read_statuses

T = TypeVar("T")

__all__ = ["TIMELINE", "LocalPool", "exit_text"]

_SPAWN = multiprocessing.get_context("spawn")


class LocalPool(Executor):
    """Build and measuring workers on this machine (``--executor local``, the default).

    Args:
        build_workers: Builds run at once (processes).
        gpus: One ``CUDA_VISIBLE_DEVICES`` value per measuring worker; empty when
            engines run on the host CPU (one measuring worker, never alongside a build).
        timeout_s: Seconds each phase of a trial may run, counted from when it is handed
            to a worker (a worker started after a crash loads its libraries, about 2 s,
            within that time).
        memory_mb: An address-space limit per worker in MiB (``RLIMIT_AS``), or None.
            GPU runtimes reserve much address space; leave it unset for GPU backends.
    """

    name = "local"
    summary = ("worker processes on this machine: parallel builds, one measuring worker "
               "per GPU, per-phase timeouts")

    def __init__(self, build_workers: int = 1, gpus: Sequence[str] = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int | None = None) -> None:
        self.build_workers = build_workers
        self.gpus = tuple(gpus)
        self.exclusive = not self.gpus
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._inputs: TrialInputs | None = None
        self._handoff: Handoff | None = None  # serves the inputs to the workers
        self._builders: pebble.ProcessPool | None = None
        self._measurers: list[pebble.ProcessPool] = []
        self._running: dict[concurrent.futures.Future[Any], Job] = {}
        self._scheduled: dict[concurrent.futures.Future[Any], float] = {}

    @classmethod
    def make(cls, settings: ExecutorSettings) -> LocalPool:
        """Worker processes for a run's settings."""
        return cls(settings.build_workers, settings.gpus, settings.timeout_s,
                   settings.memory_mb)

    def warm_up(self, outdir: Path) -> None:
        """Start the workers now; they load their libraries and wait for `start`."""
        check_main_script()  # each worker runs it again
        artifacts = outdir / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        for stale in artifacts.glob(STATUS_GLOB):  # a killed run's (we hold the folder)
            stale.unlink(missing_ok=True)
        self._handoff = Handoff()
        self._spawn()

    def start(self, registry: Registry, inputs: TrialInputs) -> None:
        """Hand the workers their inputs (starting them, unless `warm_up` did)."""
        check_plugins_travel(registry)
        self._inputs = inputs
        if self._handoff is None:
            self.warm_up(inputs.outdir)
        assert self._handoff is not None
        self._handoff.give(inputs)

    def _pool(self, size: int, gpu: str | None) -> pebble.ProcessPool:
        """`size` workers, started now, that get their inputs from the handoff.

        `gpu` is for measuring workers. Callers start it within
        `signals.spawning_quietly`, so that they start with Ctrl-C blocked, as do the
        workers that pebble's threads start later in their place; and they keep the pool
        before that block ends, since a stop held back meanwhile is raised at its end
        and `cancel` must find the pool to stop its workers.
        """
        assert self._handoff is not None
        pool = pebble.ProcessPool(
            size, initializer=worker.init, context=_SPAWN,
            initargs=(self._handoff.address, self._handoff.key, gpu,
                      None if gpu else self.memory_mb, self.timeout_s))
        pool.schedule(worker.ping)  # pebble starts a pool, and its threads, lazily
        return pool

    def _spawn(self) -> None:
        with spawning_quietly():
            self._builders = self._pool(self.build_workers, None)
            self._measurers = [self._pool(1, gpu) for gpu in self.gpus or (None,)]

    def run(self, jobs: Iterator[Job], after_build: AfterBuild) -> Iterator[tuple[Job, Outcome]]:
        """Schedule builds and measurements as described in the module docstring."""
        builds: dict[concurrent.futures.Future[Any], Job] = {}
        measuring: dict[concurrent.futures.Future[Any], tuple[Job, Outcome, int]] = {}
        waiting: deque[tuple[Job, Outcome]] = deque()
        decided: deque[tuple[Job, Outcome]] = deque()  # built, not to be measured
        free = list(range(len(self._measurers)))
        feed = JobFeed(jobs)
        while True:
            while waiting and free and not (self.exclusive and builds):
                job, built = waiting.popleft()
                final = after_build(job, built)
                if final is not None:
                    if final is not NOT_MEASURED:
                        decided.append((job, final))
                    continue
                slot = free.pop(0)
                future = self._measurers[slot].schedule(
                    worker.measure, (job.route, job.fingerprint, built.fields, self._log(job),
                                     job.bar),
                    timeout=self.timeout_s)
                measuring[future] = (job, built, slot)
                self._running[future] = job
                self._scheduled[future] = time.time()
            while decided:
                yield decided.popleft()
            while not feed.exhausted() and len(builds) < self.build_workers and not (
                    self.exclusive and (measuring or waiting)):
                ready = feed.next_ready(builds.values())
                if ready is None:
                    break
                assert self._builders is not None
                future = self._builders.schedule(
                    worker.build, (ready.route, ready.fingerprint, self._log(ready)),
                    timeout=self.timeout_s)
                builds[future] = ready
                self._running[future] = ready
                self._scheduled[future] = time.time()
            if not builds and not measuring:
                if waiting or feed.pending:
                    continue
                return
            done, _ = concurrent.futures.wait([*builds, *measuring], timeout=1.0,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            self._poll_status()
            for finished in sorted(done, key=lambda f: self._running[f].fingerprint):
                job = self._running.pop(finished)
                if finished in builds:
                    del builds[finished]
                    outcome = self._outcome(finished, job, "build", {}, None)
                    if outcome.status == BUILT:
                        waiting.append((job, outcome))
                        continue
                else:
                    _, built, slot = measuring.pop(finished)
                    free.append(slot)
                    outcome = self._outcome(finished, job, "measure", built.fields,
                                            (self.gpus or (None,))[slot])
                yield job, outcome

    def confirm(self, stored: StoredEngine) -> Confirmation:
        """Re-measure in a new worker process on the first measuring worker's GPU.

        It is stopped after; on the CPU, no build runs meanwhile (this is called between
        batches).
        """
        return self._on_measurer(worker.confirm, stored, fresh=True)

    def outputs(self, stored: StoredEngine) -> list[dict[str, np.ndarray]] | None:
        """Build the engine and run it on the first measuring worker."""
        return self._on_measurer(worker.outputs, stored, fresh=False)

    def _on_measurer(self, task: Callable[[StoredEngine, Path], T], stored: StoredEngine,
                     fresh: bool) -> T:
        """Run `task` on the first measuring worker, or, with `fresh`, a new one."""
        method = task.__name__
        log = self._outdir / LOGS / f"{method}.log"
        gpu = (self.gpus or (None,))[0]
        start = time.time()
        pool = None
        try:
            if fresh:
                with spawning_quietly():
                    pool = self._pool(1, gpu)
            else:
                if not self._measurers:  # released, or never started
                    self._spawn()
                pool = self._measurers[0]
            future = pool.schedule(task, (stored, log), timeout=self.timeout_s)
            while not concurrent.futures.wait([future], timeout=1.0)[0]:
                self._poll_status()
            result: T = future.result()
            return result
        finally:
            if fresh and pool is not None:
                pool.stop()
                pool.join()
            self._event({"phase": method, "route": stored.route,
                         "status": None, "start": start, "end": time.time(), "pid": None,
                         "gpu": gpu})

    def _poll_status(self) -> None:
        """Pass on what a worker waiting for a quiet machine says (`on_status`)."""
        statuses = read_statuses(self._outdir / "artifacts")
        if statuses:
            self.on_status(statuses[0])

    @property
    def _outdir(self) -> Path:
        """The run's output directory (`start` has given the inputs)."""
        assert self._inputs is not None, "LocalPool.start first"
        return self._inputs.outdir

    def in_flight(self) -> list[Job]:
        """The jobs whose phase is running on a worker."""
        return sorted(self._running.values(), key=lambda j: str(j.route))

    def cancel(self) -> None:
        """Kill every worker (in-flight jobs are dropped); `call` starts new ones."""
        for pool in [self._builders, *self._measurers]:
            if pool is not None:
                pool.stop()
                pool.join()
        self._builders, self._measurers = None, []
        self._running.clear()

    def release(self) -> None:
        """Stop the search's workers; `call` starts what it needs."""
        self.cancel()

    def close(self) -> None:
        """Stop and join every worker, and stop serving the inputs."""
        self.cancel()
        if self._handoff is not None:
            self._handoff.close()

    def _log(self, job: Job) -> Path:
        return self._outdir / LOGS / f"{job.fingerprint[:16]}.log"

    def _outcome(self, future: concurrent.futures.Future[Any], job: Job, phase: str,
                 fields: Measured, gpu: str | None) -> Outcome:
        """The phase's outcome, or the trial's ``crashed``/``timed-out`` record."""
        start, end, pid = self._scheduled.pop(future), time.time(), None
        try:
            outcome, start, end, pid = future.result()
        except concurrent.futures.TimeoutError:
            pid = self._pid(job)
            outcome = timed_out(phase, self.timeout_s, fields, self._tail(job))
        except pebble.ProcessExpired as e:
            pid = e.pid or self._pid(job)
            outcome = died(phase, exit_text(e.exitcode), fields, self._tail(job))
        except Exception as e:  # the task itself raised (the worker could not start)
            outcome = Outcome(Status.CRASHED, f"{phase}: {describe(e)}", fields)
        self._event({"phase": phase, "route": str(job.route), "status": outcome.status,
                     "start": start, "end": end, "pid": pid, "gpu": gpu})
        return outcome

    def _event(self, event: dict[str, Any]) -> None:
        """Append one phase to the timeline."""
        Timeline(self._outdir).add(event)

    def _pid(self, job: Job) -> int | None:
        """The pid in the trial log's last header line (``== 12:00:00 pid 123: …``)."""
        try:
            header = self._log(job).read_text(errors="replace").rsplit("\n== ", 1)[-1]
            return int(header.split(" pid ", 1)[1].split(":", 1)[0])
        except (OSError, IndexError, ValueError):
            return None

    def _tail(self, job: Job) -> str:
        """What the worker wrote to the trial's log in its last phase (`log_tail`)."""
        log = self._log(job)
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return ""
        return log_tail(text, f"log {LOGS / log.name}")
