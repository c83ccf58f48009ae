"""One candidate's work: apply a route, build its engine, check its accuracy, time it.

This is what an executor's workers run (`routetune.search.executor`); the search loop
(`routetune.search.loop`) decides which routes to try and stores the outcomes. A trial
has two phases, so that an executor can run builds (CPU-heavy) apart from measurement
(which needs a quiet device):

- `Candidate.build`: apply the route's seasonings to the model, keep the candidate
  model under ``artifacts/models/``, and build its engine once, to find build failures
  and time the build. Models of route prefixes are kept in memory and on disk, so that
  a route that extends another (``fp16,nhwc`` after ``fp16``) starts from its model,
  whichever worker built it.
- `Candidate.measure`: build (or load) the engine again, run it on every input set,
  check the accuracy constraint against the FP32 reference, and time it in alternating
  blocks with the base route's engine (`routetune.measure.measure_blocks`).

Failure contract: a seasoning refuses a route by raising `ValueError` or a
`routetune.errors.RoutetuneError` (status ``build-failed``); a backend by raising
`BuildError`. Any other exception is a bug somewhere in the candidate's code path and
gives status ``crashed``, with the exception and the innermost frame of its traceback.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import re
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.accuracy import Constraint, check_accuracy
from routetune.backend import Backend, Engine, Runner
from routetune.conditions import BusyPolicy, measure_watched
from routetune.errors import (
    BuildError,
    EngineNotRunnable,
    PluginError,
    PostconditionError,
    RoutetuneError,
    SeasoningError,
    one_line,
)
from routetune.measure import (
    Latency,
    MeasureSettings,
    Speedup,
    measure,
    measure_blocks,
    paired_speedup,
)
from routetune.model import PreparedModel, cast_faults, check_candidate, sha256, toposort
from routetune.profile import ShapeProfile
from routetune.registry import Registry
from routetune.route import Route, Step, parse_route
from routetune.seasoning import Lowering, RouteContext, RouteState
from routetune.strict_fp16 import mentions_float16, strict_fp16_overflows
from routetune.weights import externalize, import_graph, intact

logger = logging.getLogger(__name__)

MODELS = "artifacts/models"
"""Candidate models, relative to the output directory; for a model with external data
also its weights store (``weights/``, `routetune.weights`)."""

SNAPSHOTS = 16
"""Model snapshots kept at route prefixes (branch points), least recently used out."""

# Why `gc.collect()` after each pass: onnx-graphsurgeon's graphs are reference cycles
# (nodes and tensors point at each other), so a pass's discarded graph, and the weights it
# loaded, wait for Python's cyclic collector, which counts objects, not bytes. For a
# 2.5 GiB model a finished fp16 pass left 1x the model's size in float32 arrays behind
# until the next collection (docs/benchmarks.md, "Models over 2 GiB").

BUILT = "built"
"""`Outcome.status` of a build phase that succeeded: the trial goes on to `measure`."""

Snapshot = tuple[bytes, list[dict[str, Any]], Lowering | None]
"""A route prefix's model, its pass records, and its precision step's `Lowering`."""


class SeasoningCrashed(Exception):
    """A seasoning raised something other than `ValueError` or a routetune error."""

    def __init__(self, seasoning: str, applied: str, error: BaseException) -> None:
        super().__init__(f"seasoning '{seasoning}' crashed after '{applied}': "
                         f"{describe(error, where=True)}")


@dataclass(frozen=True)
class TrialInputs:
    """Everything a candidate's work needs; picklable, so that a worker process gets it.

    Args:
        model: The prepared model.
        backend: The backend's name (looked up in the registry).
        profile: The optimisation profile the backend builds for.
        feeds: The validation input sets (input name to array).
        references: The FP32 reference outputs, one mapping per input set.
        constraint: The accuracy constraint.
        outdir: The output directory; models and engines go under ``artifacts/``.
        measure: How long to time each candidate.
        base_data: The model after the base pipeline (`base_pipeline`), serialized.
        base_settings: Build options every route starts from (a recipe's backend
            options).
        base_passes: The pass records of the base pipeline, recorded with every trial.
        reference: Whether precision seasonings and the strict FP16 check may run
            models in FP32 on ONNX Runtime's CPU provider.
        busy: What a measurement does on a busy machine (``--busy-machine``); its
            ``gpu`` is filled in by the measuring worker.
    """

    model: PreparedModel
    backend: str
    profile: ShapeProfile | None
    feeds: tuple[Mapping[str, np.ndarray], ...]
    references: tuple[Mapping[str, np.ndarray], ...]
    constraint: Constraint
    outdir: Path
    measure: MeasureSettings
    base_data: bytes
    base_settings: Mapping[str, Any] = field(default_factory=dict)
    base_passes: tuple[Mapping[str, Any], ...] = ()
    reference: bool = True
    busy: BusyPolicy = BusyPolicy()


@dataclass(frozen=True)
class Recorded:
    """What the trial store recorded of a trial's build, to check files against.

    Args:
        candidate: `Trial.candidate_sha256`: sha256 of the candidate model's bytes
            followed by its full settings as sorted JSON, hex.
        engine: `Trial.engine_sha256`: sha256 of the kept engine file, hex; empty when
            the backend keeps none.
    """

    candidate: str
    engine: str = ""


CONFIRM_BLOCKS = 30
"""Blocks per engine at least in a confirmation (`Candidate.confirm`), 3x a trial's."""


