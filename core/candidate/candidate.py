"""One candidate's work: apply a route, build its engine, check its accuracy, time it.

This is what an executor's workers run (`routetune.execution.executor`); the search loop
(`routetune.search.loop`) decides which routes to try and stores the outcomes. A trial
has two phases, so that an executor can run builds (CPU-heavy) apart from measurement
(which needs a quiet device):

- `Candidate.build`: apply the route's seasonings to the model, keep the candidate
  model under ``artifacts/models/``, and build its engine once, to find build failures
  and time the build. Models of route prefixes are kept in memory and on disk, so that
  a route that extends another (``fp16,nhwc`` after ``fp16``) starts from its model,
  whichever worker built it.
- `Candidate.measure`: build (or load) the engine again, run it on every input set,
  measure its accuracy against the FP32 reference (every metric; the search loop
  applies the constraint's bounds), and time it in alternating blocks with the base
  route's engine (`routetune.timing.measure.measure_blocks`).

Failure contract: a seasoning refuses a route by raising `ValueError` or a
`routetune.errors.RoutetuneError` (status ``build-failed``); a backend by raising
`BuildError`. Any other exception is a bug somewhere in the candidate's code path and
gives status ``crashed``, with the exception and the innermost frame of its traceback.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from routetune.backend import Backend, Engine, Runner
from routetune.candidate.application import RouteApplier
from routetune.candidate.artifacts import (
    build_engine,
    matches_record,
    open_engine,
    save_model,
)
from routetune.candidate.pairing import THROUGH, PairedTiming
from routetune.candidate.records import (
    BUILT,
    Built,
    Measured,
    Outcome,
    Recorded,
    StoredEngine,
    Timing,
    TrialInputs,
)
from routetune.errors import (
    BuildError,
    EngineNotRunnable,
    RoutetuneError,
    SeasoningError,
    StorageError,
    describe,
)
from routetune.judging.accuracy import (
    AccuracyMeasurement,
    Unjudgeable,
    judge,
    measure_accuracy,
)
from routetune.judging.strict_fp16 import mentions_float16, strict_fp16_overflows
from routetune.libraries import use
from routetune.model.loading import sha256
from routetune.model.postconditions import cast_faults, check_candidate
from routetune.model.weights import import_graph
from routetune.records.trial import Confirmation, Status
from routetune.registry import Registry
from routetune.routes.route import Route, Step, parse_route
from routetune.seasoning import RouteState
from routetune.timing.measure import (
    Block,
    Latency,
    Speedup,
    measure_blocks,
    paired_speedup,
)
from routetune.timing.race import (
    Bar,
    cannot_reach,
    clears_early,
    failed_accuracy,
    out_of_race,
)

logger = logging.getLogger(__name__)


CONFIRM_BLOCKS = 30
"""Blocks per engine at least in a confirmation (`Candidate.confirm`), 3x a trial's."""


