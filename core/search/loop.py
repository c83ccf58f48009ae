"""The search loop: ask the strategy for routes, run them on an executor, store trials.

The loop owns everything a strategy must not do: budgets, persistence, deduplication,
and the order in which results are told. The executor (`routetune.execution.executor`)
builds, checks and times candidates, in worker processes by default; a failure inside
one candidate becomes that trial's status and reason, and the search goes on.

A batch of routes from `Strategy.ask` may run in parallel, but the strategy is told the
trials in the batch's order once the batch is done, so the search takes the same path
whatever the number of workers.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

import routetune
from routetune.backend import Backend
from routetune.candidate.candidate import with_preflight
from routetune.candidate.records import (
    BUILT,
    Measured,
    Outcome,
    Recorded,
    StoredEngine,
    TrialInputs,
    TrialSettings,
)
from routetune.execution.executor import NOT_MEASURED, Executor, InlineExecutor, Job
from routetune.judging.accuracy import Constraint
from routetune.judging.judge import judged
from routetune.logs import LOGS, captured
from routetune.model.loading import PreparedModel, sha256
from routetune.records.store import FULL, TrialStore, full_disk
from routetune.records.trial import Confirmation, Status, Trial
from routetune.refinement import Refinement
from routetune.registry import Registry
from routetune.routes.route import Route, Step
from routetune.search.coarser import Coarser, coarser_reason
from routetune.search.leader import Leader
from routetune.search.same_engine import SameEngine, same_engine_reason, same_kernels_reason
from routetune.search.strategy import Result, Strategy
from routetune.signals import interrupted
from routetune.timing.race import Bar

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Budget:
    """When to stop a search early.

    Args:
        max_trials: Trials at most, the base route included; None for no limit.
        time_s: Wall-clock seconds at most; None for no limit.
    """

    max_trials: int | None = None
    time_s: float | None = None


class SearchLoop:
    """Runs the routes of one model, backend, input set and constraint, and stores them.

    Args:
        registry: The installed plugins.
        model: The prepared model.
        backend: The backend that builds and runs engines.
        feeds: The validation input sets.
        references: The reference outputs, one mapping per input set.
        constraint: The accuracy constraint.
        store: The trial store.
        outdir: The output directory; candidate models go under ``artifacts/``.
        settings: What the candidates' work takes of the run's options (how long to
            time, the build options every route starts from, the busy-machine policy);
            it goes to the workers with the inputs.
        settings_hash: sha256 of the inputs, constraint and measurement settings.
        reference: The backend that runs models in FP32 for precision seasonings
            (`Backend.evaluate`); None for none.
        refinements: The refinements of the seasonings offered, called after each batch
            (`routetune.refinement`), such as precision-repair's. Their trials
            are stored and compete for the win, but are not told to the strategy.
        base: Graph and precision steps applied to every route, the base route
            included (a recipe's ``base``), after the backend's preflight (the pinned prefix).
        executor: Where trials run; default: this process (`InlineExecutor`). The loop
            starts it, and `close` closes it.
        floor: A bar every candidate races against at least (`Leader`): in a search over
            several backends, another backend's base route; None for none.
        pace_ms: The base route's p50 (ms) timed just before this search on a quiet
            machine (`TrialInputs.pace_ms`), or None.

    Raises:
        SeasoningError: A preflight or pinned-prefix step failed; no route can be built.
        UsageError: The executor cannot run these plugins.
    """

    def __init__(
        self,
        registry: Registry,
        model: PreparedModel,
        backend: Backend,
        feeds: Sequence[Mapping[str, np.ndarray]],
        references: Sequence[Mapping[str, np.ndarray]],
        constraint: Constraint,
        store: TrialStore,
        outdir: Path,
        settings: TrialSettings,
        settings_hash: str,
        reference: Backend | None = None,
        refinements: Sequence[Refinement] = (),
        base: Route | None = None,
        executor: Executor | None = None,
        floor: Bar | None = None,
        pace_ms: float | None = None,
    ) -> None:
        self.registry = registry
        self.model = model
        self.backend = backend
        self.store = store
        self.outdir = outdir
        self.settings_hash = settings_hash
        self.refinements = tuple(refinements)
        self.stopped: str | None = None
        """Why the last `run` stopped before the strategy was done, or None."""
        self._deadline: float | None = None  # `time.monotonic()` when the time budget ends
        self._unmeasured: list[str] = []  # routes built, then dropped at the deadline
        self.device = backend.device()
        self.versions = _versions(backend)
        self.constraint = constraint
        inputs = TrialInputs(model, backend.name, backend.profile, tuple(feeds),
                             tuple(references),
                             constraint.tolerance_map(list(references[0]) if references else []),
                             outdir, model.data, settings, reference=reference is not None,
                             task_params=constraint.task_params(), constraint=constraint,
                             pace_ms=pace_ms)
        with captured(outdir / LOGS / "base.log", "preflight"):
            local, self.base_passes = with_preflight(registry, inputs, backend, reference,
                                                         list(base or Route()))
        self.inputs = local.inputs
        self.executor = executor or InlineExecutor()
        self.executor.start(registry, self.inputs)
        ours = [t for t in store.trials() if t.status != Status.SKIPPED
                and (t.model_sha256, t.backend, t.device, t.settings_hash) == self._key()]
        self._candidates = {t.candidate_sha256: t.route for t in ours if t.candidate_sha256}
        self._runtime = sorted(k for k, spec in backend.options().items() if spec.runtime)
        self._engines = {self._engine_key(t.engine_sha256, t.settings): t.route
                         for t in ours if t.engine_sha256}
        self._kernels: dict[str, list[Route]] = {}  # routes measured, by `Engine.kernels`
        self.leader = Leader(settings.min_speedup, settings.busy_machine, floor)
        self.busy_machine = settings.busy_machine
        self.pace_ms = pace_ms  # the base route's fastest quiet p50 (`_keep_pace`)
        self.same_engine = SameEngine(lambda name: registry.seasoning(name).info.stage,
                                      len(self.base_passes))
        for t in ours:
            if t.passes:
                self.same_engine.learn(t.steps, t.passes)
        self.coarser = Coarser(lambda name: registry.seasoning(name).info.params)
        for t in ours:
            if t.status == Status.ACCURACY_FAILED:
                self.coarser.failed(t.steps)

    def _key(self) -> tuple[str, str, str, str]:
        return (self.model.source_sha256, self.backend.name, self.device, self.settings_hash)

    def fingerprint(self, route: Route) -> str:
        """The trial's cache key: model, route, backend and version, device, settings."""
        parts = [*self._key(), str(route), self.backend.version(), routetune.__version__]
        return sha256(json.dumps(parts).encode())

    def run(
        self,
        strategy: Strategy,
        budget: Budget,
        on_trial: Callable[[Trial, bool], None] = lambda trial, cached: None,
        pinned: Sequence[Route] = (),
    ) -> list[Trial]:
        """Measure the base route, the pinned routes, then every route the strategy asks for.

        Args:
            strategy: The search strategy.
            budget: Trial and time limits: once one is reached no trial starts, the
                trials running finish, and the best so far stands. Past the time
                budget, a candidate built but not yet measuring is dropped unrecorded
                (a resumed search builds it again), and `stopped` counts them; the base
                route is measured whatever the budget, as every verdict needs it.
            on_trial: Called after each trial with the trial and whether it came from
                the store.
            pinned: Routes always tried, right after the base route (a recipe's
                ``routes``); told to the strategy like its own.

        Returns:
            Every trial of this search, the base route's first. Ctrl-C (SIGINT) stops it
            like a budget, except that the trials in flight are cancelled (not stored,
            so a resumed search redoes them) and named in `stopped`.

        Raises:
            KeyboardInterrupt: Ctrl-C before the base route was measured.
        """
        started = time.monotonic()
        trials: list[Trial] = []
        seen: set[str] = set()
        self.stopped = None
        self._deadline = None if budget.time_s is None else started + budget.time_s
        self._unmeasured = []

        running = [0]  # trials admitted and not yet done
        admitted: list[float] = []  # when each trial running was admitted, in order
        longest = [0.0]  # the longest candidate so far, admission to result, less waiting (s)

        def admit() -> bool:
            """Whether one more trial may start now; says why not in `stopped`.

            Under a time budget, a candidate starts only if the time left is at least
            what the longest candidate of this search took so far, less the time it
            waited for a quiet machine (`--busy-machine wait`): one started later
            would most likely be built past the deadline and dropped unmeasured, its
            build wasted (a transformer optimizer's build of a BERT takes about 45 s on
            the H200's host).
            """
            now = time.monotonic()
            left = None if budget.time_s is None else budget.time_s - (now - started)
            if budget.max_trials is not None and len(trials) + running[0] >= budget.max_trials:
                self.stopped = f"--max-trials {budget.max_trials} reached"
            elif left is not None and left <= 0:
                self.stopped = f"--time-budget {budget.time_s:g} s reached"
            elif left is not None and trials and left < longest[0]:
                self.stopped = (f"--time-budget {budget.time_s:g} s nearly reached: {left:.0f} "
                                f"s left, less than the longest trial took ({longest[0]:.0f} "
                                "s, any wait for quiet left out), so none more started")
            else:
                running[0] += 1
                admitted.append(now)
                return True
            return False

        def done(trial: Trial, cached: bool) -> None:
            """Keep a trial as soon as it is known: a Ctrl-C mid-batch loses none."""
            running[0] -= 1
            if admitted:
                took = time.monotonic() - admitted.pop(0)
                waited = trial.conditions.get("waited_s") if trial.conditions else None
                if not trial.steps.is_base:  # the base route's time holds worker start-up
                    # its own work: a wait for quiet says nothing of the next one's cost
                    longest[0] = max(longest[0], took - (
                        waited if isinstance(waited, (int, float)) else 0.0))
            if trial.fingerprint not in seen:  # a pinned route the strategy asks again
                seen.add(trial.fingerprint)
                trials.append(trial)
            on_trial(trial, cached)

        def also(trial: Trial) -> None:
            """Keep a trial that no admitted route stands for: a route's shortest equal."""
            if trial.fingerprint not in seen:
                seen.add(trial.fingerprint)
                trials.append(trial)
                on_trial(trial, False)

        def visit(routes: Sequence[Route], tell: bool = True, pinned: bool = False
                  ) -> list[Trial]:
            """Run routes (in parallel where the executor can); their trials in order.

            The strategy is told them in the batch's order once the batch is done.
            Pinned routes are built whatever failed before them.
            """
            running[0] = 0
            admitted.clear()
            finished = self.evaluate(routes, admit, done, also, rule_out=not pinned)
            ordered = []
            for route in routes:
                if route not in finished:
                    break
                ordered.append(finished[route])
                if tell:
                    strategy.tell(route, Result.of(finished[route], self.busy_machine))
            return ordered

        try:
            self._search(strategy, visit, trials, pinned)
            if self._unmeasured:
                self.stopped = (f"--time-budget {budget.time_s:g} s reached; "
                                f"{len(self._unmeasured)} built, not measured ("
                                "measured on resume): " + ", ".join(self._unmeasured[:5])
                                + (" …" if len(self._unmeasured) > 5 else ""))
        except KeyboardInterrupt:
            cancelled = self.executor.in_flight()
            self.executor.cancel()
            if not trials:  # not even the base route: nothing to stand on
                raise
            self.stopped = f"interrupted ({interrupted()}): no new trials"
            if cancelled:
                self.stopped += (f"; cancelled {len(cancelled)} in flight (redone on resume): "
                                 + ", ".join(str(j.route) for j in cancelled))
        finally:
            self._deadline = None
        return trials

    def _search(self, strategy: Strategy, visit: Callable[..., list[Trial]],
                trials: list[Trial], pinned: Sequence[Route]) -> None:
        """The base route, the pinned routes, the strategy's batches and refinements."""
        if not visit([Route()]):
            return
        extra = [route for route in pinned if not route.is_base]
        if len(visit(extra, pinned=True)) < len(extra):
            return
        if self.leader.floor is not None:
            strategy.aim(self.leader.floor.speedup)
        while batch := strategy.ask():
            done = list(zip(batch, visit(batch), strict=False))
            if len(done) < len(batch):
                return
            for refinement in self.refinements:
                refinement.after_batch(
                    done, lambda r: next(iter(visit([r], tell=False)), None),
                    lambda r, why: trials.append(self.record_skipped(r, why)),
                    self.leader.bar())
                if self.stopped:
                    return

    def evaluate(self, routes: Sequence[Route], admit: Callable[[], bool] = lambda: True,
                 on_trial: Callable[[Trial, bool], None] = lambda trial, cached: None,
                 also: Callable[[Trial], None] = lambda trial: None,
                 rule_out: bool = True) -> dict[Route, Trial]:
        """Return the stored trials of `routes`, and run and store the others.

        A route whose steps are known to change nothing where they stand
        (`routetune.search.same_engine`) is not built: once its shortest equal route
        has a trial, it is recorded as that engine (``skipped``). One built before that
        was known is measured under its shortest equal's name, and recorded as it. With
        `rule_out`, a route that quantizes more coarsely than one that failed the
        accuracy constraint (`routetune.search.coarser`) is recorded ``skipped``, not
        built.

        Args:
            routes: The routes, in order.
            admit: Asked before each route in order, stored or not; once it says no,
                no later route starts.
            on_trial: Called as each route's trial is known, with whether it came from
                the store.
            also: Called with a trial no route of `routes` stands for: the shortest
                equal of one, measured in its place.
            rule_out: Whether a coarser quantization of a failed route is not built
                (False for a recipe's pinned routes: built as asked).

        Returns:
            The trial of each route admitted, by route; a prefix of `routes` in order.
        """
        done: dict[Route, Trial] = {}

        def jobs() -> Iterator[Job]:
            for route in routes:
                if route in done or not admit():
                    return
                fingerprint = self.fingerprint(route)
                stored = self.store.get(fingerprint)
                cached = stored is not None
                if stored is None:  # a route known to be a shorter one's engine: no job
                    stored = self._as_measured(route, done)
                finer = None if stored is not None or not rule_out else self.coarser.finer(
                    route)
                if finer is not None:  # a finer quantization failed: not built
                    stored = self.store.add(self._record(
                        route, fingerprint, Status.SKIPPED, coarser_reason(*finer)))
                if stored is not None:
                    stored = self.leader.consider(judged(stored, self.constraint))
                    done[route] = stored
                    on_trial(stored, cached)
                else:
                    yield Job(route, fingerprint, Route(tuple(
                        s for s in route
                        if self.registry.seasoning(s.name).info.stage != "build")),
                        None if route.is_base else self.leader.bar())

        for job, outcome in self.executor.run(jobs(), self._after_build):
            assert outcome.status != BUILT
            route, fingerprint, fields = job.route, job.fingerprint, Measured(**outcome.fields)
            fields.pop("engine_kernels", None)  # compared while the search runs, not stored
            if outcome.status == Status.CRASHED and (
                    FULL in outcome.reason or "No space left on device" in outcome.reason):
                # a full disk: every trial after it would crash alike, so the search
                # stops, and this one is not stored, so that a rerun runs it
                raise full_disk(self.store.path.parent / "artifacts",
                                OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            shortest, dropped = self.same_engine.shortest(route)
            if dropped and outcome.status != Status.SKIPPED:  # measured in its place
                fields["passes"] = self.same_engine.passes_of(route, fields.get("passes", ()),
                                                              dropped)
                measured = self.store.get(self.fingerprint(shortest)) or self.store.add(judged(
                    self._record(shortest, self.fingerprint(shortest), outcome.status,
                                 outcome.reason, **fields), self.constraint))
                also(self.leader.consider(self._keep_pace(measured)))
                trial = self._same_as(route, shortest, dropped, measured)
            else:
                trial = self.leader.consider(self._keep_pace(self.store.add(judged(
                    self._record(route, fingerprint, outcome.status, outcome.reason,
                                 **fields), self.constraint))))
            logger.info("%s: %s %s", route, trial.status, trial.reason)
            if trial.status == Status.ACCURACY_FAILED:
                self.coarser.failed(trial.steps)
            done[route] = trial
            on_trial(trial, False)
        return {route: done[route] for route in routes if route in done}

    def _keep_pace(self, trial: Trial) -> Trial:
        """`trial`; its base route figure, measured on a quiet machine, may lower `pace_ms`.

        The pace is the base route's fastest quiet p50 in this run: the side-by-side
        loop's before the search (`TrialInputs.pace_ms`), the base trial's, or a later
        trial's base route figure below them, as the workers keep it
        (`routetune.candidate.pairing.PairedTiming.watched`): a base trial timed while
        the host had a vCPU away gives way. A confirmation times the base route alone
        when its figure there is slower than this pace: a machine that runs it slower
        than in the search is slower than it was (`routetune.timing.conditions.pace_note`).
        """
        figure = trial.latency if trial.steps.is_base else trial.base_latency
        if figure is not None and not trial.noisy and (
                self.pace_ms is None or figure.p50 < self.pace_ms):
            self.pace_ms = figure.p50
        return trial

    def _as_measured(self, route: Route, done: Mapping[Route, Trial]) -> Trial | None:
        """The route recorded as its shortest equal's engine, when that has a trial."""
        shortest, dropped = self.same_engine.shortest(route)
        if not dropped:
            return None
        measured = done.get(shortest) or self.store.get(self.fingerprint(shortest))
        return None if measured is None else self._same_as(route, shortest, dropped, measured)

    def _same_as(self, route: Route, shortest: Route, dropped: Sequence[Step],
                 measured: Trial) -> Trial:
        """Store `route` as `measured`'s engine: ``skipped``, with no figure of its own."""
        fields = Measured(candidate_sha256=measured.candidate_sha256 or "")
        if measured.engine_sha256:
            fields["engine_sha256"] = measured.engine_sha256
        return self.store.add(self._record(route, self.fingerprint(route), Status.SKIPPED,
                                           same_engine_reason(shortest, dropped), **fields))

    def _after_build(self, job: Job, built: Outcome) -> Outcome | None:
        """Stop a candidate that is another route's model and settings, or its engine.

        The same engine: an equal engine sha256 (`Engine.sha256`: TensorRT-RTX builds one
        plan for several optimisation levels, say; OpenVINO resolves a property to its
        value already) with equal run-time options (`OptionSpec.runtime`); timing it
        again would only measure noise. `NOT_MEASURED` past the time budget's
        deadline, unless it is the base route. Else None: the candidate is measured.
        """
        if (self._deadline is not None and time.monotonic() >= self._deadline
                and not job.route.is_base):  # every verdict needs the base route
            self._unmeasured.append(str(job.route))
            return NOT_MEASURED
        self.same_engine.learn(job.route, built.fields.get("passes", ()))
        shortest, dropped = self.same_engine.shortest(job.route)
        measured = self.store.get(self.fingerprint(shortest)) if dropped else None
        if measured is not None:  # built to learn that it changed nothing; not timed
            return Outcome(Status.SKIPPED, same_engine_reason(shortest, dropped),
                           Measured(**built.fields))
        route = str(job.route)
        same = self._candidates.setdefault(built.fields["candidate_sha256"], route)
        why = f"same model and settings as route '{same}'"
        engine = built.fields.get("engine_sha256")
        settings = self.backend.full_settings(built.fields["settings"])
        if same == route and engine:
            same = self._engines.setdefault(self._engine_key(engine, settings), route)
            why = f"same engine as route '{same}' (equal engine sha256 and run-time options)"
        kernels = built.fields.get("engine_kernels")
        if same == route and kernels:
            within = self._within(job.route, self._engine_key(kernels, settings))
            if within is None:
                return None
            same, why = str(within), same_kernels_reason(self.backend.name, within)
        if same == route:
            return None
        fields = Measured(candidate_sha256=built.fields["candidate_sha256"],
                          passes=built.fields.get("passes", ()))
        if engine:
            fields["engine_sha256"] = engine
        return Outcome(Status.SKIPPED, why, fields)

    def _within(self, route: Route, kernels: str) -> Route | None:
        """A measured route within `route` whose engine runs the same kernels, if any.

        Within: its steps are among `route`'s. That route met the accuracy constraint
        (it has a figure, judged ``ok``), so `route` can at best tie it, with more
        steps, and is not timed. Otherwise `route` is noted under `kernels` (an engine
        key of `Engine.kernels`) as one to be measured.
        """
        steps = set(route.steps)
        seen = self._kernels.setdefault(kernels, [])
        for other in seen:
            trial = self.store.get(self.fingerprint(other))
            if (set(other.steps) <= steps and trial is not None
                    and trial.status == Status.OK and trial.latency is not None):
                return other
        seen.append(route)
        return None

    def _engine_key(self, engine_sha256: str, settings: Mapping[str, Any]) -> str:
        """An engine file's sha256 with the run-time options it runs under."""
        return json.dumps([engine_sha256, [settings.get(k) for k in self._runtime]],
                          default=str)

    def confirm(self, trial: Trial) -> Confirmation:
        """Re-measure a stored trial against the base route in a fresh worker process.

        Both engines are built anew and timed in paired blocks
        (`routetune.candidate.candidate.Candidate.confirm`).

        Raises:
            BuildError: An engine could not be rebuilt.
        """
        return self.executor.confirm(_stored(trial, self.pace_ms))

    def outputs(self, trial: Trial) -> list[dict[str, np.ndarray]] | None:
        """Rebuild a stored trial's engine and run it on every input set.

        Returns:
            One mapping of output name to array per input set; None when the trial
            has no candidate model or this device cannot run its engine.
        """
        if not trial.artifact:
            return None
        return self.executor.outputs(_stored(trial))

    def record_skipped(self, route: Route, reason: str) -> Trial:
        """Store a route that was not built (a seasoning that does not apply)."""
        fingerprint = self.fingerprint(route)
        stored = self.store.get(fingerprint)
        if stored is not None:
            return stored
        return self.store.add(self._record(route, fingerprint, Status.SKIPPED, reason))

    def _record(self, route: Route, fingerprint: str, status: Status, reason: str,
                **fields: Any) -> Trial:
        return Trial(
            fingerprint, self.model.source_sha256, str(route), self.backend.name,
            self.device, self.settings_hash, status, reason, versions=self.versions, **fields,
        )

    def close(self) -> None:
        """Close the executor (its workers and engines)."""
        self.executor.close()


def _stored(trial: Trial, pace_ms: float | None = None) -> StoredEngine:
    """A stored trial's engine, what the store recorded of its build, and the pace.

    The pace: the base route's p50 alone in the search (`SearchLoop.pace_ms`).
    """
    return StoredEngine(trial.route, trial.artifact or "", dict(trial.settings),
                        trial.fingerprint,
                        Recorded(trial.candidate_sha256 or "", trial.engine_sha256 or ""),
                        pace_ms)


def _versions(backend: Backend) -> dict[str, str]:
    import platform

    return {
        "routetune": routetune.__version__,
        **backend.versions(),
        "onnx": onnx.__version__,
        "onnx_graphsurgeon": gs.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