@dataclass(frozen=True)
class Confirmation:
    """A route re-measured against the base route in a fresh process (`Candidate.confirm`).

    Args:
        route: The route's text.
        latency: Its latency in this measurement (ms).
        base_latency: The base route's, in the same loop (ms).
        paired: The paired speed-up.
        conditions: The machine's conditions meanwhile (`routetune.conditions`).
    """

    route: str
    latency: Latency
    base_latency: Latency
    paired: Speedup
    conditions: Mapping[str, Any]

@dataclass(frozen=True)
class Outcome:
    """What one phase of a trial found.

    Args:
        status: A trial status (`routetune.store.STATUSES`), or `BUILT` after a build
            phase that succeeded.
        reason: One line: why the trial is not ``ok``, or notes.
        fields: `routetune.store.Trial` fields found so far (``passes``, ``settings``,
            ``artifact``, ``build_ms``, ``latency`` …).
    """

    status: str
    reason: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)


class Candidate:
    """Builds, checks and times routes of one model on one backend, in this process.

    Args:
        registry: The installed plugins.
        inputs: The model, inputs, constraint and settings.
        backend: The backend instance; default: a new one from the registry.
        reference: The FP32 reference backend (ONNX Runtime, CPU); default: from the
            registry when ``inputs.reference`` is set.
    """

    def __init__(self, registry: Registry, inputs: TrialInputs, backend: Backend | None = None,
                 reference: Backend | None = None) -> None:
        self.registry = registry
        self.inputs = inputs
        self.backend = backend or registry.backend(inputs.backend)(inputs.profile)
        if reference is None and inputs.reference:
            reference = (self.backend if self.backend.name == "onnxruntime"
                         else registry.backend("onnxruntime")())
        self.reference = reference
        self.outdir = inputs.outdir
        self.workdir = inputs.outdir / "artifacts"
        self.store = inputs.model.weights  # external data: the folder it lives in
        self._snapshots: OrderedDict[Route, Snapshot] = OrderedDict()
        self._snapshots[Route()] = (inputs.base_data, [dict(p) for p in inputs.base_passes],
                                    None)
        self._base: Runner | Literal[False] | None = None  # False: cannot be built
        self._salt: str | None = None  # see _shared_path
        self._gpu: str | None = None  # see _policy

    def build(self, route: Route, fingerprint: str) -> Outcome:
        """Apply `route` and build its engine once.

        Returns:
            `BUILT` with ``candidate_sha256``, ``passes``, ``settings``, ``artifact``,
            ``build_ms`` (ms), ``engine_bytes`` (bytes) and ``engine_sha256`` (of a kept
            engine file, else empty); else ``build-failed`` or ``crashed`` with the
            reason.
        """
        try:
            data, passes, settings = self.apply(route)
        except (RoutetuneError, ValueError) as e:
            return Outcome("build-failed", describe(e))
        except Exception as e:  # a bug in a seasoning: the search goes on
            return Outcome("crashed", describe(e))
        finally:
            gc.collect()  # the passes' graphs, before the engine needs the memory
        artifact = self.save_model(data)
        fields: dict[str, Any] = {
            "candidate_sha256": sha256(data + json.dumps(settings, sort_keys=True).encode()),
            "passes": tuple(passes), "settings": settings,
            "artifact": str(artifact.relative_to(self.outdir)),
        }
        try:
            t0 = time.perf_counter_ns()
            engine = self.engine(artifact, settings, fingerprint, "")
            fields["build_ms"] = (time.perf_counter_ns() - t0) / 1e6
            fields["engine_bytes"] = engine.size_bytes
            fields["engine_sha256"] = engine.sha256
        except Exception as e:  # a backend may raise anything for a model it refuses
            return Outcome("build-failed", describe(e), fields)
        return Outcome(BUILT, "", fields)

    def measure(self, route: Route, fingerprint: str, built: Mapping[str, Any]) -> Outcome:
        """Run a built candidate, check its accuracy and time it.

        Args:
            route: The route.
            fingerprint: The trial's fingerprint (names a kept engine file).
            built: The fields of its `BUILT` outcome.

        Returns:
            ``ok``, ``accuracy-failed``, ``build-only`` or ``crashed``, with ``accuracy``,
            ``latency`` and ``base_latency`` (ms), ``paired`` (the paired speed-up),
            ``conditions`` and ``noisy`` (`routetune.conditions`) added to `built`.
        """
        fields = dict(built)
        settings = fields["settings"]
        try:
            engine = self.engine(self.outdir / fields["artifact"], settings, fingerprint,
                                 fields.get("engine_sha256", ""))
            runner = self.backend.open(engine)
        except EngineNotRunnable as e:
            built_text = (f"built ({fields['engine_bytes']} bytes in "
                          f"{fields['build_ms'] / 1000:.2f} s)")
            return Outcome("build-only", f"{built_text}, not run: {e}", fields)
        except BuildError as e:  # the backend refused to load it: its own message
            return Outcome("build-failed", describe(e), fields)
        except Exception as e:  # a crash inside one candidate never stops the search
            return Outcome("crashed", describe(e), fields)
        feeds, inputs = self.inputs.feeds, self.inputs
        try:
            with runner:
                outputs = [runner.infer(feed) for feed in feeds]
                verdict = check_accuracy(inputs.constraint, self.registry, outputs,
                                         list(inputs.references))
                fields["accuracy"] = verdict.metrics
                overflows = None
                if verdict.passed:
                    data = (self.outdir / fields["artifact"]).read_bytes()
                    overflows = self._strict_fp16(data, settings)
                (fields["latency"], fields["base_latency"], fields["paired"]), conditions = (
                    measure_watched(self._policy(), self._status(),
                                    lambda: self._measure(runner, route)))
                fields["conditions"], fields["noisy"] = conditions, conditions["busy"]
        except Exception as e:  # a crash inside one candidate never stops the search
            return Outcome("crashed", describe(e), fields)
        if not verdict.passed:
            return Outcome("accuracy-failed", verdict.reason, fields)
        if overflows:
            return Outcome("accuracy-failed",
                           "strict FP16 check (this device computes float16 in float32): "
                           + "; ".join(overflows.values()), fields)
        notes = list(verdict.notes)
        if overflows is not None:
            notes.append("strict FP16 check: no overflow")
        return Outcome("ok", "; ".join(notes), fields)

    def confirm(self, route: str, artifact: str, settings: Mapping[str, Any],
                fingerprint: str, recorded: Recorded) -> Confirmation:
        """Re-measure a route against the base route, both engines built anew.

        Meant for a fresh worker process: nothing of the search's sessions is reused.
        The two engines are timed in paired blocks (`CONFIRM_BLOCKS` at least, and 3x
        the search's minimum time), under the busy-machine policy.

        Args:
            route: The route's text (recorded).
            artifact: Its candidate model's path relative to the output directory.
            settings: Its full build settings.
            fingerprint: Its trial fingerprint.
            recorded: What the trial store recorded for it (`Recorded`).

        Raises:
            BuildError: An engine could not be rebuilt.
        """
        path = self.checked_model(route, artifact, settings, recorded)
        base_path = self.save_model(self.inputs.base_data)
        base_settings = self.backend.full_settings(self.inputs.base_settings)
        m = self.inputs.measure
        settings_ = replace(m, min_blocks=max(CONFIRM_BLOCKS, m.min_blocks),
                            min_time_s=3 * m.min_time_s, max_time_s=3 * m.max_time_s)
        runners: list[Runner] = []
        try:
            for model, options, key, sha in ((path, settings, fingerprint, recorded.engine),
                                             (base_path, base_settings, "", "")):
                runners.append(self.backend.open(self.engine(model, options, key, sha)))

            def timed() -> tuple[list[Latency], Speedup]:
                latencies, blocks = measure_blocks(runners, self.inputs.feeds, settings_)
                return latencies, paired_speedup(blocks, 0, 1)

            (latencies, paired), conditions = measure_watched(self._policy(),
                                                              self._status(), timed)
        finally:
            for runner in runners:
                runner.close()
        return Confirmation(route, latencies[0], latencies[1], paired, conditions)

    def outputs(self, route: str, artifact: str, settings: Mapping[str, Any],
                fingerprint: str, recorded: Recorded) -> list[dict[str, np.ndarray]] | None:
        """Build a stored trial's engine and run it on every input set.

        Args: as `confirm`'s.

        Returns:
            One mapping of output name to array per input set; None when this device
            cannot run the engine.
        """
        path = self.checked_model(route, artifact, settings, recorded)
        engine = self.engine(path, settings, fingerprint, recorded.engine)
        try:
            runner = self.backend.open(engine)
        except EngineNotRunnable:
            return None
        with runner:
            return [runner.infer(feed) for feed in self.inputs.feeds]

    def engine(self, model: Path, settings: Mapping[str, Any], key: str, recorded: str
               ) -> Engine:
        """`build_engine` with this candidate's backend and ``artifacts`` folder."""
        return build_engine(self.backend, model, settings, self.workdir, key, recorded)

    def checked_model(self, route: str, artifact: str, settings: Mapping[str, Any],
                      recorded: Recorded) -> Path:
        """A stored trial's candidate model, checked against its record, else made again.

        The file under ``artifacts/models/`` is used when the sha256 of its bytes and
        the settings is the trial's `Trial.candidate_sha256`; otherwise (a damaged or
        planted file) the route is applied again to make it.

        Raises:
            SeasoningError: The route no longer applies.
        """
        path = self.outdir / artifact
        if matches_record(path, settings, recorded.candidate):
            return path
        logger.info("%s is not the candidate model recorded for '%s'; applying the route "
                    "again", artifact, route)
        data, _, _ = self.apply(parse_route(route))
        return self.save_model(data)

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
        return strict_fp16_overflows(model, self._evaluate)

    def _evaluate(self, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
        """Run `model` in FP32 on the reference backend on every input set; all outputs.

        With external data, the tensors a pass wrote go to the weights store first, so
        that the model stays under protobuf's 2 GiB whatever its size (`model` changes).
        """
        assert self.reference is not None
        if self.store is not None:
            externalize(model, self.store)
        return self.reference.evaluate(model, list(self.inputs.feeds), weights=self.store)

    def _measure(self, runner: Runner, route: Route
                 ) -> tuple[Latency, Latency | None, Speedup | None]:
        """Time a candidate in paired blocks with the base route's engine.

        Returns:
            The candidate's latency, the base route's measured in the same loop, and the
            paired speed-up. For the base route itself, its latency twice and None;
            without a base engine, the candidate's latency alone and two Nones.
        """
        feeds, settings = self.inputs.feeds, self.inputs.measure
        if route.is_base:
            latency = measure(runner, feeds, settings)
            return latency, latency, None
        base = self._base_runner()
        if base is None:
            return measure(runner, feeds, settings), None, None
        (latency, base_latency), blocks = measure_blocks([runner, base], feeds, settings)
        return latency, base_latency, paired_speedup(blocks, 0, 1)

    def _policy(self) -> BusyPolicy:
        """The busy-machine policy, with this worker's GPU where engines run on one."""
        if self._gpu is None:
            gpus = self.backend.gpus(self.backend.full_settings(self.inputs.base_settings))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            self._gpu = (visible or gpus[0]).split(",")[0] if gpus else ""
        return replace(self.inputs.busy, gpu=self._gpu or None)

    def _status(self) -> Path:
        """This process's status file while it waits for a quiet machine."""
        return self.workdir / f"busy-{os.getpid()}.json"

    def _base_runner(self) -> Runner | None:
        """The base route's engine, opened once and kept for paired measurements."""
        if self._base is None:
            path = self.save_model(self.inputs.base_data)
            try:
                settings = self.backend.full_settings(self.inputs.base_settings)
                engine = self.backend.build(path, settings, self.workdir)
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

    def apply(self, route: Route) -> tuple[bytes, list[dict[str, Any]], dict[str, Any]]:
        """Apply a route's steps to the base model, from the longest snapshot.

        Returns:
            The candidate model (serialized), one pass record per step, and the full
            build settings.

        Raises:
            SeasoningError: A step raised `ValueError`.
            PostconditionError: A step broke the model or its signature.
            BackendError: The settings are not the backend's.
            SeasoningCrashed: A seasoning raised anything else (a bug: the trial crashed).
        """
        stage = {s.name: self.registry.seasoning(s.name).info.stage for s in route}
        model_steps = [s for s in route if stage[s.name] != "build"]
        build_steps = [s for s in route if stage[s.name] == "build"]
        k = max(i for i in range(len(model_steps) + 1) if Route(tuple(model_steps[:i]))
                in self._snapshots)
        for longer in range(len(model_steps), k, -1):  # another worker's, from disk
            shared = self._shared(Route(tuple(model_steps[:longer])))
            if shared is not None:
                k = longer
                self._snapshot(Route(tuple(model_steps[:k])), shared)
                break
        prefix = Route(tuple(model_steps[:k]))
        self._snapshots.move_to_end(prefix)
        data, passes, lowered = self._snapshots[prefix]
        passes = list(passes)
        proto = onnx.load_from_string(data) if model_steps[k:] else None
        state = RouteState(import_graph(proto, self.store) if proto is not None else None,
                           settings=dict(self.inputs.base_settings), lowered=lowered)
        signature = self.inputs.model.signature
        faults = cast_faults(proto) if proto is not None else frozenset()
        for i in range(k, len(model_steps)):
            passes.append(self.step(model_steps[i], state, Route(tuple(model_steps[:i]))))
            gc.collect()  # the pass's discarded graph (see the note at SNAPSHOTS)
            exported = self.export(state.graph)
            try:
                faults = check_candidate(exported, signature, faults, self.store)
            except PostconditionError as e:  # name the pass that broke the contract
                raise PostconditionError(f"after '{model_steps[i]}': {e}") from e
            data = exported.SerializeToString()
            self._snapshot(Route(tuple(model_steps[: i + 1])), (data, passes, state.lowered))
            self._share(Route(tuple(model_steps[: i + 1])), (data, passes, state.lowered))
        for i, step in enumerate(build_steps):
            passes.append(self.step(step, state, Route(tuple(model_steps + build_steps[:i]))))
        return data, passes, self.backend.full_settings(state.settings)

    def step(self, step: Step, state: RouteState, applied: Route) -> dict[str, Any]:
        """Apply one seasoning to `state`; its pass record.

        A graph or precision seasoning that is not applicable to the model as it stands
        (`Seasoning.applicable`: int8-qdq on a model with nothing to quantize) declines,
        whether the search, a pinned route or ``routetune build`` asked for it.

        Raises:
            SeasoningError: The seasoning is not applicable, or raised `ValueError` or a
                routetune error.
            SeasoningCrashed: The seasoning raised anything else (a bug).
        """
        seasoning = self.registry.seasoning(step.name)(dict(step.params))
        evaluate = self._evaluate if self.reference is not None else None
        ctx = RouteContext(self.backend, tuple(self.inputs.feeds), str(applied), evaluate,
                           self.store)
        t0 = time.perf_counter_ns()
        try:
            if state.graph is not None and seasoning.info.stage != "build":
                why = seasoning.applicable(state.graph, self.backend)
                if why:
                    raise SeasoningError(step.name, str(applied), f"not applicable: {why}")
            result = seasoning(state, ctx)
        except (PluginError, SeasoningError):
            raise
        except (RoutetuneError, ValueError) as e:
            raise SeasoningError(step.name, str(applied), describe(e)) from e
        except (Exception, SystemExit) as e:  # sys.exit() in a plugin is a crash too
            raise SeasoningCrashed(step.name, str(applied), e) from e
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

    def _shared_path(self, prefix: Route) -> Path:
        """The index entry of a prefix.

        Keyed by everything a graph or precision step may read: the base model, the
        backend, the profile, the input sets and the routetune version.
        """
        if self._salt is None:
            import routetune

            h = hashlib.sha256(self.inputs.base_data)
            h.update(f"{self.inputs.backend} {self.inputs.profile} {routetune.__version__}"
                     .encode())
            for feed in self.inputs.feeds:
                for name in sorted(feed):
                    h.update(name.encode() + str(feed[name].shape).encode())
                    h.update(np.ascontiguousarray(feed[name]).tobytes())
            self._salt = h.hexdigest()
        key = sha256(f"{self._salt} {prefix}".encode())
        return self.workdir / "prefixes" / f"{key[:32]}.json"

    def _share(self, prefix: Route, snapshot: Snapshot) -> None:
        """Keep a route prefix's model on disk, for the other workers of this search.

        The model goes to ``artifacts/models/`` like a candidate; the index entry,
        ``artifacts/prefixes/<key>.json``, is data only: the model's sha256, the pass
        records, and for a precision step's `Lowering` the seasoning's name and
        parameters and its graph (a model in ``artifacts/models/`` too, by sha256).
        Never pickle: an output folder may come from someone else, and reading it must
        not run code. Written atomically.
        """
        path = self._shared_path(prefix)
        if path.exists():
            return
        data, passes, lowered = snapshot
        self.save_model(data)
        entry: dict[str, Any] = {"model_sha256": sha256(data), "passes": passes}
        if lowered is not None:
            graph = self.export(lowered.graph).SerializeToString()
            self.save_model(graph)
            entry["lowered"] = {"seasoning": lowered.seasoning.info.name,
                                "params": dict(lowered.seasoning.params),
                                "model_sha256": sha256(graph)}
        try:
            text = json.dumps(entry)
        except (TypeError, ValueError) as e:  # a plugin's pass record that is not data
            logger.debug("route prefix '%s' not shared: %s", prefix, e)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def _shared(self, prefix: Route) -> Snapshot | None:
        """A route prefix's model that a worker of this search kept (`_share`), or None.

        An entry that does not read as one `_share` writes, or whose models are missing
        or do not match their sha256, is ignored: the prefix is built again.
        """
        try:
            entry = json.loads(self._shared_path(prefix).read_text())
            data = self._stored(entry["model_sha256"])
            lowered = None
            if entry.get("lowered") is not None:
                low = entry["lowered"]
                params = {k: tuple(v) if isinstance(v, list) else v  # JSON has no tuple
                          for k, v in low["params"].items()}
                seasoning = self.registry.seasoning(low["seasoning"])(params)
                graph = onnx.load_from_string(self._stored(low["model_sha256"]))
                lowered = Lowering(seasoning, import_graph(graph, self.store))
            passes = [dict(p) for p in entry["passes"]]
        except Exception as e:  # anything a planted or damaged file can cause: rebuild
            logger.debug("route prefix '%s' not taken from disk: %s", prefix, e)
            return None
        return data, passes, lowered

    def _stored(self, digest: str) -> bytes:
        """The model `save_model` kept for this sha256, checked against it.

        Raises:
            ValueError: `digest` is not a sha256, or the file's content does not match.
            OSError: No such file.
        """
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"not a sha256: {digest!r}")
        data = (self.outdir / MODELS / f"{digest[:16]}.onnx").read_bytes()
        if sha256(data) != digest:
            raise ValueError(f"{digest[:16]}.onnx does not match its sha256")
        return data

    def export(self, graph: gs.Graph) -> onnx.ModelProto:
        """`gs.export_onnx`, nodes sorted; with external data, new large tensors go to the store.

        Nodes are put in topological order (`routetune.model.toposort`, subgraphs' outer
        reads counted): a pass that appends nodes, or a tool that writes them out of
        order (ONNX Runtime's quantizer on graphs with ``If``), leaves a valid graph.
        The model stays small whatever its weights' size: tensors a pass left alone
        keep their locations, and those it wrote (`weights.MIN_EXTERNAL_BYTES` or more)
        are stored once each under ``artifacts/models/weights/``.
        """
        model = gs.export_onnx(graph)
        toposort(model.graph)  # a pass may leave nodes out of order: sorting is enforced
        if self.store is not None:
            externalize(model, self.store)
        return model

    def save_model(self, data: bytes) -> Path:
        """Keep a candidate model under ``artifacts/models/<sha256[:16]>.onnx``; its path."""
        return save_model(self.outdir, data)


