"""The main job: tune one model on one backend and keep the fastest accurate route.

`tune` is what ``routetune tune`` runs; the CLI only parses flags and prints.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from routetune import examples, runinfo
from routetune.accuracy import DEFAULT_ACCURACY, Constraint, check_accuracy, parse_accuracy
from routetune.backend import Backend
from routetune.composer import RouteSpace, resolve_route
from routetune.conditions import MODES, BusyPolicy
from routetune.errors import BackendError, StorageError, UsageError, one_line
from routetune.inputs import load_npz, parse_shapes, resolve_shapes, synthesize
from routetune.logs import LOGS, keep, quietly
from routetune.measure import MeasureSettings
from routetune.model import PreparedModel, prepare, sha256, with_weights_in
from routetune.outdir import locked, make_outdir, move_aside
from routetune.plugin_manager import load_registry
from routetune.profile import ShapeProfile, make_profile
from routetune.recipe import write_winner_recipe
from routetune.registry import Registry
from routetune.report import write_reports
from routetune.route import Route, Step, parse_route
from routetune.search.candidate import MODELS, Confirmation, matches_record, save_model
from routetune.search.executor import Executor, InlineExecutor
from routetune.search.local_pool import DEFAULT_TIMEOUT_S, TIMELINE, LocalPool
from routetune.search.loop import Budget, SearchLoop
from routetune.search.repair import REPAIR
from routetune.search.strategy import SearchConfig, rank_key
from routetune.seasoning import SeasoningInfo
from routetune.space import restrict_space
from routetune.store import FILENAME, Trial, TrialStore
from routetune.verdict import DEFAULT_MIN_SPEEDUP, confirm_winner
from routetune.weights import copy_model, import_graph, save_standalone

logger = logging.getLogger(__name__)




@dataclass(frozen=True)
class TuneOptions:
    """Everything ``routetune tune`` takes, with the CLI's defaults.

    Args:
        model: Path of the ONNX model (or None with `example`).
        example: Name of a bundled example model (``ppocr-det`` …), fetched on demand.
        output: Output directory; default ``routetune-out/<model stem>-<sha256[:8]>-<backend>``
            (`routetune.outdir.make_outdir`).
        backend: Backend name.
        seasonings: Restrict the space to these seasoning names; None for all applicable.
        search: Search strategy name.
        beam_width: Routes kept per depth by beam search.
        max_depth: Seasonings per route at most; None for no limit.
        accuracy: The accuracy expression.
        inputs: An ``.npz`` file or a directory of them.
        shapes: trtexec-style shapes for dynamic inputs (``x:1x3x320x320``); sets the
            min, opt and max shapes of the optimisation profile at once.
        min_shapes: The profile's min shapes (trtexec ``--minShapes``); default: opt.
        opt_shapes: The profile's opt shapes, at which accuracy is checked and latency
            measured (trtexec ``--optShapes``); default: `shapes`.
        max_shapes: The profile's max shapes (trtexec ``--maxShapes``); default: opt.
        space: Per seasoning, per parameter, the values the search tries instead of the
            parameter's own choices (``--space fp16:keep_io_types=true``); the only way
            to search an open-ended parameter such as an unbounded TensorRT knob.
        routes: Route texts always tried, after the base route (pinned routes).
        base: Route steps (graph and precision stages) applied to every route, the base
            route included.
        backend_options: Build options every route starts from (backend option keys).
        model_sha256: The sha256 the model file must have; None for no check.
        fresh: Ignore the stored trials (the old store is moved aside, not deleted).
        max_trials: Trial budget.
        time_budget_s: Wall-clock budget in seconds.
        measure: How long to time each candidate.
        build_workers: Builds run at once, each in its own worker process.
        trial_timeout_s: Seconds each phase of a trial (build; run, check and time) may
            run before its worker is killed and the trial recorded as ``timed-out``.
        worker_memory_mb: Address-space limit per worker process in MiB (``RLIMIT_AS``);
            a trial that exceeds it is ``crashed`` (out of memory). None for none.
        in_process: Run trials in this process, one at a time: no isolation and no
            timeouts; for debugging plugins, and for plugins registered in-process.
        min_speedup: The smallest speed-up over the base route that may win: a route
            wins only if the lower end of its confirmed speed-up's 95% interval is above
            it (unitless).
        busy_machine: What a measurement does while other processes load the machine:
            ``wait``, ``warn`` or ``ignore`` (`routetune.conditions`).
        allow_external_data_outside: Read a model whose external data files lie outside
            its folder (``..``, absolute paths, links out). Off: refused, one line. Never
            from a recipe, which is data (SECURITY.md).
    """

    model: Path | None = None
    example: str | None = None
    output: Path | None = None
    backend: str = "onnxruntime"
    seasonings: tuple[str, ...] | None = None
    search: str = "beam"
    beam_width: int = 3
    max_depth: int | None = 3
    accuracy: str = DEFAULT_ACCURACY
    inputs: Path | None = None
    shapes: str | None = None
    min_shapes: str | None = None
    opt_shapes: str | None = None
    max_shapes: str | None = None
    space: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    routes: tuple[str, ...] = ()
    base: tuple[str, ...] = ()
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    model_sha256: str | None = None
    fresh: bool = False
    max_trials: int | None = None
    time_budget_s: float | None = None
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    build_workers: int = 1
    trial_timeout_s: float = DEFAULT_TIMEOUT_S
    worker_memory_mb: int | None = None
    in_process: bool = False
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    busy_machine: str = "wait"
    allow_external_data_outside: bool = False


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
            (`routetune.verdict.confirm_winner`); the first
            one that held won, and is the last.
        busy_machine: The ``--busy-machine`` mode.
        min_speedup: The ``--min-speedup`` the verdict used.
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

    @property
    def confirmed(self) -> Confirmation | None:
        """The winner's confirmation; None when the base route stands."""
        if self.winner is self.base or not self.confirmations:
            return None
        last = self.confirmations[-1]
        return last if last.route == self.winner.route else None

    @property
    def noisy(self) -> list[Trial]:
        """The trials measured while the machine was busy (`Trial.noisy`)."""
        return [t for t in self.trials if t.noisy]

    @property
    def waited_s(self) -> float:
        """Seconds measurements waited for a quiet machine, in all."""
        return sum(float(t.conditions.get("waited_s", 0.0)) for t in self.trials) + sum(
            float(c.conditions.get("waited_s", 0.0)) for c in self.confirmations)

    def records(self) -> list[dict[str, Any]]:
        """The trials as flat records, winner first (`routetune.report.trial_row`).

        Each: route, status, reason, ``p50_ms``/``p90_ms``/``ci_ms`` (ms), ``speedup``,
        ``build_ms`` (ms), ``engine_bytes`` (bytes), ``error`` (worst value per metric).
        """
        from routetune.report import trial_row

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
        from routetune.report import write_reports

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


