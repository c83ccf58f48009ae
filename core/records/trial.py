"""A trial: one route's outcome, as the trial store keeps it (`routetune.records.store`).

`Status` says what became of it; `Trial` holds its measurement (latency, paired
speed-up, accuracy per output), its build record and the machine's conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from routetune.routes.route import Route, parse_route
from routetune.timing.measure import Latency, Speedup

SAME_KERNELS = "same kernels as"
"""How the reason of a route recorded as running a shorter route's kernels starts
(`routetune.search.same_engine.same_kernels_reason`)."""


class Status(str, Enum):
    """A trial's status. Only ``ok`` can win.

    ``ok`` and ``accuracy-failed`` are the verdict of `routetune.judging.accuracy.judge` on the
    trial's measurement, under the run's constraint; a trial of another run with the
    same tolerances is judged again when it is read (`routetune.judging.judge.judged`).
    ``build-only``: the engine was built, but this device cannot run it
    (`routetune.errors.EngineNotRunnable`), so it was not checked or timed. ``crashed``:
    the candidate's worker died (a signal: segfault, abort), ran out of memory, or a
    plugin raised an unexpected exception; the reason has the exit code or signal and
    the last lines of its stderr. ``timed-out``: a phase ran past ``--trial-timeout``
    and its worker was killed. ``skipped``: not built (a seasoning that does not apply,
    or the same model and settings as another route).
    """

    OK = "ok"
    ACCURACY_FAILED = "accuracy-failed"
    BUILD_FAILED = "build-failed"
    BUILD_ONLY = "build-only"
    CRASHED = "crashed"
    TIMED_OUT = "timed-out"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    @property
    def failed(self) -> bool:
        """Whether the trial produced no engine (build-failed, crashed, timed-out)."""
        return self in (Status.BUILD_FAILED, Status.CRASHED, Status.TIMED_OUT)

    @property
    def measured(self) -> bool:
        """Whether the engine ran and its accuracy was measured (ok, accuracy-failed)."""
        return self in (Status.OK, Status.ACCURACY_FAILED)


@dataclass(frozen=True)
class Trial:
    """One stored trial.

    Args:
        fingerprint: sha256 of model, route, backend and version, device and settings.
        model_sha256: sha256 of the source model file.
        route: The route's canonical text.
        backend: The backend's name.
        device: The device description.
        settings_hash: sha256 of the inputs, accuracy expression and measurement settings.
        status: The verdict or what stopped the trial (`Status`).
        reason: Why the trial is not ``ok`` (or a note when it is).
        candidate_sha256: sha256 of the built model plus its full build settings.
        latency: Latency in ms, when measured.
        base_latency: The base route's latency in ms, measured in alternating blocks
            with this trial's (see `routetune.timing.measure.measure_side_by_side`).
        build_ms: Build time in ms.
        engine_bytes: The engine's size in bytes.
        accuracy: Per output name, metric name to value.
        passes: Per step, the seasoning's statistics and whether it modified anything.
        settings: The full build settings (backend options, defaults included).
        artifact: Path of the candidate model, relative to the output directory.
        versions: Package versions in use.
        created_at: Unix time when written.
        paired: The speed-up over the base route from paired blocks
            (`routetune.timing.measure.paired_speedup`), when measured alongside it.
        conditions: The machine's conditions while it was measured
            (`routetune.timing.conditions`): load, foreign CPU use, steal, frequency, GPU state,
            seconds waited for a quiet machine.
        noisy: Why the measurement is not trusted (the machine was busy while it was
            timed), or empty.
        engine_sha256: sha256 of the engine file the backend kept for this trial (a
            TensorRT plan), hex: such a file is opened again only if it still has this
            hash (`routetune.candidate.candidate.Candidate.engine`). Empty or None: none.
        faults: Accuracy defects no bound excuses
            (`routetune.judging.accuracy.AccuracyMeasurement`).
        notes: Remarks on the measurement (an almost-constant reference, the strict
            FP16 check).
        tolerances: Per output, ``(atol, rtol)`` the ``accuracy`` metrics were computed
            at; empty for a trial not measured, or stored before schema 4.
        accuracy_per_set: Per output, the ``accuracy`` metrics of each validation input
            set, in the sets' order (`routetune.judging.accuracy.AccuracyMeasurement.per_set`);
            empty with one input set.
        latency_kind: What `latency`, `base_latency` and `paired` time
            (`routetune.timing.measure.LATENCIES`, ``--latency``): ``device`` compute or
            ``end-to-end`` (host to host, copies included).
        other_latency: The other figure, measured alone after the paired blocks (ms):
            host to host when `latency` is device compute, and the reverse; None where
            the two are the same (a CPU backend) or not measured.
        device_memory_bytes: Device memory the engine took (bytes): in use on its GPU
            after it was timed, less what was in use before it was built. ONNX
            Runtime's and TensorRT's allocators keep what they took, so this is the
            engine's peak. None on a host device.
        raced: The speed-up (x) it left the race under: its timing stopped once its
            paired blocks showed it cannot reach that bar (`routetune.timing.race`);
            None when it was timed in full.
    """

    fingerprint: str
    model_sha256: str
    route: str
    backend: str
    device: str
    settings_hash: str
    status: Status
    reason: str = ""
    candidate_sha256: str | None = None
    latency: Latency | None = None
    base_latency: Latency | None = None
    build_ms: float | None = None
    engine_bytes: int | None = None
    accuracy: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    passes: tuple[Mapping[str, Any], ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    artifact: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    paired: Speedup | None = None
    conditions: Mapping[str, Any] = field(default_factory=dict)
    noisy: str = ""
    engine_sha256: str | None = None
    faults: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    accuracy_per_set: Mapping[str, tuple[Mapping[str, float], ...]] = field(
        default_factory=dict)
    latency_kind: str = "device"
    other_latency: Latency | None = None
    device_memory_bytes: int | None = None
    raced: float | None = None

    @property
    def steps(self) -> Route:
        """The route as a `Route` of steps, parsed from its canonical text (`route`).

        Its length is the number of seasonings; parameters are not steps
        (``fp16{op_types_to_exclude=[Softmax,Pow]}`` is one).
        """
        return parse_route(self.route)

    @property
    def relative(self) -> Latency | None:
        """The latency relative to the base route measured alongside it (a ratio).

        Machine speed drifts during a long search; a ratio to a base route measured at
        the same time does not. With a paired speed-up, its inverse: ``p50`` is
        ``1 / paired.value`` and the interval is the paired one, inverted. Otherwise the
        latency over the base route's p50. None without a base measurement (the base
        route could not be built) or without a latency.
        """
        if self.latency is None or self.base_latency is None:
            return None
        if self.paired is not None:
            p = self.paired
            inv = 1.0 / p.value
            return Latency(self.latency.n, inv, inv, inv, inv, 1.0 / p.ci_high,
                           1.0 / p.ci_low)
        return self.latency.scaled(1.0 / self.base_latency.p50)

    @property
    def speedup(self) -> float | None:
        """The speed-up over the base route measured alongside; None if unmeasured.

        The paired estimate when there is one, else the ratio of the two p50s.
        """
        if self.paired is not None:
            return self.paired.value
        if self.latency is None or self.base_latency is None:
            return None
        return self.base_latency.p50 / self.latency.p50

    @property
    def figure(self) -> str:
        """The speed-up as reports print it.

        The paired one with its 95% interval (``1.04x [0.97, 1.14]``), else the ratio of
        the p50s (``1.04x``).
        """
        return self.paired.figure if self.paired is not None else f"{self.speedup or 0:.2f}x"


@dataclass(frozen=True)
class Confirmation:
    """A route re-measured against the base route in a fresh process (`Candidate.confirm`).

    Args:
        route: The route's text.
        latency: Its latency in this measurement (ms).
        base_latency: The base route's, in the same loop (ms).
        paired: The paired speed-up; over several repeats, their combination
            (`routetune.timing.measure.across_repeats`).
        conditions: The machine's conditions meanwhile (`routetune.timing.conditions`).
        repeats: Each repeat's paired speed-up, one per fresh process, in the order
            run; empty for a single measurement.
    """

    route: str
    latency: Latency
    base_latency: Latency
    paired: Speedup
    conditions: Mapping[str, Any]
    repeats: tuple[Speedup, ...] = ()