def build_engine(backend: Backend, model: Path, settings: Mapping[str, Any], workdir: Path,
                 key: str, recorded: str) -> Engine:
    """`Backend.build`, opening a kept engine file only if it is the one recorded.

    A backend may hand back an engine file it kept under `key` (a TensorRT plan, on
    resume) instead of building (`Engine.reused`). That file came from the output
    folder, which someone else may have written, so it is used only when its sha256 is
    `recorded`, the hash this trial's build phase returned (and the trial store keeps);
    otherwise it is deleted and the engine built again. A sidecar beside the file
    cannot vouch for it: whoever edits one can edit both.

    Args:
        backend: The backend.
        model: The candidate model.
        settings: Full build settings.
        workdir: ``OUTDIR/artifacts``.
        key: The trial's fingerprint, or empty for an engine that is not kept.
        recorded: The engine's recorded sha256, hex; empty when none is (the build
            phase, or a store written before it was recorded).

    Raises:
        BuildError: The backend refused the model, or kept handing back a file.
    """
    engine = backend.build(model, settings, workdir, key)
    if engine.reused and engine.sha256 != recorded:
        logger.info("%s is not the engine recorded for this trial; building it again",
                    engine.path)
        engine.path.unlink(missing_ok=True)
        engine = backend.build(model, settings, workdir, key)
        if engine.reused:
            raise BuildError(f"the {backend.name} backend reused {engine.path} after it was "
                             "deleted; it must build an engine it has no file for")
    return engine