@dataclass
class Prepared:
    """A tuning run's inputs, resolved and checked before any trial runs."""

    registry: Registry
    model: PreparedModel
    backend: Backend
    feeds: list[dict[str, np.ndarray]]
    constraint: Constraint
    space: RouteSpace
    not_applicable: dict[str, str]
    outdir: Path
    settings_hash: str
    source: Mapping[str, Any]
    repair: bool = False
    profile: ShapeProfile | None = None
    base: Route = field(default_factory=Route)
    pinned: tuple[Route, ...] = ()
    backend_options: dict[str, Any] = field(default_factory=dict)
    base_passes: list[dict[str, Any]] = field(default_factory=list)
    """The backend's base pipeline as applied (set once the search loop has started)."""


def prepare_run(opts: TuneOptions, registry: Registry | None = None) -> Prepared:
    """Resolve and check everything a run needs; no trial runs yet.

    Raises:
        UsageError: Any bad input: model, example, backend, seasoning, accuracy
            expression, inputs, shapes or output directory.
    """
    registry = registry or load_registry()
    if opts.max_trials is not None and opts.max_trials < 1:
        raise UsageError(f"--max-trials {opts.max_trials}: must be 1 or more (the base route)")
    if opts.measure.min_runs < 1 or opts.measure.min_time_s < 0:
        raise UsageError("--min-runs must be 1 or more and --min-time 0 or more")
    if opts.seasonings is not None and not opts.seasonings and not opts.routes:
        raise UsageError("--seasonings: no names given; list seasonings (see `routetune "
                         "seasonings`) or leave the flag out for all")
    with_params = [n for n in opts.seasonings or () if "{" in n]
    if with_params:
        raise UsageError(f"--seasonings {with_params[0]}: takes seasoning names only; the search "
                         f"tries each seasoning's parameter choices itself; give "
                         f"'{with_params[0].split('{')[0]}'")
    for flag, given in (("--shapes", opts.shapes), ("--opt-shapes", opts.opt_shapes)):
        if opts.inputs is not None and given:
            raise UsageError(f"{flag} with --inputs: the inputs fix the (opt) shapes; give one "
                             "of them (--min-shapes and --max-shapes may go with --inputs)")
    if opts.shapes and opts.opt_shapes:
        raise UsageError("--shapes with --opt-shapes: --shapes sets min, opt and max at once; "
                         "give --opt-shapes with --min-shapes/--max-shapes instead")
    _check_workers(opts)
    if opts.busy_machine not in MODES:
        raise UsageError(f"--busy-machine {opts.busy_machine}: give one of {', '.join(MODES)}")
    if not (math.isfinite(opts.min_speedup) and opts.min_speedup >= 1.0):
        raise UsageError(f"--min-speedup {opts.min_speedup}: give a number of 1 or more "
                         "(1.03: a route must be at least 3% faster to win)")
    if opts.time_budget_s is not None and opts.time_budget_s <= 0:
        raise UsageError(f"--time-budget {opts.time_budget_s}: must be positive (seconds)")
    backend = _backend(registry, opts.backend)
    registry.strategy(opts.search)  # an unknown name fails here, before any work
    source: dict[str, Any] = {}
    shapes_flag = "--opt-shapes" if opts.opt_shapes else "--shapes"
    given_shapes = parse_shapes(opts.opt_shapes or opts.shapes, shapes_flag)
    if opts.example and opts.model is not None:
        raise UsageError("give either MODEL.onnx or --example NAME, not both")
    example = examples.get_example(opts.example) if opts.example else None
    if example is not None:
        path = examples.fetch_example(example)
        source["example"] = example.name
        given_shapes = {**example.shapes, **given_shapes}
    elif opts.model is not None:
        path = opts.model
        source["path"] = str(opts.model.resolve())
    else:
        raise UsageError("no model given; pass MODEL.onnx or --example NAME (e.g. ppocr-det)")
    model = prepare(path, opts.allow_external_data_outside)
    if opts.model_sha256 and opts.model_sha256 != model.source_sha256:
        raise UsageError(f"{path}: sha256 {model.source_sha256} is not the recipe's "
                         f"{opts.model_sha256}; the model changed since the recipe was written")
    outdir = make_outdir(opts.output, path, model.source_sha256, backend.name)
    model = with_weights_in(model, (outdir / MODELS).resolve())
    if opts.inputs is not None:
        feeds = load_npz(opts.inputs, model.inputs)
        source["inputs"] = str(opts.inputs.resolve())
        shapes = {s.name: tuple(feeds[0][s.name].shape) for s in model.inputs}
    else:
        shapes = resolve_shapes(model.inputs, given_shapes, shapes_flag)
        if example is not None:
            feeds = example.make_inputs(shapes, 0, 4)
        else:
            feeds = synthesize(model.inputs, shapes)
        source["shapes"] = ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())
    profile = make_profile(model.inputs, shapes, opts.min_shapes or opts.shapes,
                           opts.max_shapes or opts.shapes,
                           feeds if opts.inputs is not None else ())
    backend = type(backend)(profile)
    constraint = parse_accuracy(opts.accuracy, registry, [o.name for o in model.outputs])
    infos, not_applicable = _offered(registry, backend, model, opts.seasonings)
    if opts.seasonings:  # () with pinned routes: search nothing, try the pinned ones
        _check_named(opts.seasonings, infos, not_applicable)
    infos = restrict_space(infos, opts.space, not_applicable, registry)
    space = RouteSpace(infos, opts.max_depth)
    inputs_hash = sha256(b"".join(a.tobytes() + str(a.shape).encode()
                                  for f in feeds for a in f.values()))
    base = resolve_route(parse_route(",".join(opts.base)), registry)
    if any(registry.seasoning(n).info.stage == "build" for n in base.names):
        raise UsageError(f"base '{base}': build seasonings cannot be in the base pipeline; "
                         "give build options as backend options")
    pinned = tuple(resolve_route(parse_route(text), registry) for text in opts.routes)
    for route in pinned:
        for step in route:
            why = registry.seasoning(step.name)().supports(backend)
            if why:
                raise UsageError(f"pinned route '{route}': {step.name} {why}, not "
                                 f"{backend.name}; drop it or change the backend")
    try:
        backend.full_settings(opts.backend_options)
    except BackendError as e:
        raise UsageError(f"backend options: {e}") from e
    settings_hash = sha256(json.dumps(
        [inputs_hash, constraint.text, asdict(opts.measure), str(profile), str(base),
         sorted(opts.backend_options.items())], default=str).encode())
    repair = any(info.name == REPAIR for info in infos)
    if profile.shapes:
        source["profile"] = str(profile)
    return Prepared(registry, model, backend, feeds, constraint, space, not_applicable,
                    outdir, settings_hash, source, repair, profile, base=base,
                    pinned=pinned, backend_options=dict(opts.backend_options))


