"""The executor interface: where the trials of a search run.

The search loop (`routetune.search.loop`) hands an executor jobs and reads back
outcomes; it never sees processes, devices or queues. A trial has a build phase and a
measure phase (`routetune.search.candidate`); an executor runs them and may run many at
once, as long as it yields every job's outcome exactly once. Implementations:

- `InlineExecutor`: both phases in this process, one trial at a time. No isolation: a
  crash or a hang of one candidate ends the run. For debugging plugins (``--in-process``).
- `routetune.search.local_pool.LocalPool`: worker subprocesses on this machine, with
  per-phase timeouts, parallel builds and one measuring worker per GPU (the default).

A cluster executor (Ray) implements the same four methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routetune.registry import Registry
from routetune.route import Route
from routetune.search.candidate import Candidate
from routetune.search.phases import BUILT, Outcome, TrialInputs
from routetune.trial import Status


@dataclass(frozen=True)
class Job:
    """One trial to run.

    Args:
        route: The route.
        fingerprint: The trial's fingerprint (it names the trial's log and engine).
        model_steps: The route's graph and precision steps, in order: the part that
            makes its model. A job whose model steps extend a running job's is best
            started after it, to reuse its model.
    """

    route: Route
    fingerprint: str
    model_steps: Route = Route()

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


class Executor:
    """Runs trials.

    Subclasses implement `start`, `run`, `call`, `in_flight`, `cancel` and `close`;
    `warm_up` is optional. `on_status` is called with a line to show while a worker
    waits for a quiet machine (`routetune.conditions`), at most about once a second.
    """

    on_status: Callable[[str], None] = staticmethod(lambda text: None)

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

    def call(self, method: str, *args: Any, fresh: bool = False) -> Any:
        """Run a `Candidate` method (``confirm``, ``outputs``) where engines are timed.

        Args:
            method: The method's name.
            *args: Its arguments.
            fresh: Run it in a new worker process, which nothing of the search has
                touched (a confirmation); where the executor has no processes, here.

        Raises:
            Exception: Whatever the method raised; `BuildError` among them.
        """
        raise NotImplementedError

    def in_flight(self) -> list[Job]:
        """The jobs started and not yet yielded."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop every job in flight now; they are not yielded. `call` still works after."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the search holds (workers, engines) once it is over; `call` still works.

        The measuring worker keeps the base route's engine open between trials; the
        verdict's fresh process must not share the machine, or its memory, with it.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Stop every worker and release engines."""
        raise NotImplementedError


class InlineExecutor(Executor):
    """Runs each trial's two phases in this process, one after the other."""

    def __init__(self) -> None:
        self._candidate: Candidate | None = None
        self._current: Job | None = None

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
                    job.route, job.fingerprint, outcome.fields)
            self._current = None
            if outcome is not NOT_MEASURED:
                yield job, outcome

    def call(self, method: str, *args: Any, fresh: bool = False) -> Any:
        """Run the `Candidate` method here (no fresh process: ``--in-process``)."""
        return getattr(self._live(), method)(*args)

    def in_flight(self) -> list[Job]:
        """The job being run, if any."""
        return [self._current] if self._current else []

    def cancel(self) -> None:
        """Forget the job being run (its outcome is not yielded)."""
        self._current = None

    def release(self) -> None:
        """Release the base route's engine (`call` opens it again when needed)."""
        self.close()

    def close(self) -> None:
        """Release the base route's engine."""
        if self._candidate is not None:
            self._candidate.close()

    def _live(self) -> Candidate:
        if self._candidate is None:
            raise RuntimeError("InlineExecutor.start was not called")
        return self._candidate
