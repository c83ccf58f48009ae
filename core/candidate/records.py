"""What a trial's phases take and give, between the search loop and its workers.

`TrialInputs` goes to every worker once (`routetune.execution.handoff`), with the
`TrialSettings` it takes of the run's options; a phase answers with an `Outcome`;
`StoredEngine` names a stored trial's engine to build again (a confirmation, which
answers with a `routetune.records.trial.Confirmation`); `Recorded` carries what the
trial store recorded of a build, for a worker to check files against. The run's option
parser imports this module: it imports no model library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from routetune.judging.constraint import Constraint
from routetune.libraries import Library
from routetune.records.trial import Status
from routetune.timing.conditions import BusyPolicy
from routetune.timing.measure import Latency, MeasureSettings, Speedup

if TYPE_CHECKING:
    import numpy as np

    from routetune.feeds.profile import ShapeProfile
    from routetune.judging.accuracy import Tolerances
    from routetune.model.loading import PreparedModel


@dataclass(frozen=True)
class TrialSettings:
    """What a candidate's work takes of the run's options (`routetune.run.run_spec.RunSpec`).

    Args:
        measure: How long to time each candidate (``--min-runs``, ``--min-time``, …).
        backend_options: Build options every route starts from (backend option keys).
        busy_machine: The ``--busy-machine`` mode (`routetune.timing.conditions.MODES`).
        min_speedup: ``--min-speedup``: the least speed-up a candidate races against
            (`routetune.timing.race`).
        libraries: ``--custom-op-library``, as checked: registered with every ONNX
            Runtime session of a process that does a candidate's work
            (`routetune.libraries.use`).
    """

    measure: MeasureSettings = field(default_factory=MeasureSettings)
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    busy_machine: str = BusyPolicy.mode
    min_speedup: float = 1.0
    libraries: tuple[Library, ...] = ()


BUILT: Literal["built"] = "built"
"""`Outcome.status` of a build phase that succeeded: the trial goes on to `measure`."""


@dataclass(frozen=True)
class TrialInputs:
    """Everything a candidate's work needs; picklable, so that a worker process gets it.

    Args:
        model: The prepared model.
        backend: The backend's name (looked up in the registry).
        profile: The optimisation profile the backend builds for.
        feeds: The validation input sets (input name to array).
        references: The FP32 reference outputs, one mapping per input set.
        tolerances: Per output, ``(atol, rtol)`` to measure accuracy at
            (`routetune.judging.accuracy.Constraint.tolerance_map`); the bounds are applied by
            the search loop (`routetune.judging.judge`), not here.
        outdir: The output directory; models and engines go under ``artifacts/``.
        base_data: The model after the backend's preflight and the pinned prefix
            (`with_preflight`), serialized.
        settings: What the candidate's work takes of the run's options: how long to
            time, the build options every route starts from, the busy-machine policy.
        base_passes: The pass records of the preflight and the pinned prefix, recorded
            with every trial.
        reference: Whether precision seasonings and the strict FP16 check may run
            models in FP32 on the reference backend (the FP32 reference role).
        task_params: Per task metric, the ``@`` values to measure besides its default
            (`routetune.judging.constraint.Constraint.task_params`).
        tuner_pids: `BusyPolicy.tuner`: processes whose trees are the tuner's, set where
            the worker is not the tuner's child (a Ray worker); empty otherwise.
        constraint: The accuracy constraint, for racing only: a candidate that fails it
            is timed just long enough for a figure (`routetune.timing.race`); the search
            loop judges every trial itself. None: every candidate is timed in full.
        pace_ms: The base route's p50 (ms) timed just before the search on a quiet
            machine (`routetune.run.side_by_side.BaseScreen`), or None: where engines run
            on the host CPU, a base route figure slower than it marks the machine slower
            than it was, the search's own base trial included
            (`routetune.candidate.pairing.PairedTiming.watched`).
    """

    model: PreparedModel
    backend: str
    profile: ShapeProfile | None
    feeds: tuple[Mapping[str, np.ndarray], ...]
    references: tuple[Mapping[str, np.ndarray], ...]
    tolerances: Tolerances
    outdir: Path
    base_data: bytes
    settings: TrialSettings = field(default_factory=TrialSettings)
    base_passes: tuple[Mapping[str, Any], ...] = ()
    reference: bool = True
    task_params: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    tuner_pids: tuple[int, ...] = ()
    constraint: Constraint | None = None
    pace_ms: float | None = None

    @property
    def measure(self) -> MeasureSettings:
        """How long to time each candidate (``settings.measure``)."""
        return self.settings.measure

    @property
    def base_settings(self) -> Mapping[str, Any]:
        """Build options every route starts from (``settings.backend_options``)."""
        return self.settings.backend_options

    @property
    def busy(self) -> BusyPolicy:
        """What a measurement does on a busy machine (its ``gpu`` is set by the worker)."""
        return BusyPolicy(self.settings.busy_machine, tuner=self.tuner_pids)


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


@dataclass(frozen=True)
class StoredEngine:
    """A stored trial's engine, to build again from its kept candidate model.

    What a winner's confirmation (`Candidate.confirm`) and its outputs
    (`Candidate.outputs`) start from, in the process where engines are timed.

    Args:
        route: The route's text.
        artifact: Its candidate model's path, relative to the output directory.
        settings: Its full build settings (backend option keys).
        fingerprint: Its trial fingerprint (it names the engine file).
        recorded: What the trial store recorded of its build, to check files against.
        pace_ms: The base route's p50 (ms) alone in the search's base trial, against
            which a confirmation sees whether the machine is slower than it was
            (`routetune.timing.conditions.pace_note`); None where unknown.
    """

    route: str
    artifact: str
    settings: Mapping[str, Any]
    fingerprint: str
    recorded: Recorded
    pace_ms: float | None = None


class Built(TypedDict, total=False):
    """What a build phase found: `routetune.records.trial.Trial`'s fields of the build.

    Every key is there after a build that made an engine; a build that failed has those
    it reached (a failed pass, none).
    """

    candidate_sha256: str
    """sha256 of the candidate model's bytes followed by its full settings (hex)."""
    passes: tuple[Mapping[str, Any], ...]
    settings: Mapping[str, Any]
    artifact: str
    """The candidate model's path, relative to the output directory."""
    build_ms: float
    engine_bytes: int
    engine_sha256: str | None
    engine_kernels: str
    """`routetune.backend.Engine.kernels`, where the backend says; not stored."""