def tune(
    opts: TuneOptions,
    registry: Registry | None = None,
    on_start: Callable[[Prepared, int | None], None] = lambda run, planned: None,
    on_trial: Callable[[Trial, bool], None] = lambda trial, cached: None,
    on_status: Callable[[str], None] = lambda text: None,
) -> TuneResult:
    """Run a whole search and write the winner to the output directory.

    Args:
        opts: What to tune and how.
        registry: The installed plugins; loaded from entry points when None.
        on_start: Called once the run is prepared, with the number of trials planned.
        on_trial: Called after each trial, with whether it came from the store.
        on_status: Called with a line to show while a measurement waits for a quiet
            machine (``--busy-machine wait``).

    Returns:
        The result; never None. When nothing is accurate the base route wins.

    Raises:
        UsageError: Bad input (see `prepare_run`).
        StorageError: The trial store cannot be opened or written.
    """
    run, early = quietly("prepare", lambda: prepare_run(opts, registry))
    with locked(run.outdir):
        keep(run.outdir / LOGS / "prepare.log", early)  # the libraries' lines, not the terminal's
        return _tune_locked(run, opts, on_start, on_trial, on_status)


def _tune_locked(
    run: Prepared, opts: TuneOptions, on_start: Callable[[Prepared, int | None], None],
    on_trial: Callable[[Trial, bool], None], on_status: Callable[[str], None],
) -> TuneResult:
    store_path = run.outdir / FILENAME
    reference = run.backend if run.backend.name == "onnxruntime" else _backend(
        run.registry, "onnxruntime")
    executor = make_executor(run, opts)
    executor.on_status = on_status
    executor.warm_up(run.outdir)  # workers load their libraries during the reference run
    loop = None
    try:
        references = _references(reference, run)
        if opts.fresh:
            move_aside(store_path)
            move_aside(run.outdir / "artifacts" / TIMELINE)
            move_aside(run.outdir / runinfo.FILENAME)
        store = TrialStore.open(store_path)
    except BaseException:
        executor.close()
        raise
    try:
        loop = SearchLoop(run.registry, run.model, run.backend, run.feeds, references,
                          run.constraint, store, run.outdir, opts.measure, run.settings_hash,
                          reference, run.repair, base=run.base,
                          base_settings=run.backend_options, executor=executor,
                          busy=BusyPolicy(opts.busy_machine))
        run.base_passes = loop.base_passes
        record = runinfo.start_record(run, opts, loop.versions)
        records = runinfo.record_dir(run.outdir, record)
        runinfo.write(records, record)
        strategy = run.registry.strategy(opts.search)(
            run.space, SearchConfig(beam_width=opts.beam_width))
        skipped = [loop.record_skipped(Route((Step(n),)), reason)
                   for n, reason in run.not_applicable.items()]
        planned = strategy.planned()
        on_start(run, None if planned is None else planned)
        trials = loop.run(strategy, Budget(opts.max_trials, opts.time_budget_s), on_trial,
                          pinned=run.pinned)
        trials.extend(skipped)
        executor.release()  # confirmation runs alone, not beside the search's sessions
        winner, reason, confirmations = confirm_winner(
            trials, loop.confirm, opts.min_speedup, opts.busy_machine)
        if winner.status == "ok":
            outputs = loop.outputs(winner)
            if outputs is not None:  # the winner file is checked again, not trusted
                check = check_accuracy(run.constraint, run.registry, outputs, references)
                if not check.passed:
                    raise StorageError(
                        f"{run.outdir}: the stored winner '{winner.route}' no longer meets "
                        f"the accuracy constraint ({check.reason}); its files changed on "
                        "disk since it was measured: tune again with --fresh")
            save_outputs(records / WINNER_OUTPUTS, outputs)
    finally:
        executor.close()
        store.close()
    result = _finish(run, opts, trials, store_path, winner, reason, confirmations,
                     loop.stopped, records)
    result.files["run"] = runinfo.write(records, runinfo.finish_record(record, result))
    result.files.update({f"report.{k}": v
                         for k, v in write_reports(records).items()})
    return result


