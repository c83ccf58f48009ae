"""The executor interface: where the trials of a search run.

The search loop (`routetune.search.loop`) hands an executor jobs and reads back
outcomes; it never sees processes, devices or queues. A trial has a build phase and a
measure phase (`routetune.candidate.candidate`); an executor runs them and may run many at
once, as long as it yields every job's outcome exactly once. Implementations:

- `InlineExecutor`: both phases in this process, one trial at a time. No isolation: a
  crash or a hang of one candidate ends the run. For debugging plugins (``--in-process``).
- `routetune.execution.local_pool.LocalPool`: worker subprocesses on this machine, with
  per-phase timeouts, parallel builds and one measuring worker per GPU (the default).
- a plugin's: Ray's (`routetune.plugins.ray`) spreads trials over a cluster's nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from routetune.candidate.candidate import Candidate
from routetune.candidate.records import BUILT, Outcome, StoredEngine, TrialInputs
from routetune.execution import DEFAULT_TIMEOUT_S
from routetune.records.trial import Confirmation, Status
from routetune.registry import Registry
from routetune.routes.route import Route
from routetune.timing.race import Bar

__all__ = ["NOT_MEASURED", "AfterBuild", "Confirmation", "Executor", "ExecutorSettings",
           "InlineExecutor", "Job", "Outcome", "StoredEngine", "TrialInputs"]


@dataclass(frozen=True)
class Job:
    """One trial to run.

    Args:
        route: The route.
        fingerprint: The trial's fingerprint (it names the trial's log and engine).
        model_steps: The route's graph and precision steps, in order: the part that
            makes its model. A job whose model steps extend a running job's is best
            started after it, to reuse its model.
        bar: The speed-up over the base route it races against (`routetune.timing.race`);
            None for the base route.
    """

    route: Route
    fingerprint: str
    model_steps: Route = Route()
    bar: Bar | None = None

    def extends(self, other: Job) -> bool:
        """Whether `other`'s model steps are a non-empty prefix of this job's."""
        n = len(other.model_steps)
        return n > 0 and self.model_steps.steps[:n] == other.model_steps.steps


AfterBuild = Callable[[Job, Outcome], Outcome | None]
"""Called in the search's process when a built job is about to be measured (in a pool:
once a measuring worker is free for it): returns a final outcome to record instead (a
duplicate of another route's candidate), `NOT_MEASURED` to drop the job unrecorded (the
time budget ran out while it waited; a resumed search builds it again), or None to
measure it."""

NOT_MEASURED = Outcome(Status.SKIPPED, "not measured: the time budget ran out")
"""`AfterBuild`'s answer for a job that must neither be measured nor yielded."""


@dataclass(frozen=True)
class ExecutorSettings:
    """What an executor is made from: the run's options and the backend's devices.

    Args:
        backend: The backend's name (``--backend``).
        gpus: The GPUs that run this backend's engines (``CUDA_VISIBLE_DEVICES`` values,
            `routetune.backend.Backend.gpus`), one measuring worker each; empty when
            the host CPU runs them.
        build_workers: Builds at once (``--build-workers``).
        timeout_s: Seconds each trial phase may take (``--trial-timeout``).
        memory_mb: Address-space limit per worker process in MiB (``--worker-memory``);
            None for none.
        address: The cluster to run on (``--ray-address``); None for the executor's own
            choice.
    """

    backend: str
    gpus: tuple[str, ...] = ()
    build_workers: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int | None = None
    address: str | None = None