class Timing(TypedDict, total=False):
    """What timing a candidate found (`routetune.candidate.pairing.PairedTiming.measure`)."""

    latency: Latency
    base_latency: Latency | None
    paired: Speedup | None
    latency_kind: str
    other_latency: Latency | None
    notes: tuple[str, ...]
    raced: float | None


class Measured(Built, total=False):
    """What a measure phase found, added to its build's (`Built`).

    `Trial`'s fields of accuracy and timing: those it reached, when it crashed midway.
    """

    accuracy: Mapping[str, Mapping[str, float]]
    faults: tuple[str, ...]
    notes: tuple[str, ...]
    tolerances: Mapping[str, tuple[float, float]]
    accuracy_per_set: Mapping[str, tuple[Mapping[str, float], ...]]
    latency: Latency
    base_latency: Latency | None
    paired: Speedup | None
    latency_kind: str
    other_latency: Latency | None
    conditions: Mapping[str, Any]
    noisy: str
    device_memory_bytes: int | None
    raced: float | None


@dataclass(frozen=True)
class Outcome:
    """What one phase of a trial found.

    Args:
        status: A trial status (`routetune.records.trial.Status`; ``ok`` after a measurement:
            the loop judges it), or `BUILT` after a build phase that succeeded.
        reason: One line: why the trial is not ``ok``, or notes.
        fields: The trial's fields found so far: its build's (`Built`), and after a
            measure phase its accuracy and timing (`Measured`).
    """

    status: Status | Literal["built"]
    reason: str = ""
    fields: Measured = field(default_factory=lambda: Measured())