def make_executor(run: Prepared, opts: TuneOptions) -> Executor:
    """The executor `opts` asks for: worker processes (`LocalPool`) unless in-process.

    Measuring workers: one per GPU that runs this backend's engines
    (`Backend.gpus`), or one for the host CPU.
    """
    if opts.in_process:
        return InlineExecutor()
    gpus = run.backend.gpus(run.backend.full_settings(run.backend_options))
    return LocalPool(opts.build_workers, gpus, opts.trial_timeout_s, opts.worker_memory_mb)


WINNER_OUTPUTS = "winner_outputs.npz"
"""The winner's outputs on the validation inputs (``<set>/<output name>`` keys), for
``routetune build`` to compare a rebuilt engine with."""


def save_outputs(path: Path, outputs: Sequence[Mapping[str, np.ndarray]] | None) -> None:
    """Write outputs, one mapping per input set, as ``.npz`` (keys ``<set>/<name>``)."""
    if outputs is None:
        return
    arrays: dict[str, Any] = {f"{i}/{name}": array for i, out in enumerate(outputs)
                              for name, array in out.items()}
    np.savez(path, **arrays)


def load_outputs(path: Path) -> list[dict[str, np.ndarray]]:
    """Read what `save_outputs` wrote."""
    with np.load(path, allow_pickle=False) as data:
        sets: dict[int, dict[str, np.ndarray]] = {}
        for key in data.files:
            i, name = key.split("/", 1)
            sets.setdefault(int(i), {})[name] = data[key]
    return [sets[i] for i in sorted(sets)]