class Executor:
    """Runs trials: the interface of every executor (``--executor NAME``).

    Executors are plugins, registered with ``registry.add_executor(cls)`` from a
    ``routetune_register_executors`` hook (`routetune.hookspecs`); the local pool and
    the in-process executor register through it like any other. Subclasses set `name`
    and `summary`, and implement `make`, `start`, `run`, `confirm`, `outputs`,
    `in_flight`, `cancel`, `release` and `close`; `warm_up` is optional. `on_status` is
    called with a line to show while a worker waits for a quiet machine
    (`routetune.timing.conditions`), at most about once a second.
    """

    name: ClassVar[str]
    """The ``--executor`` value."""
    summary: ClassVar[str]
    """One line for ``routetune seasonings``."""
    refuses_worker_options: ClassVar[str | None] = None
    """Why ``--build-workers`` and ``--worker-memory`` do not apply to this executor
    (one line, the fix included); None when they do."""
    cluster: ClassVar[bool] = False
    """Whether it runs trials on a cluster, whose address ``--ray-address`` gives."""

    on_status: Callable[[str], None] = staticmethod(lambda text: None)

    @classmethod
    def make(cls, settings: ExecutorSettings) -> Executor:
        """An executor of this kind for a run.

        Raises:
            UsageError: It cannot run with these settings (no cluster, no GPUs), in one
                line.
        """
        raise NotImplementedError

    def warm_up(self, outdir: Path) -> None:
        """Start workers early, while the search prepares its inputs (default: nothing).

        Args:
            outdir: The output directory the trials will write to.
        """

    def start(self, registry: Registry, inputs: TrialInputs) -> None:
        """Get ready to run trials of `inputs` (start workers, load the model).

        Raises:
            UsageError: This executor cannot run with this registry or these inputs.
        """
        raise NotImplementedError

    def run(self, jobs: Iterator[Job], after_build: AfterBuild) -> Iterator[tuple[Job, Outcome]]:
        """Run jobs and yield each one's final outcome as it is known.

        `jobs` is pulled lazily, only when a job can start, so that its producer can
        apply budgets at the moment a trial would begin. Outcomes may come in any order.
        """
        raise NotImplementedError

    def confirm(self, stored: StoredEngine) -> Confirmation:
        """Re-measure a stored trial against the base route (`Candidate.confirm`).

        In a new worker process, which nothing of the search has touched; where the
        executor has no processes, here.

        Raises:
            BuildError: An engine could not be rebuilt.
            TimeoutError: It ran past the phase timeout.
        """
        raise NotImplementedError

    def outputs(self, stored: StoredEngine) -> list[dict[str, np.ndarray]] | None:
        """A stored trial's outputs on every input set, where engines run (`Candidate.outputs`).

        Returns:
            One mapping of output name to array per input set; None when that device
            cannot run the engine.

        Raises:
            BuildError: The engine could not be rebuilt.
        """
        raise NotImplementedError

    def in_flight(self) -> list[Job]:
        """The jobs started and not yet yielded."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop every job in flight now; they are not yielded. `confirm` still works after."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the search holds (workers, engines) once it is over.

        `confirm` and `outputs` still work after. The measuring worker keeps the base
        route's engine open between trials; the verdict's fresh process must not share
        the machine, or its memory, with it.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Stop every worker and release engines."""
        raise NotImplementedError


class InlineExecutor(Executor):
    """Runs each trial's two phases in this process, one after the other."""

    name = "in-process"
    summary = ("trials in this process, one at a time, without isolation or timeouts "
               "(--in-process; for debugging plugins)")
    refuses_worker_options = ("trials in this process have no workers, timeouts or memory "
                              "limits; drop one or the other")

    def __init__(self) -> None:
        self._candidate: Candidate | None = None
        self._current: Job | None = None

    @classmethod
    def make(cls, settings: ExecutorSettings) -> InlineExecutor:
        """An in-process executor (it takes none of the settings)."""
        return cls()

    def start(self, registry: Registry, inputs: TrialInputs) -> None:
        """Load the plugins' model, backend and reference in this process."""
        self._candidate = Candidate(registry, inputs)

    def run(self, jobs: Iterator[Job], after_build: AfterBuild) -> Iterator[tuple[Job, Outcome]]:
        """Build, then (unless `after_build` stops it) measure each job, one at a time."""
        candidate = self._live()
        for job in jobs:
            self._current = job
            outcome = candidate.build(job.route, job.fingerprint)
            if outcome.status == BUILT:
                outcome = after_build(job, outcome) or candidate.measure(
                    job.route, job.fingerprint, outcome.fields, job.bar)
            self._current = None
            if outcome is not NOT_MEASURED:
                yield job, outcome

    def confirm(self, stored: StoredEngine) -> Confirmation:
        """Re-measure here (no fresh process: ``--in-process``)."""
        return self._live().confirm(stored)

    def outputs(self, stored: StoredEngine) -> list[dict[str, np.ndarray]] | None:
        """Build the engine and run it here."""
        return self._live().outputs(stored)

    def in_flight(self) -> list[Job]:
        """The job being run, if any."""
        return [self._current] if self._current else []

    def cancel(self) -> None:
        """Forget the job being run (its outcome is not yielded)."""
        self._current = None

    def release(self) -> None:
        """Release the base route's engine (`confirm` opens it again when needed)."""
        self.close()

    def close(self) -> None:
        """Release the base route's engine."""
        if self._candidate is not None:
            self._candidate.close()

    def _live(self) -> Candidate:
        if self._candidate is None:
            raise RuntimeError("InlineExecutor.start was not called")
        return self._candidate