class Candidate:
    """Builds, checks and times routes of one model on one backend, in this process.

    The process registers the run's custom-op libraries (``inputs.settings.libraries``)
    with every ONNX Runtime session from its construction on (`routetune.libraries.use`).

    Args:
        registry: The installed plugins.
        inputs: The model, inputs, constraint and settings.
        backend: The backend instance; default: a new one from the registry.
        reference: The FP32 reference backend; default: the one holding the role in the
            registry (`routetune.registry.Registry.reference_backend`) when
            ``inputs.reference`` is set.
    """

    def __init__(self, registry: Registry, inputs: TrialInputs, backend: Backend | None = None,
                 reference: Backend | None = None) -> None:
        use(inputs.settings.libraries)  # this process's every session, from now on
        self.registry = registry
        self.inputs = inputs
        self.backend = backend or registry.backend(inputs.backend)(inputs.profile)
        if reference is None and inputs.reference:
            cls = registry.reference_backend()
            reference = self.backend if type(self.backend) is cls else cls()
        self.reference = reference
        self.outdir = inputs.outdir
        self.workdir = inputs.outdir / "artifacts"
        self.applier = RouteApplier(registry, inputs, self.backend, reference)
        self.timing = PairedTiming(self.backend, inputs)

    def build(self, route: Route, fingerprint: str) -> Outcome:
        """Apply `route` and build its engine once.

        Returns:
            `BUILT` with ``candidate_sha256``, ``passes``, ``settings``, ``artifact``,
            ``build_ms`` (ms), ``engine_bytes`` (bytes) and ``engine_sha256`` (of a kept
            engine file, else empty); else ``build-failed`` or ``crashed`` with the
            reason.

        Raises:
            StorageError: The disk is full (a model or a snapshot could not be kept).
        """
        try:
            data, passes, settings = self.applier.apply(route)
        except StorageError:  # a full disk: not this route's failure, the search's end
            raise
        except (RoutetuneError, ValueError) as e:
            return Outcome(Status.BUILD_FAILED, describe(e))
        except Exception as e:  # a bug in a seasoning: the search goes on
            return Outcome(Status.CRASHED, describe(e))
        finally:
            gc.collect()  # the passes' graphs, before the engine needs the memory
        artifact = self.save_model(data)
        fields = Measured(
            candidate_sha256=sha256(data + json.dumps(settings, sort_keys=True).encode()),
            passes=tuple(passes), settings=settings,
            artifact=str(artifact.relative_to(self.outdir)))
        try:
            t0 = time.perf_counter_ns()
            engine = self.engine(artifact, settings, fingerprint, "")
            fields["build_ms"] = (time.perf_counter_ns() - t0) / 1e6
            fields["engine_bytes"] = engine.size_bytes
            fields["engine_sha256"] = engine.sha256
            if engine.kernels:
                fields["engine_kernels"] = engine.kernels
        except Exception as e:  # a backend may raise anything for a model it refuses
            return Outcome(Status.BUILD_FAILED, describe(e), fields)
        return Outcome(BUILT, "", fields)

    def measure(self, route: Route, fingerprint: str, built: Built,
                bar: Bar | None = None) -> Outcome:
        """Run a built candidate, measure its accuracy and time it.

        Args:
            route: The route.
            fingerprint: The trial's fingerprint (names a kept engine file).
            built: The fields of its `BUILT` outcome.
            bar: The speed-up it races against (`routetune.timing.race`); None: only
                0.5x (`routetune.timing.race.HOPELESS`).

        Returns:
            ``ok`` (measured; the search loop judges it against the constraint),
            ``build-only``, ``build-failed`` or ``crashed``, with ``accuracy``,
            ``faults``, ``notes`` and ``tolerances``
            (`routetune.judging.accuracy.AccuracyMeasurement`), ``latency`` and
            ``base_latency`` (ms), ``paired`` (the paired speed-up), ``latency_kind``
            and ``other_latency`` (`PairedTiming.measure`), ``device_memory_bytes``,
            ``conditions`` and ``noisy`` (`routetune.timing.conditions`) added to `built`.
        """
        fields = Measured(**built)
        settings = fields["settings"]
        memory = self.timing.memory_before(route)
        try:
            engine = self.engine(self.outdir / fields["artifact"], settings, fingerprint,
                                 fields.get("engine_sha256") or "")
            runner = open_engine(self.backend, engine)
        except EngineNotRunnable as e:
            built_text = (f"built ({fields['engine_bytes']} bytes in "
                          f"{fields['build_ms'] / 1000:.2f} s)")
            return Outcome(Status.BUILD_ONLY, f"{built_text}, not run: {e}", fields)
        except BuildError as e:  # the backend refused to load it: its own message
            return Outcome(Status.BUILD_FAILED, describe(e), fields)
        except Exception as e:  # a crash inside one candidate never stops the search
            return Outcome(Status.CRASHED, describe(e), fields)
        inputs = self.inputs
        try:
            with runner:
                outputs = [self._judged(runner.infer(feed)) for feed in inputs.feeds]
                measured = measure_accuracy(self.registry, outputs, list(inputs.references),
                                            inputs.tolerances, inputs.task_params)
                faults, notes = list(measured.faults), list(measured.notes)
                if not faults:  # whatever the bounds: a later run may judge it again
                    data = (self.outdir / fields["artifact"]).read_bytes()
                    overflows = self._strict_fp16(data, settings)
                    if overflows:
                        faults.append("strict FP16 check (this device computes float16 in "
                                      "float32): " + "; ".join(overflows.values()))
                    elif overflows is not None:
                        notes.append("strict FP16 check: no overflow")
                fields.update(Measured(accuracy=measured.metrics, faults=tuple(faults),
                                       notes=tuple(notes), tolerances=measured.tolerances,
                                       accuracy_per_set=measured.per_set))
                racing = bar if inputs.measure.race else None
                if racing is not None and self._fails(fields):
                    racing = failed_accuracy(racing)
                timed, conditions = self.timing.watched(
                    lambda: self.timing.measure(runner, route, racing),
                    None if racing is None else lambda t: cannot_reach(t.get("paired"), racing),
                    base_ms=_base_ms, pace_ms=inputs.pace_ms,
                    through=None if racing is None else (
                        lambda: self.timing.measure(runner, route, racing, THROUGH)))
                notes += timed.pop("notes", ())
                fields.update(timed)
                fields.update(Measured(notes=tuple(notes), conditions=conditions,
                                       noisy=conditions["busy"],
                                       device_memory_bytes=self.timing.memory_taken(memory)))
        except Exception as e:  # a crash inside one candidate never stops the search
            return Outcome(Status.CRASHED, describe(e), fields)
        return Outcome(Status.OK, "", fields)

    def _fails(self, fields: Measured) -> bool:
        """Whether a measured candidate fails the accuracy constraint it races under.

        The constraint is `TrialInputs.constraint`; never without one.
        """
        constraint = self.inputs.constraint
        if constraint is None:
            return False
        measurement = AccuracyMeasurement(
            fields.get("accuracy", {}), fields.get("faults", ()), fields.get("notes", ()),
            fields.get("tolerances", {}), fields.get("accuracy_per_set", {}))
        try:
            return not judge(measurement, constraint).passed
        except Unjudgeable:
            return False

    def confirm(self, stored: StoredEngine) -> Confirmation:
        """Re-measure a stored trial against the base route, both engines built anew.

        Meant for a fresh worker process: nothing of the search's sessions is reused.
        The two engines are timed in paired blocks (`CONFIRM_BLOCKS` at least, and 3x
        the search's minimum time), under the busy-machine policy, the base route's
        pace in the search (`StoredEngine.pace_ms`) included (`PairedTiming.watched`). Racing
        (`MeasureSettings.race`), the timing stops once the paired blocks show the
        route cannot clear ``--min-speedup`` (`routetune.timing.race.out_of_race`): it
        would not hold; ``conditions["raced"]`` then gives that bar. It stops too once
        its first 10 paired blocks all clear it (`routetune.timing.race.clears_early`):
        it holds in this process; ``conditions["cleared"]`` then gives that bar.

        Raises:
            BuildError: An engine could not be rebuilt.
        """
        route, settings, recorded = stored.route, stored.settings, stored.recorded
        path = self.checked_model(route, stored.artifact, settings, recorded)
        base_path = self.save_model(self.inputs.base_data)
        base_settings = self.backend.full_settings(self.inputs.base_settings)
        m = self.inputs.measure
        settings_ = replace(m, min_blocks=max(CONFIRM_BLOCKS, m.min_blocks),
                            min_time_s=3 * m.min_time_s, max_time_s=3 * m.max_time_s)
        runners: list[Runner] = []
        try:
            for model, options, key, sha in ((path, settings, stored.fingerprint,
                                              recorded.engine),
                                             (base_path, base_settings, "", "")):
                runners.append(open_engine(self.backend, self.engine(model, options, key, sha)))

            bar = Bar.min_speedup(self.inputs.settings.min_speedup) if m.race else None
            raced: list[float] = []
            cleared: list[float] = []

            def give_up(blocks: list[Block]) -> bool:
                if bar is not None and out_of_race(blocks, bar) is not None:
                    raced.append(bar.speedup)
                elif bar is not None and clears_early(blocks, bar) is not None:
                    cleared.append(bar.speedup)
                return bool(raced or cleared)

            def timed() -> tuple[list[Latency], Speedup]:
                raced.clear()
                cleared.clear()
                latencies, blocks = measure_blocks(runners, self.inputs.feeds, settings_,
                                                   give_up)
                return latencies, paired_speedup(blocks, 0, 1)

            (latencies, paired), conditions = self.timing.watched(
                timed, base_ms=lambda r: r[0][1].p50, pace_ms=stored.pace_ms,
                probe=runners[1])
        finally:
            for runner in runners:
                runner.close()
        if raced:
            conditions = {**conditions, "raced": raced[0]}
        if cleared:
            conditions = {**conditions, "cleared": cleared[0]}
        return Confirmation(route, latencies[0], latencies[1], paired, conditions)

    def outputs(self, stored: StoredEngine) -> list[dict[str, np.ndarray]] | None:
        """Build a stored trial's engine and run it on every input set.

        Returns:
            One mapping of output name to array per input set; None when this device
            cannot run the engine.
        """
        path = self.checked_model(stored.route, stored.artifact, stored.settings,
                                  stored.recorded)
        engine = self.engine(path, stored.settings, stored.fingerprint, stored.recorded.engine)
        try:
            runner = open_engine(self.backend, engine)
        except EngineNotRunnable:
            return None
        with runner:
            return [self._judged(runner.infer(feed)) for feed in self.inputs.feeds]

    def _judged(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """One set's outputs, only those the reference kept.

        `routetune.judging.accuracy.judged`: a decoder's KV cache that no bound reads is
        dropped as soon as it is read, not held for every set.
        """
        kept = self.inputs.references[0] if self.inputs.references else outputs
        return {name: value for name, value in outputs.items() if name in kept}

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
        data, _, _ = self.applier.apply(parse_route(route))
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
        return strict_fp16_overflows(model, self.applier.evaluate)


    def close(self) -> None:
        """Close the base route's engine (`PairedTiming.close`)."""
        self.timing.close()

    def save_model(self, data: bytes) -> Path:
        """Keep a candidate model under ``artifacts/models/<sha256[:16]>.onnx``; its path."""
        return save_model(self.outdir, data)


def with_preflight(registry: Registry, inputs: TrialInputs, backend: Backend,
                       reference: Backend | None, base: Sequence[Step] = ()
                       ) -> tuple[Candidate, list[dict[str, Any]]]:
    """A candidate whose routes start after the backend's preflight and the pinned prefix.

    Args:
        registry: The installed plugins.
        inputs: The trial inputs; their `TrialInputs.base_data` is replaced.
        backend: The backend, whose `Backend.preflight` goes first.
        reference: The FP32 reference backend, or None.
        base: A recipe's base steps, applied after the backend's.

    Returns:
        The candidate (its ``inputs`` are what workers need), and one pass record per
        base step.

    Raises:
        SeasoningError: A step failed; no route can be built.
        PostconditionError: A step broke the model or its signature.
    """
    steps = [Step(name) for name in backend.preflight] + list(base)
    model = inputs.model
    passes: list[dict[str, Any]] = []
    if not steps:
        data = model.data
    else:
        applier = RouteApplier(registry, inputs, backend, reference)
        state = RouteState(import_graph(model.proto, model.weights))
        for step in steps:
            try:
                record = applier.step(step, state, Route())
            except RoutetuneError:
                raise
            except Exception as e:
                raise SeasoningError(step.name, "base", describe(e)) from e
            passes.append({**record, "base_pipeline": True})
        exported = applier.export(state.graph)
        check_candidate(exported, model.signature, cast_faults(model.proto), model.weights,
                        applier.backend_ops)
        data = exported.SerializeToString()
    inputs = replace(inputs, base_data=data, base_passes=tuple(passes))
    return Candidate(registry, inputs, backend, reference), passes


def _base_ms(timed: Timing) -> float | None:
    """The base route's p50 (ms) in a candidate's timing, where it was timed."""
    base = timed.get("base_latency")
    return None if base is None else base.p50