def _references(backend: Backend, run: Prepared) -> list[dict[str, np.ndarray]]:
    """The FP32 reference outputs of the original model, one mapping per input set.

    A model with external data runs from its copy in the run's store (the same graph
    and bytes, `with_weights_in`): its own locations may lead out of its folder, which
    ONNX Runtime refuses, when ``--allow-external-data-outside`` let them in.

    Raises:
        UsageError: The reference runtime cannot load or run the model on these inputs.
    """
    source = run.model.source
    if run.model.weights is not None:
        source = save_model(run.outdir, run.model.data)
    try:
        with backend.reference(source) as runner:
            return [runner.infer(feed) for feed in run.feeds]
    except Exception as e:  # the runtime's own error types
        raise UsageError(
            f"{run.model.source}: the FP32 reference ({backend.name}, optimisations off) "
            f"cannot run the model on these inputs: {one_line(e, 300)}; "
            "the original model must run in ONNX Runtime on the CPU"
        ) from e


def _finish(run: Prepared, opts: TuneOptions, trials: list[Trial], store: Path, winner: Trial,
            reason: str, confirmations: Sequence[Confirmation],
            stopped: str | None, records: Path) -> TuneResult:
    base = next(t for t in trials if t.route == "base")
    ordered = [winner] + sorted(
        (t for t in trials if t is not winner),
        key=lambda t: ((0 if t.status == "ok" else 1), *rank_key(t)),
    )
    result = TuneResult(winner, reason, tuple(ordered), base, run.space.size(),
                        run.not_applicable, run.outdir, {"store": store}, stopped,
                        tuple(confirmations), opts.busy_machine, opts.min_speedup)
    result.files.update(_write_winner(run, result, opts, records))
    return result


