"""Judging stored trials: a trial's verdict under a constraint, from its measurement.

A trial's measurement (metrics per output, faults, notes, tolerances) is stored apart
from the bounds of the constraint it was first judged under, and the bounds are not
part of its fingerprint. So a run with another ``--accuracy`` finds the stored trials of
the same model, inputs and tolerances, and `judged` decides them again without
building, running or timing anything.
"""

from __future__ import annotations

from dataclasses import replace

from routetune.judging.accuracy import AccuracyMeasurement, Constraint, Unjudgeable, judge
from routetune.records.trial import Status, Trial


def measurement(trial: Trial) -> AccuracyMeasurement | None:
    """A trial's accuracy measurement; None if it has none.

    None: not run, or stored by a routetune before schema 4 (no tolerances recorded).
    """
    if not trial.status.measured or not trial.tolerances:
        return None
    return AccuracyMeasurement(trial.accuracy, trial.faults, trial.notes, trial.tolerances,
                               trial.accuracy_per_set)


def judged(trial: Trial, constraint: Constraint) -> Trial:
    """The trial with its status and reason decided under `constraint`.

    ``ok`` with the measurement's notes as the reason when it passes, else
    ``accuracy-failed`` with the faults and failed bounds. A trial without a
    measurement (`measurement`), or one measured at other tolerances
    (`routetune.judging.accuracy.Unjudgeable`), keeps the verdict it was stored with.
    """
    measured = measurement(trial)
    if measured is None:
        return trial
    try:
        verdict = judge(measured, constraint)
    except Unjudgeable:
        return trial
    if verdict.passed:
        return replace(trial, status=Status.OK, reason="; ".join(verdict.notes))
    return replace(trial, status=Status.ACCURACY_FAILED, reason=verdict.reason)