def matches_record(path: Path, settings: Mapping[str, Any], candidate_sha256: str | None
                   ) -> bool:
    """Whether a candidate model file is the one a trial recorded, weights included.

    Args:
        path: The model under ``artifacts/models/``.
        settings: The trial's full build settings.
        candidate_sha256: The trial's `Trial.candidate_sha256`.

    Returns:
        True when the sha256 of the file's bytes followed by the settings as sorted
        JSON is `candidate_sha256`, and each external data file it names still hashes
        to its name (`routetune.weights.intact`).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if sha256(data + json.dumps(settings, sort_keys=True).encode()) != candidate_sha256:
        return False
    try:
        model = onnx.load_from_string(data)
    except Exception:  # protobuf's DecodeError and others: not a model
        return False
    return intact(model, path.parent)


def save_model(outdir: Path, data: bytes) -> Path:
    """Keep a model under ``OUTDIR/artifacts/models/<sha256[:16]>.onnx``; its path.

    Written to a temporary name and renamed, so that two workers writing the same
    model, or a kill midway, never leave a partial file under the final name. A file
    already there with other content (damaged, or planted) is replaced.
    """
    path = outdir / MODELS / f"{sha256(data)[:16]}.onnx"
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def with_base_pipeline(registry: Registry, inputs: TrialInputs, backend: Backend,
                       reference: Backend | None, base: Sequence[Step] = ()
                       ) -> tuple[Candidate, list[dict[str, Any]]]:
    """A candidate whose routes start after the backend's base pipeline and `base`.

    Args:
        registry: The installed plugins.
        inputs: The trial inputs; their `TrialInputs.base_data` is replaced.
        backend: The backend, whose `Backend.base_pipeline` goes first.
        reference: The FP32 reference backend, or None.
        base: A recipe's base steps, applied after the backend's.

    Returns:
        The candidate (its ``inputs`` are what workers need), and one pass record per
        base step.

    Raises:
        SeasoningError: A step failed; no route can be built.
        PostconditionError: A step broke the model or its signature.
    """
    steps = [Step(name) for name in backend.base_pipeline] + list(base)
    model = inputs.model
    passes: list[dict[str, Any]] = []
    if not steps:
        data = model.data
    else:
        candidate = Candidate(registry, inputs, backend, reference)
        state = RouteState(import_graph(model.proto, model.weights))
        for step in steps:
            try:
                record = candidate.step(step, state, Route())
            except RoutetuneError:
                raise
            except Exception as e:
                raise SeasoningError(step.name, "base", describe(e)) from e
            passes.append({**record, "base_pipeline": True})
        exported = candidate.export(state.graph)
        check_candidate(exported, model.signature, cast_faults(model.proto), model.weights)
        data = exported.SerializeToString()
    inputs = replace(inputs, base_data=data, base_passes=tuple(passes))
    return Candidate(registry, inputs, backend, reference), passes


def describe(e: BaseException, where: bool = False) -> str:
    """One line about an exception: its type (unless a routetune error) and message.

    Args:
        e: The exception.
        where: Add the innermost traceback frame (file:line in function).
    """
    if isinstance(e, (RoutetuneError, SeasoningCrashed)):
        text = " ".join(str(e).split())
    elif isinstance(e, MemoryError):
        text = f"out of memory (MemoryError{': ' if str(e) else ''}{str(e)[:200]})"
    else:
        text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    frames = traceback.extract_tb(e.__traceback__) if where else []
    if frames:
        f = frames[-1]
        file = Path(f.filename)
        text += f" (at {file.parent.name}/{file.name}:{f.lineno} in {f.name})"
    return one_line(text, 600)
