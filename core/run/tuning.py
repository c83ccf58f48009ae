"""The main job: tune one model on one backend and keep the fastest accurate route.

`tune` is what ``routetune tune`` runs; the CLI only parses flags and prints.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routetune import signals
from routetune.errors import StorageError, UsageError
from routetune.execution.executor import Executor, ExecutorSettings
from routetune.execution.local_pool import TIMELINE
from routetune.judging.accuracy import check_accuracy
from routetune.judging.ranking import ranked
from routetune.judging.verdict import DEFAULT_MIN_SPEEDUP, confirm_winner
from routetune.libraries import CUSTOM_OPS, PLUGINS, check_recorded
from routetune.logs import LOGS, keep, quietly
from routetune.records import run_record
from routetune.records.store import FILENAME, TrialStore, disk_full, full_disk
from routetune.records.trial import Confirmation, Status, Trial
from routetune.registry import Registry
from routetune.routes.route import Route, Step, parse_route
from routetune.run import runinfo
from routetune.run.outdir import locked, move_aside, remove_refused
from routetune.run.preparation import Prepared, prepare_run, reference_backend, reference_outputs
from routetune.run.pruning import Pruned, prune
from routetune.run.route_memory import open_memory
from routetune.run.run_spec import RunSpec
from routetune.run.winner import WINNER_OUTPUTS, save_outputs, write_winner
from routetune.search.loop import Budget, SearchLoop
from routetune.search.strategy import Strategy
from routetune.timing.race import Bar

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """How many trials the search will record (the progress bar's total).

    Args:
        trials: The base route, the pinned routes and the strategy's, capped by
            ``--max-trials``; None when the strategy cannot say.
        exact: Whether that is the count; otherwise it is an upper bound (``bound``)
            or an estimate (refinements such as precision-repair add trials).
        bound: Whether `trials` is an upper bound (a beam that may stop sooner).
    """

    trials: int | None
    exact: bool = True
    bound: bool = False

    def count(self) -> str:
        """``120``, ``up to 120`` or ``about 120``; ``?`` when not known."""
        if self.trials is None:
            return "?"
        return ("" if self.exact else "up to " if self.bound else "about ") + f"{self.trials:,}"

    def __str__(self) -> str:
        if self.trials is None:
            return "number of trials not known"
        return f"{self.count()} trial{'s' * (self.trials != 1)}"


@dataclass(frozen=True)
class TuneResult:
    """What a tuning run found.

    Args:
        winner: The winning trial (the base route when nothing else is accurate).
        winner_reason: Why it won, in one line.
        trials: Every trial of this run, sorted with the winner first, then accurate
            routes by latency, then the rest.
        base: The base route's trial.
        space_size: Routes in the route space.
        not_applicable: Seasoning name to the reason it was not offered.
        outdir: The output directory.
        files: What was written, by role (``model``, ``settings``, ``recipe``, ``store``).
        stopped: Why the search stopped early (a budget), or None when it ran to the end.
        confirmations: The routes re-measured against the base route after the search,
            in a fresh worker process, in the order tried
            (`routetune.judging.verdict.confirm_winner`); the first
            one that held won, and is the last.
        busy_machine: The ``--busy-machine`` mode.
        min_speedup: The ``--min-speedup`` the verdict used.
        fresh: Fingerprints of the trials this run measured (the others came from the
            store).
        pruned: The candidate models removed at the end (``--keep``), if any.
        elapsed_s: Seconds of the search and the confirmations (wall clock), the
            share of the run that waiting for a quiet machine is told against.
        planned: The trials the search planned (`Plan.trials`); None when not known.
        untried: When a budget stopped the search, the offered seasonings that no
            trial's route held: what the verdict knows nothing about.
    """

    winner: Trial
    winner_reason: str
    trials: tuple[Trial, ...]
    base: Trial
    space_size: int
    not_applicable: Mapping[str, str]
    outdir: Path
    files: dict[str, Path]
    stopped: str | None = None
    confirmations: tuple[Confirmation, ...] = ()
    busy_machine: str = "wait"
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    fresh: frozenset[str] = frozenset()
    pruned: Pruned | None = None
    elapsed_s: float = 0.0
    planned: int | None = None
    untried: tuple[str, ...] = ()

    @property
    def confirmed(self) -> Confirmation | None:
        """The winner's confirmation; None when the base route stands.

        None too when the winner was not confirmed (a failed or inaccurate base route
        leaves nothing to confirm against). Whatever the order: a route confirmed after
        the winner (a challenger that held at no more than the winner's figure) does not
        hide the winner's confirmation.
        """
        if self.winner is self.base:
            return None
        return next((c for c in reversed(self.confirmations)
                     if c.route == self.winner.route), None)

    @property
    def noisy(self) -> list[Trial]:
        """The trials measured while the machine was busy (`Trial.noisy`)."""
        return [t for t in self.trials if t.noisy]

    @property
    def waited_s(self) -> float:
        """Seconds this run's measurements waited for a quiet machine, in all.

        Trials read from the store (`fresh` lacks them) waited in the run that measured
        them, and are not counted.
        """
        return sum(float(t.conditions.get("waited_s", 0.0)) for t in self.trials
                   if t.fingerprint in self.fresh) + sum(
            float(c.conditions.get("waited_s", 0.0)) for c in self.confirmations)

    def records(self) -> list[dict[str, Any]]:
        """The trials as flat records, winner first (`routetune.reporting.report.trial_row`).

        Each: route, status, reason, ``p50_ms``/``p90_ms``/``ci_ms`` (ms), ``speedup``,
        ``build_ms`` (ms), ``engine_bytes`` (bytes), ``error`` (worst value per metric).
        """
        from routetune.reporting.report import trial_row

        return [trial_row(t) for t in self.trials]

    def to_dataframe(self) -> Any:
        """The records as a ``pandas.DataFrame``, one row per trial, winner first.

        Raises:
            UsageError: pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise UsageError("TuneResult.to_dataframe needs pandas; pip install pandas") from e
        rows = self.records()
        for row in rows:
            row.update({f"error_{k}": v for k, v in row.pop("error").items()})
        return pd.DataFrame(rows)

    def report(self, path: Path | str | None = None) -> dict[str, Path]:
        """Write ``report.html``, ``report.md`` and ``report.json`` of this run.

        Args:
            path: A directory to write them into; default: the output directory.

        Returns:
            The paths, by format (``html``, ``md``, ``json``).
        """
        from routetune.reporting.files import write_reports

        records = self.files["run"].parent if "run" in self.files else self.outdir
        return write_reports(records, Path(path) if path is not None else None)

    @property
    def fallback(self) -> bool:
        """Whether the base route stands because no other route was accurate and faster.

        The reason is `winner_reason`; the winner may itself have failed (when even
        the base route did not build, run or meet the constraint).
        """
        return self.winner is self.base

    @property
    def winner_speedup(self) -> float:
        """The winner's confirmed speed-up over the base route (1.0 for the base route)."""
        confirmed = self.confirmed
        return 1.0 if confirmed is None else confirmed.paired.value


def tune(
    opts: RunSpec,
    registry: Registry | None = None,
    on_start: Callable[[Prepared, Plan], None] = lambda run, plan: None,
    on_trial: Callable[[Trial, bool], None] = lambda trial, cached: None,
    on_status: Callable[[str], None] = lambda text: None,
    floor: Bar | None = None,
    prepared: tuple[Prepared, bytes] | None = None,
    pace_ms: float | None = None,
) -> TuneResult:
    """Run a whole search and write the winner to the output directory.

    Args:
        opts: What to tune and how.
        registry: The installed plugins; loaded from entry points when None.
        on_start: Called once the run is prepared, with the trials planned.
        on_trial: Called after each trial, with whether it came from the store.
        on_status: Called with a line to show while a measurement waits for a quiet
            machine (``--busy-machine wait``).
        floor: A bar every candidate races against at least
            (`routetune.search.leader.Leader`); a multi-backend run's
            (`routetune.run.backends`). None for ``--min-speedup`` alone.
        prepared: The run, already prepared from `opts` (`prepare_run`), with what the
            libraries printed meanwhile; None to prepare it here.
        pace_ms: The base route's p50 (ms) timed just before this search on a quiet
            machine (a multi-backend run's side-by-side loop,
            `routetune.run.side_by_side.BaseScreen`), or None.

    Returns:
        The result; never None. When nothing is accurate the base route wins.

    Raises:
        UsageError: Bad input (see `prepare_run`).
        StorageError: The trial store cannot be opened or written, or the disk that
            holds the output folder is full (`routetune.records.store.full_disk`).
    """
    with opts.worded():  # an error names its option as the user wrote it
        run, early = prepared or quietly("prepare", lambda: prepare_run(opts, registry))
        try:
            with locked(run.outdir):
                keep(run.outdir / LOGS / "prepare.log", early)  # the libraries' lines
                return _tune_locked(run, opts, on_start, on_trial, on_status, floor,
                                    pace_ms)
        except UsageError:
            remove_refused(run.outdir, run.created)  # refused before any trial: no folder
            raise
        except OSError as e:
            if disk_full(e):  # a winner file, a report, a log: wherever it was
                raise full_disk(Path(e.filename or run.outdir), e) from e
            raise


def _recorded(outdir: Path) -> dict[str, Any]:
    """The folder's ``run.json``, or {} where it has none or an unreadable one."""
    try:
        return run_record.read(outdir)
    except UsageError:
        return {}


def _tune_locked(
    run: Prepared, opts: RunSpec, on_start: Callable[[Prepared, Plan], None],
    on_trial: Callable[[Trial, bool], None], on_status: Callable[[str], None],
    floor: Bar | None,
    pace_ms: float | None = None,
) -> TuneResult:
    store_path = run.outdir / FILENAME
    memory = open_memory(opts, run)  # a --memory file that is not one: refused first
    reference = reference_backend(run.registry, run.backend)
    executor = make_executor(run, opts)
    executor.on_status = on_status
    loop = None
    try:
        executor.warm_up(run.outdir)  # workers load their libraries during the reference run
        if not opts.fresh:  # a resume loads what it was given now, and only that
            check_recorded(_recorded(run.outdir), run.libraries, run.outdir,
                           {CUSTOM_OPS: opts.spelled("custom_op_libraries"),
                            PLUGINS: opts.spelled("plugin_libraries")})
        references = reference_outputs(reference, run)
        if opts.fresh:
            move_aside(store_path)
            move_aside(run.outdir / "artifacts" / TIMELINE)
            move_aside(run.outdir / run_record.FILENAME)
        store = TrialStore.open(store_path)
    except BaseException:
        executor.close()
        raise
    try:
        loop = SearchLoop(run.registry, run.model, run.backend, run.feeds, references,
                          run.constraint, store, run.outdir, run.spec.trial_settings(run.libraries),
                          run.settings_hash,
                          reference, [r(run.registry) for r in run.refinements],
                          base=run.base, executor=executor, floor=floor, pace_ms=pace_ms)
        run.base_passes = loop.base_passes
        strategy = run.registry.strategy(opts.search)(run.space, run.strategy_options)
        strategy.learn(memory.prior(run, loop.device))
        run.memory = memory.note
        record = runinfo.start_record(run, opts, loop.versions, memory.record())
        if floor is not None:
            record["search"]["floor"] = {"speedup": floor.speedup, "source": floor.source}
        records = run_record.record_dir(run.outdir, record)
        run_record.write(records, record)
        skipped = [loop.record_skipped(Route((Step(n),)), reason)
                   for n, reason in run.not_applicable.items()]
        planned = plan(strategy, run, opts)
        on_start(run, planned)
        fresh: set[str] = set()  # trials measured by this run, not read from the store

        def on_each(trial: Trial, cached: bool) -> None:
            if not cached:
                fresh.add(trial.fingerprint)
            on_trial(trial, cached)

        started = time.monotonic()
        trials = loop.run(strategy, Budget(opts.max_trials, run.time_budget_s), on_each,
                          pinned=run.pinned)
        trials.extend(skipped)
        executor.release()  # confirmation runs alone, not beside the search's sessions
        asked: dict[str, int] = {}

        def confirm(trial: Trial) -> Confirmation:
            asked[trial.route] = asked.get(trial.route, 0) + 1
            on_status(f"confirming, fresh process {asked[trial.route]} of "
                      f"{opts.confirm_repeats} at most: {trial.route}")
            return loop.confirm(trial)

        winner, reason, confirmations = confirm_winner(
            trials, confirm, opts.min_speedup, opts.busy_machine, opts.confirm_repeats)
        elapsed = time.monotonic() - started
        stop = signals.interrupted_by()  # the bar counts trials (not skipped ones)
        on_status(f"stopped ({stop}); best so far {winner.route}" if stop
                  else f"done; winner {winner.route}")
        if winner.status == Status.OK:
            outputs = loop.outputs(winner)
            if outputs is not None:  # the winner file is checked again, not trusted
                check = check_accuracy(run.constraint, run.registry, outputs, references)
                if not check.passed:
                    raise StorageError(
                        f"{run.outdir}: the stored winner '{winner.route}' no longer meets "
                        f"the accuracy constraint ({check.reason}); its files changed on "
                        "disk since it was measured: tune again with --fresh")
            save_outputs(records / WINNER_OUTPUTS, outputs, run.constraint)
        memory.teach(run, trials)
        ours = {t.fingerprint for t in trials}  # other runs' kept models stay (--keep)
        others = frozenset(t.artifact for t in store.trials()
                           if t.artifact and t.fingerprint not in ours)
    finally:
        executor.close()
        store.close()
    tried = {step.name for t in trials if t.status != Status.SKIPPED
             for step in parse_route(t.route)}
    untried = tuple(n for n in run.space.infos if n not in tried) if loop.stopped else ()
    result = dataclasses.replace(
        _finish(run, opts, trials, store_path, winner, reason, confirmations, loop.stopped,
                records, frozenset(fresh)), elapsed_s=elapsed, planned=planned.trials,
        untried=untried)
    record["search"]["memory"] = memory.record()
    result.files["run"] = run_record.write(records, runinfo.finish_record(record, result))
    if winner.status == Status.OK and (records / WINNER_OUTPUTS).is_file():
        result.files["outputs"] = records / WINNER_OUTPUTS  # listed in `tune`'s last line
    from routetune.reporting.files import write_reports  # matplotlib: loaded when needed

    result.files.update({f"report.{k}": v
                         for k, v in write_reports(records).items()})
    return dataclasses.replace(result, pruned=prune(run.outdir, trials, winner, opts.keep,
                                                   others))


def plan(strategy: Strategy, run: Prepared, opts: RunSpec) -> Plan:
    """The trials the search will record: the base route, the pinned, the strategy's.

    An upper bound (``up to``) when the strategy may stop sooner (a beam) or a time
    budget may stop it; an estimate (``about``) when refinements add trials.
    """
    planned = strategy.planned()
    if planned is None:
        return Plan(None)
    total = 1 + sum(not route.is_base for route in run.pinned) + planned
    capped = opts.max_trials is not None and opts.max_trials < total
    if capped:
        total = opts.max_trials  # type: ignore[assignment]
    refined = bool(run.refinements) and not capped
    bounded = strategy.PLANNED_IS_BOUND or run.time_budget_s is not None  # may stop sooner
    return Plan(total, exact=not (refined or bounded), bound=bounded and not refined)


def make_executor(run: Prepared, opts: RunSpec) -> Executor:
    """The executor `opts` asks for, from the registry (`RunSpec.executor_name`).

    Its measuring workers: one per GPU that runs this backend's engines
    (`Backend.gpus`), or one for the host CPU.
    """
    gpus = run.backend.gpus(run.backend.full_settings(run.backend_options))
    settings = ExecutorSettings(run.backend.name, tuple(gpus), opts.build_workers,
                                opts.trial_timeout_s, opts.worker_memory_mb, opts.ray_address)
    return run.registry.executor(opts.executor_name).make(settings)


def _finish(run: Prepared, opts: RunSpec, trials: list[Trial], store: Path, winner: Trial,
            reason: str, confirmations: Sequence[Confirmation],
            stopped: str | None, records: Path, fresh: frozenset[str]) -> TuneResult:
    base = next(t for t in trials if t.route == "base")
    result = TuneResult(winner, reason, tuple(ranked(trials, winner)), base, run.space.size(),
                        run.not_applicable, run.outdir, {"store": store}, stopped,
                        tuple(confirmations), opts.busy_machine, opts.min_speedup, fresh)
    result.files.update(write_winner(run, result, opts, records))
    return result