def _write_winner(run: Prepared, result: TuneResult, opts: TuneOptions, records: Path
                  ) -> dict[str, Path]:
    """Write ``winner.onnx``, ``winner.json`` and ``winner.toml`` into `records`."""
    winner, reason = result.winner, result.winner_reason
    model_path = records / "winner.onnx"
    if winner.artifact:  # with external data: winner.onnx and one winner.onnx.data
        source = run.outdir / winner.artifact
        if not matches_record(source, winner.settings, winner.candidate_sha256):
            raise StorageError(f"{source}: not the candidate model the trial store recorded "
                               f"for the winner '{winner.route}' (changed on disk); "
                               "tune again with --fresh")
        copy_model(source, model_path)
    else:
        save_standalone(run.model.proto, run.model.weights, model_path)
    settings = {
        "route": winner.route,
        "backend": run.backend.name,
        "backend_version": run.backend.version(),
        "settings": dict(winner.settings) or run.backend.full_settings(run.backend_options),
        "status": winner.status,
        "reason": reason,
        "settings_hash": run.settings_hash,
        **verdict_figures(result),
    }
    settings_path = records / "winner.json"
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
    recipe = write_winner_recipe(records / "winner.toml", run, result, opts)
    return {"model": model_path, "settings": settings_path, "recipe": recipe}


def verdict_figures(result: TuneResult) -> dict[str, Any]:
    """The winner's figures, each labelled by where it was measured.

    ``speedup`` and ``confirmed`` come from the confirmation (a fresh process, paired
    blocks); ``search`` from the search's own trial. They are never mixed: a p50 of
    one with the speed-up of the other would describe no single measurement.
    """
    winner, confirmed = result.winner, result.confirmed
    search = None
    if winner.latency is not None:
        search = {"p50_ms": winner.latency.p50, "base_p50_ms": (
            winner.base_latency.p50 if winner.base_latency else None),
            "speedup": winner.speedup, "speedup_ci": (
                [winner.paired.ci_low, winner.paired.ci_high] if winner.paired else None),
            "noisy": winner.noisy}
    out: dict[str, Any] = {"speedup": round(result.winner_speedup, 4), "search": search,
                           "confirmed": None}
    if confirmed is not None:
        p = confirmed.paired
        out["confirmed"] = {"p50_ms": confirmed.latency.p50,
                            "base_p50_ms": confirmed.base_latency.p50,
                            "speedup": p.value, "speedup_ci": [p.ci_low, p.ci_high],
                            "pairs": p.pairs, "drift": p.drift,
                            "busy": confirmed.conditions.get("busy", "")}
    return out


