"""What a trial's phases take and give, between the search loop and its workers.

`TrialInputs` goes to every worker once (`routetune.search.handoff`); a phase answers
with an `Outcome`; a confirmation with a `Confirmation`; `Recorded` carries what the
trial store recorded of a build, for a worker to check files against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from routetune.conditions import BusyPolicy
from routetune.feeds.profile import ShapeProfile
from routetune.judging.accuracy import Tolerances
from routetune.measure import (
    Latency,
    MeasureSettings,
    Speedup,
)
from routetune.model import PreparedModel
from routetune.run.run_spec import RunSpec
from routetune.trial import Status

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
        spec: The run as asked for, unchanged from the entry point: how long to time
            (``measure``), the build options every route starts from
            (``backend_options``), the busy-machine policy.
        base_passes: The pass records of the preflight and the pinned prefix, recorded
            with every trial.
        reference: Whether precision seasonings and the strict FP16 check may run
            models in FP32 on the reference backend (the FP32 reference role).
        task_params: Per task metric, the ``@`` values to measure besides its default
            (`routetune.judging.constraint.Constraint.task_params`).
        tuner_pids: `BusyPolicy.tuner`: processes whose trees are the tuner's, set where
            the worker is not the tuner's child (a Ray worker); empty otherwise.
    """

    model: PreparedModel
    backend: str
    profile: ShapeProfile | None
    feeds: tuple[Mapping[str, np.ndarray], ...]
    references: tuple[Mapping[str, np.ndarray], ...]
    tolerances: Tolerances
    outdir: Path
    base_data: bytes
    spec: RunSpec = field(default_factory=RunSpec)
    base_passes: tuple[Mapping[str, Any], ...] = ()
    reference: bool = True
    task_params: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    tuner_pids: tuple[int, ...] = ()

    @property
    def measure(self) -> MeasureSettings:
        """How long to time each candidate (``spec.measure``)."""
        return self.spec.measure

    @property
    def base_settings(self) -> Mapping[str, Any]:
        """Build options every route starts from (``spec.backend_options``)."""
        return self.spec.backend_options

    @property
    def busy(self) -> BusyPolicy:
        """What a measurement does on a busy machine (its ``gpu`` is set by the worker)."""
        return BusyPolicy(self.spec.busy_machine, tuner=self.tuner_pids)


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
class Confirmation:
    """A route re-measured against the base route in a fresh process (`Candidate.confirm`).

    Args:
        route: The route's text.
        latency: Its latency in this measurement (ms).
        base_latency: The base route's, in the same loop (ms).
        paired: The paired speed-up; over several repeats, their combination
            (`routetune.measure.across_repeats`).
        conditions: The machine's conditions meanwhile (`routetune.conditions`).
        repeats: Each repeat's paired speed-up, one per fresh process, in the order
            run; empty for a single measurement.
    """

    route: str
    latency: Latency
    base_latency: Latency
    paired: Speedup
    conditions: Mapping[str, Any]
    repeats: tuple[Speedup, ...] = ()

@dataclass(frozen=True)
class Outcome:
    """What one phase of a trial found.

    Args:
        status: A trial status (`routetune.trial.Status`; ``ok`` after a measurement:
            the loop judges it), or `BUILT` after a build phase that succeeded.
        reason: One line: why the trial is not ``ok``, or notes.
        fields: `routetune.trial.Trial` fields found so far (``passes``, ``settings``,
            ``artifact``, ``build_ms``, ``latency`` …).
    """

    status: Status | Literal["built"]
    reason: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)
