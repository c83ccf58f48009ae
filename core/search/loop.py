"""The search loop: apply a route, build its engine, check accuracy, measure, store.

The loop owns everything a strategy must not do: building, timing, budgets and
persistence. A failure inside one candidate becomes that trial's status and reason;
the search goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

import routetune
from routetune.accuracy import Constraint, check_accuracy
from routetune.backend import Backend, Runner
from routetune.errors import (
    BackendError,
    EngineNotRunnable,
    PluginError,
    PostconditionError,
    RoutetuneError,
    SeasoningError,
)
from routetune.measure import Latency, MeasureSettings, measure, measure_side_by_side
from routetune.model import PreparedModel, check_candidate, sha256
from routetune.registry import Registry
from routetune.route import Route, Step
from routetune.search.repair import bisect_repair, repair_route, repairs
from routetune.search.strategy import Strategy
from routetune.seasoning import Lowering, RouteContext, RouteState
from routetune.store import Trial, TrialStore
from routetune.strict_fp16 import mentions_float16, strict_fp16_overflows

logger = logging.getLogger(__name__)

SNAPSHOTS = 16
"""Model snapshots kept at route prefixes (branch points), least recently used out."""

Snapshot = tuple[bytes, list[dict[str, Any]], Lowering | None]
"""A route prefix's model, its pass records, and its precision step's `Lowering`."""


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
    """Evaluates routes for one model, backend, input set and constraint.

    Args:
        registry: The installed plugins.
        model: The model after the base pipeline.
        backend: The backend that builds and runs engines.
        feeds: The validation input sets.
        references: The reference outputs, one mapping per input set.
        constraint: The accuracy constraint.
        store: The trial store.
        outdir: The output directory; candidate models go under ``artifacts/``.
        measure_settings: How long to time each candidate.
        settings_hash: sha256 of the inputs, constraint and measurement settings.
        reference: The backend that runs models in FP32 for precision seasonings
            (`Backend.evaluate`); None for none.
        repair: Whether, after each batch of routes, the fastest route that failed the
            accuracy constraint is repaired, once per precision seasoning, with
            ``precision-repair`` trials (`routetune.search.repair`). Those trials are
            stored and compete for the win, but are not told to the strategy.
        base: Graph and precision steps applied to every route, the base route
            included (a recipe's ``base``), after the backend's base pipeline.
        base_settings: Build options every route starts from (a recipe's backend
            options).
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
        measure_settings: MeasureSettings,
        settings_hash: str,
        reference: Backend | None = None,
        repair: bool = False,
        base: Route | None = None,
        base_settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.registry = registry
        self.model = model
        self.backend = backend
        self.feeds = feeds
        self.references = references
        self.constraint = constraint
        self.store = store
        self.outdir = outdir
        self.measure_settings = measure_settings
        self.settings_hash = settings_hash
        self.reference = reference
        self.repair = repair
        self.base = base or Route()
        self.base_settings = dict(base_settings or {})
        self._repaired: set[str] = set()  # precision seasonings repaired already
        self.stopped: str | None = None
        """Why the last `run` stopped before the strategy was done, or None."""
        self.device = backend.device()
        self.versions = _versions(backend)
        self.workdir = outdir / "artifacts"
        self._snapshots: OrderedDict[Route, Snapshot] = OrderedDict()
        self.base_data, self.base_passes = self._base_pipeline()
        self._snapshots[Route()] = (self.base_data, self.base_passes, None)
        self._base: Runner | bool | None = None
        self._candidates = {
            t.candidate_sha256: t.route for t in store.trials()
            if t.candidate_sha256 and t.status != "skipped"
            and (t.model_sha256, t.backend, t.device, t.settings_hash) == self._key()
        }

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
            budget: Trial and time limits; the best so far stands when one is reached.
            on_trial: Called after each trial with the trial and whether it came from
                the store.
            pinned: Routes always tried, right after the base route (a recipe's
                ``routes``); told to the strategy like its own.

        Returns:
            Every trial of this search, the base route's first. Ctrl-C (SIGINT) stops it
            like a budget: the trial in flight is dropped (redone on resume), `stopped`
            says so, and the trials so far are returned.

        Raises:
            KeyboardInterrupt: Ctrl-C before the base route was measured.
        """
        started = time.monotonic()
        trials: list[Trial] = []
        seen: set[str] = set()
        self.stopped = None

        def visit(route: Route, tell: bool = True) -> Trial | None:
            if budget.max_trials is not None and len(trials) >= budget.max_trials:
                self.stopped = f"--max-trials {budget.max_trials} reached"
                return None
            if budget.time_s is not None and time.monotonic() - started >= budget.time_s:
                self.stopped = f"--time-budget {budget.time_s:g} s reached"
                return None
            trial, cached = self.evaluate(route)
            if trial.fingerprint not in seen:  # a pinned route the strategy asks again
                seen.add(trial.fingerprint)
                trials.append(trial)
            if tell:
                strategy.tell(route, trial)
            on_trial(trial, cached)
            return trial

        try:
            self._search(strategy, visit, trials, pinned)
        except KeyboardInterrupt:
            if not trials:  # not even the base route: nothing to stand on
                raise
            self.stopped = "interrupted (Ctrl-C): no new trials; the best so far stands"
        return trials

    def _search(self, strategy: Strategy, visit: Callable[..., Trial | None],
                trials: list[Trial], pinned: Sequence[Route]) -> None:
        """The base route, the pinned routes, the strategy's batches and the repairs."""
        visit(Route())
        for route in pinned:
            if not route.is_base and visit(route) is None:
                return
        while batch := strategy.ask():
            done = [(route, trial) for route in batch if (trial := visit(route)) is not None]
            if len(done) < len(batch):
                return
            if self.repair:
                for route, at, why_not in repairs(done, self.registry, self._repaired):
                    if why_not:
                        trials.append(self.record_skipped(repair_route(route, at, 1), why_not))
                        continue
                    self._repaired.add(route.steps[at - 1].name)
                    bisect_repair(route, at, lambda r: visit(r, tell=False),
                                  lambda r, why: trials.append(self.record_skipped(r, why)))
                if self.stopped:
                    return

    def evaluate(self, route: Route) -> tuple[Trial, bool]:
        """Return the stored trial of `route`, or build, check, measure and store it.

        Returns:
            The trial, and whether it came from the store.
        """
        fingerprint = self.fingerprint(route)
        stored = self.store.get(fingerprint)
        if stored is not None:
            return stored, True
        trial = self._trial(route, fingerprint)
        logger.info("%s: %s %s", route, trial.status, trial.reason)
        return self.store.add(trial), False

    def side_by_side(self, trials: Sequence[Trial]) -> list[Latency]:
        """Rebuild stored trials' engines and time them in one interleaved loop.

        Returns:
            One latency per trial (ms), measured under the same machine conditions.

        Raises:
            BuildError: An engine could not be rebuilt.
        """
        runners = []
        try:
            for t in trials:
                engine = self.backend.build(self.outdir / t.artifact, t.settings, self.workdir,
                                            t.fingerprint)
                runners.append(self.backend.open(engine))
            return measure_side_by_side(runners, self.feeds, self.measure_settings)
        finally:
            for runner in runners:
                runner.close()

    def outputs(self, trial: Trial) -> list[dict[str, np.ndarray]] | None:
        """Rebuild a stored trial's engine and run it on every input set.

        Returns:
            One mapping of output name to array per input set; None when the trial
            has no candidate model or this device cannot run its engine.
        """
        if not trial.artifact:
            return None
        engine = self.backend.build(self.outdir / trial.artifact, trial.settings,
                                    self.workdir, trial.fingerprint)
        try:
            runner = self.backend.open(engine)
        except EngineNotRunnable:
            return None
        with runner:
            return [runner.infer(feed) for feed in self.feeds]

    def record_skipped(self, route: Route, reason: str) -> Trial:
        """Store a route that was not built (a seasoning that does not apply)."""
        fingerprint = self.fingerprint(route)
        stored = self.store.get(fingerprint)
        if stored is not None:
            return stored
        return self.store.add(self._record(route, fingerprint, "skipped", reason))

    def _record(self, route: Route, fingerprint: str, status: str, reason: str,
                **fields: Any) -> Trial:
        return Trial(
            fingerprint, self.model.source_sha256, str(route), self.backend.name,
            self.device, self.settings_hash, status, reason, versions=self.versions, **fields,
        )

    def _trial(self, route: Route, fingerprint: str) -> Trial:
        try:
            data, passes, settings = self.apply(route)
        except (SeasoningError, PostconditionError, BackendError, PluginError) as e:
            return self._record(route, fingerprint, "build-failed", str(e))
        candidate = sha256(data + json.dumps(settings, sort_keys=True).encode())
        same = self._candidates.get(candidate)
        if same is not None and same != str(route):
            return self._record(
                route, fingerprint, "skipped", f"same model and settings as route '{same}'",
                candidate_sha256=candidate, passes=tuple(passes),
            )
        artifact = self.save_model(data)
        fields: dict[str, Any] = {
            "candidate_sha256": candidate, "passes": tuple(passes), "settings": settings,
            "artifact": str(artifact.relative_to(self.outdir)),
        }
        try:
            t0 = time.perf_counter_ns()
            engine = self.backend.build(artifact, settings, self.workdir, fingerprint)
            fields["build_ms"] = (time.perf_counter_ns() - t0) / 1e6
            fields["engine_bytes"] = engine.size_bytes
        except (RoutetuneError, Exception) as e:  # a backend may raise anything
            return self._record(route, fingerprint, "build-failed", _describe(e), **fields)
        self._candidates.setdefault(candidate, str(route))
        try:
            runner = self.backend.open(engine)
        except EngineNotRunnable as e:
            built = f"built ({engine.size_bytes} bytes in {fields['build_ms'] / 1000:.2f} s)"
            return self._record(route, fingerprint, "build-only", f"{built}, not run: {e}",
                                **fields)
        except Exception as e:  # a crash inside one candidate never stops the search
            return self._record(route, fingerprint, "crashed", _describe(e), **fields)
        try:
            with runner:
                outputs = [runner.infer(feed) for feed in self.feeds]
                verdict = check_accuracy(self.constraint, self.registry, outputs, self.references)
                fields["accuracy"] = verdict.metrics
                overflows = self._strict_fp16(data, settings) if verdict.passed else None
                fields["latency"], fields["base_latency"] = self._measure(runner, route)
        except Exception as e:  # a crash inside one candidate never stops the search
            return self._record(route, fingerprint, "crashed", _describe(e), **fields)
        if not verdict.passed:
            return self._record(route, fingerprint, "accuracy-failed", verdict.reason, **fields)
        if overflows:
            return self._record(
                route, fingerprint, "accuracy-failed",
                "strict FP16 check (this device computes float16 in float32): "
                + "; ".join(overflows.values()), **fields)
        notes = list(verdict.notes)
        if overflows is not None:
            notes.append("strict FP16 check: no overflow")
        return self._record(route, fingerprint, "ok", "; ".join(notes), **fields)

    def _strict_fp16(self, data: bytes, settings: Mapping[str, Any]) -> dict[str, str] | None:
        """Overflows a float16 device would show, where this one emulates float16.

        Returns:
            None when the check does not apply (a device with true float16, or no
            float16 tensor); else the overflowing nodes (empty: none).
        """
        if self.reference is None or not self.backend.emulates("float16", settings):
            return None
        model = onnx.load_from_string(data)
        if not mentions_float16(model):
            return None
        reference, feeds = self.reference, list(self.feeds)
        return strict_fp16_overflows(model, lambda m: reference.evaluate(m, feeds))

    def _measure(self, runner: Runner, route: Route) -> tuple[Latency, Latency | None]:
        """Time a candidate in alternating blocks with the base route's engine.

        Returns:
            The candidate's latency and the base route's, measured side by side (for the
            base route itself, the same latency twice). Without a base engine, the
            candidate's alone and None.
        """
        if route.is_base:
            latency = measure(runner, self.feeds, self.measure_settings)
            return latency, latency
        base = self._base_runner()
        if base is None:
            return measure(runner, self.feeds, self.measure_settings), None
        latency, base_latency = measure_side_by_side([runner, base], self.feeds,
                                                     self.measure_settings)
        return latency, base_latency

    def _base_runner(self) -> Runner | None:
        """The base route's engine, opened once and kept for paired measurements."""
        if self._base is None:
            path = self.save_model(self.base_data)
            try:
                engine = self.backend.build(path, self.backend.full_settings(self.base_settings),
                                            self.workdir, self.fingerprint(Route()))
                self._base = self.backend.open(engine)
            except Exception as e:  # the base trial records the same failure
                logger.warning("base route cannot be built for paired timing: %s", e)
                self._base = False
        return self._base or None

    def close(self) -> None:
        """Close the base route's engine."""
        if self._base:
            self._base.close()
        self._base = None

    def _base_pipeline(self) -> tuple[bytes, list[dict[str, Any]]]:
        """Apply the backend's base pipeline (`Backend.base_pipeline`) to the model.

        Returns:
            The model every route starts from, and one pass record per step.

        Raises:
            SeasoningError: A step failed; no route can be built.
            PostconditionError: A step broke the model or its signature.
        """
        steps = [Step(name) for name in self.backend.base_pipeline] + list(self.base)
        if not steps:
            return self.model.data, []
        state = RouteState(gs.import_onnx(self.model.proto))
        passes = []
        for step in steps:
            record = self._step(step, state, Route())
            passes.append({**record, "base_pipeline": True})
        exported = gs.export_onnx(state.graph)
        check_candidate(exported, self.model.signature)
        return exported.SerializeToString(), passes

    def apply(self, route: Route) -> tuple[bytes, list[dict[str, Any]], dict[str, Any]]:
        """Apply a route's steps to the prepared model, from the longest snapshot.

        Returns:
            The candidate model (serialized), one pass record per step, and the full
            build settings.

        Raises:
            SeasoningError: A step failed.
            PostconditionError: A step broke the model or its signature.
            BackendError: The settings are not the backend's.
        """
        stage = {s.name: self.registry.seasoning(s.name).info.stage for s in route}
        model_steps = [s for s in route if stage[s.name] != "build"]
        build_steps = [s for s in route if stage[s.name] == "build"]
        k = max(i for i in range(len(model_steps) + 1) if Route(tuple(model_steps[:i]))
                in self._snapshots)
        prefix = Route(tuple(model_steps[:k]))
        self._snapshots.move_to_end(prefix)
        data, passes, lowered = self._snapshots[prefix]
        passes = list(passes)
        state = RouteState(gs.import_onnx(onnx.load_from_string(data)) if model_steps[k:] else None,
                           settings=dict(self.base_settings), lowered=lowered)
        for i in range(k, len(model_steps)):
            passes.append(self._step(model_steps[i], state, Route(tuple(model_steps[:i]))))
            exported = gs.export_onnx(state.graph)
            check_candidate(exported, self.model.signature)
            data = exported.SerializeToString()
            self._snapshot(Route(tuple(model_steps[: i + 1])), (data, passes, state.lowered))
        for i, step in enumerate(build_steps):
            passes.append(self._step(step, state, Route(tuple(model_steps + build_steps[:i]))))
        return data, passes, self.backend.full_settings(state.settings)

    def _step(self, step: Step, state: RouteState, applied: Route) -> dict[str, Any]:
        seasoning = self.registry.seasoning(step.name)(dict(step.params))
        evaluate = None
        if self.reference is not None:
            reference, feeds = self.reference, list(self.feeds)
            evaluate = lambda model: reference.evaluate(model, feeds)  # noqa: E731
        ctx = RouteContext(self.backend, tuple(self.feeds), str(applied), evaluate)
        t0 = time.perf_counter_ns()
        try:
            result = seasoning(state, ctx)
        except PluginError:
            raise
        except Exception as e:
            raise SeasoningError(step.name, str(applied), _describe(e)) from e
        ms = (time.perf_counter_ns() - t0) / 1e6
        return {"step": str(step), "modified": result.modified, "stats": dict(result.stats),
                "note": result.note, "ms": round(ms, 3)}

    def _snapshot(self, prefix: Route, snapshot: Snapshot) -> None:
        data, passes, lowered = snapshot
        self._snapshots[prefix] = (data, list(passes), lowered)
        while len(self._snapshots) > SNAPSHOTS:
            oldest = next(iter(self._snapshots))
            if oldest.is_base:
                self._snapshots.move_to_end(oldest)
                oldest = next(iter(self._snapshots))
            del self._snapshots[oldest]

    def save_model(self, data: bytes) -> Path:
        """Keep a candidate model under ``artifacts/models/<sha256[:16]>.onnx``; its path."""
        path = self.outdir / "artifacts" / "models" / f"{sha256(data)[:16]}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return path


def _describe(e: BaseException) -> str:
    if isinstance(e, RoutetuneError):
        return " ".join(str(e).split())
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:600]


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