MIN_WORKER_MEMORY_MB = 512
"""The smallest ``--worker-memory``: a worker maps about 400 MiB of libraries."""


def _check_workers(opts: TuneOptions) -> None:
    """Refuse worker settings that cannot work.

    Raises:
        UsageError: No build worker or more than CPU cores, a timeout that is not a
            positive finite number, too little memory, or worker settings with
            ``--in-process``.
    """
    cores = os.cpu_count() or 1
    if not 1 <= opts.build_workers <= cores:
        raise UsageError(f"--build-workers {opts.build_workers}: give 1 to {cores} (this "
                         f"machine's CPU cores; each build worker is a process)")
    if not (math.isfinite(opts.trial_timeout_s) and opts.trial_timeout_s > 0):
        raise UsageError(f"--trial-timeout {opts.trial_timeout_s}: give a positive number of "
                         "seconds")
    memory = opts.worker_memory_mb
    if memory is not None and memory < MIN_WORKER_MEMORY_MB:
        raise UsageError(f"--worker-memory {memory}: give at least {MIN_WORKER_MEMORY_MB} "
                         "(MiB); a worker maps about 400 MiB of libraries before any trial")
    changed = [flag for flag, used in (
        ("--build-workers", opts.build_workers != 1),
        ("--trial-timeout", opts.trial_timeout_s != DEFAULT_TIMEOUT_S),
        ("--worker-memory", memory is not None)) if used]
    if opts.in_process and changed:
        raise UsageError(f"--in-process with {', '.join(changed)}: trials in this process "
                         "have no workers, timeouts or memory limits; drop one or the other")


def _backend(registry: Registry, name: str) -> Backend:
    backend = registry.backend(name)()
    reason = backend.available()
    if reason:
        raise UsageError(f"--backend {name}: not available here ({reason})")
    return backend


def _check_named(names: Sequence[str], infos: Sequence[SeasoningInfo],
                 not_applicable: Mapping[str, str]) -> None:
    """Refuse a ``--seasonings`` list from which no route can be built.

    Raises:
        UsageError: None of the named seasonings applies here, or ``precision-repair``
            is named without a precision seasoning to repair.
    """
    searched = [i for i in infos if i.searched]
    if any(i.name == REPAIR for i in infos) and not any(i.stage == "precision"
                                                        for i in searched):
        raise UsageError(f"--seasonings {','.join(names)}: {REPAIR} repairs the failures of a "
                         "precision seasoning; add fp16, bf16, int8-qdq or fp8-qdq")
    if not searched:
        why = "; ".join(f"{n}: {r}" for n, r in not_applicable.items())
        why = f" ({why})" if why else ""
        raise UsageError(f"--seasonings {','.join(names)}: none applies here{why}; "
                         "see `routetune seasonings`")


def _offered(
    registry: Registry, backend: Backend, model: PreparedModel, names: tuple[str, ...] | None
) -> tuple[list[SeasoningInfo], dict[str, str]]:

    graph = import_graph(model.proto, model.weights)
    # Unasked, a seasoning made for other backends is left out, not listed as skipped.
    chosen = names if names is not None else tuple(
        n for n, e in sorted(registry.seasonings.items())
        if not e.item.info.backends or backend.name in e.item.info.backends)
    infos: list[SeasoningInfo] = []
    skipped: dict[str, str] = {}
    for name in chosen:
        cls = registry.seasoning(name)
        if name in backend.base_pipeline:
            if names is not None:
                raise UsageError(f"--seasonings: '{name}' is part of the {backend.name} "
                                 "backend's base pipeline, applied before every build; "
                                 "leave it out")
            continue
        try:
            reason = cls().applicable(graph, backend)
        except Exception as e:  # a plugin's check must not stop the run
            reason = f"applicable() raised {type(e).__name__}: {e}"
        if reason:
            skipped[name] = reason
        else:
            infos.append(cls.info)
    return infos, skipped
