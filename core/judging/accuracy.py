"""The accuracy constraint: which candidates are close enough to the FP32 reference.

The expression's grammar and the parsed `Constraint` are in
`routetune.judging.constraint` (re-exported here)::

    cos>=0.999
    l0<=0.001,atol=1e-3,rtol=1e-3
    out0:linf<=0.01,rel_l2<=1e-2
    mask_iou@0.3>=0.99

Whatever the terms, an output whose non-finite values differ from the reference's
fails (`routetune.judging.metrics.split_nonfinite`: the same infinity on both sides, and
NaN where the reference is NaN, match; anything else non-finite does not).

Measuring and judging are apart: `measure_accuracy` computes every metric of a
candidate's outputs (it depends on the tolerances, and on the task metrics' ``@``
values, only), and `judge` applies the bounds to a stored measurement. So another
``--accuracy`` re-judges stored trials without building, running or timing anything
(`routetune.judging.judge`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routetune.feeds.decoder import is_cache_output
from routetune.judging.constraint import (
    DEFAULT_ACCURACY,
    DEFAULT_TOL,
    OPS,
    Constraint,
    Threshold,
    check_outputs,
    parse_accuracy,
)
from routetune.judging.metrics import Metric, TaskMetric, finite_pair
from routetune.registry import Registry

__all__ = [
    "DEFAULT_ACCURACY", "DEFAULT_TOL", "AccuracyMeasurement", "Constraint", "Threshold",
    "Unjudgeable", "Verdict", "check_accuracy", "check_outputs", "judge",
    "measure_accuracy", "parse_accuracy",
]

Tolerances = Mapping[str, tuple[float, float]]
"""Per output name, the ``(atol, rtol)`` the tolerance-dependent metrics were computed at."""


@dataclass(frozen=True)
class AccuracyMeasurement:
    """What a candidate's outputs are, measured against the reference; no bound applied.

    It does not depend on the constraint's bounds, only on its tolerances, so a stored
    measurement can be judged again under another ``--accuracy`` (`judge`).

    Args:
        metrics: Per output name, every registered metric's value over all input sets.
        faults: One line per defect no bound can excuse: an output missing or of another
            size, NaN/Inf where the reference is finite, strings that differ, an FP16
            overflow on a device with true float16.
        notes: Remarks such as an almost-constant reference output.
        tolerances: Per output name, ``(atol, rtol)`` the metrics were computed at.
        per_set: Per output name, one mapping of metric name to value per validation
            input set, in the order of the sets (empty with a single set, which
            `metrics` already is): which input set an error comes from.
    """

    metrics: Mapping[str, Mapping[str, float]]
    faults: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tolerances: Tolerances = field(default_factory=dict)
    per_set: Mapping[str, tuple[Mapping[str, float], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one measurement under one constraint.

    Args:
        passed: Whether there is no fault and every output meets every bound.
        metrics: Per output name, every registered metric's value.
        failures: The faults, then one line per failed bound, with the margin
            (``"out0: cos 0.9962, needs >= 0.999"``).
        notes: Remarks such as an almost-constant reference output.
    """

    passed: bool
    metrics: Mapping[str, Mapping[str, float]]
    failures: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        """The failures as one line ("" when passed)."""
        return "; ".join(self.failures)


class Unjudgeable(Exception):
    """A measurement lacks what a constraint asks (measure again).

    A metric not computed, or computed at other tolerances.
    """


def judge(measurement: AccuracyMeasurement, constraint: Constraint) -> Verdict:
    """Apply a constraint's bounds to a measurement. Pure: no model runs.

    Args:
        measurement: The metrics, faults and notes of one candidate.
        constraint: The parsed accuracy expression.

    Raises:
        Unjudgeable: A bound names a metric the measurement lacks, or the metrics were
            computed at other tolerances than the constraint's (a trial's fingerprint
            includes the tolerances and the installed metrics, so a stored trial found
            by it never is).
    """
    failures = list(measurement.faults)
    for name, values in measurement.metrics.items():
        measured_at = tuple(measurement.tolerances.get(name, constraint.tolerances(name)))
        if measured_at != constraint.tolerances(name):
            raise Unjudgeable(f"{name}: measured at atol, rtol {measured_at}, the "
                              f"constraint asks {constraint.tolerances(name)}")
        if not values:  # not numbers: compared exactly, a difference is a fault
            continue
        for t in constraint.for_output(name):
            if t.key not in values:
                raise Unjudgeable(f"{name}: metric {t.key} was not measured")
            got = values[t.key]
            if not OPS[t.op](got, t.value):
                failures.append(f"{name}: {t.key} {got:.6g}, needs {t.op} {t.value:g}")
    return Verdict(not failures, measurement.metrics, tuple(failures), measurement.notes)


def _flat(values: Sequence[Any]) -> np.ndarray:
    """One output over every input set, as one flat array.

    A sequence output (a list of tensors, which may differ in shape) is its tensors
    one after another; a tensor is itself.
    """
    parts = [t.ravel() for t in _tensors(values)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _tensors(values: Sequence[Any]) -> list[np.ndarray]:
    """One output over every input set, as its arrays (a sequence output's one by one)."""
    return [np.asarray(t) for v in values for t in (v if isinstance(v, (list, tuple)) else [v])]


Params = Mapping[str, Sequence[float]]
"""Per task metric name, the ``@`` values to measure it at besides its default
(`routetune.judging.constraint.Constraint.task_params`)."""


def task_values(registry: Registry, outs: Sequence[Any], refs: Sequence[Any],
                params: Params) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Every task metric of one output, at its default and at `params`, by key.

    Args:
        registry: For the task metrics.
        outs: The candidate's values of the output, one per input set (an array, or a
            sequence output's list of arrays).
        refs: The reference's.
        params: The ``@`` values to measure besides the defaults.

    Returns:
        Over every input set (``{"top1": 0.975, "ctc@0": 1.0, …}``, keys as
        `TaskMetric.key`), and per input set. A set whose arrays differ in shape from
        the reference's cannot be read the same: all its samples score worst.
    """
    pairs = [(_tensors([o]), _tensors([r])) for o, r in zip(outs, refs, strict=True)]
    pooled: dict[str, float] = {}
    per_set: list[dict[str, float]] = [{} for _ in pairs]
    for entry in registry.metrics.values():
        metric = entry.item
        if not isinstance(metric, TaskMetric):
            continue
        extra = params.get(metric.name, ()) if metric.param is not None else ()
        for param in dict.fromkeys((None, *extra)):
            scores = [_set_scores(metric, o, r, param) for o, r in pairs]
            key = metric.key(param)
            pooled[key] = metric.pooled(np.concatenate(scores) if scores else np.zeros(0))
            for values, each in zip(per_set, scores, strict=True):
                values[key] = metric.pooled(each)
    return pooled, per_set


def _set_scores(metric: TaskMetric, outs: list[np.ndarray], refs: list[np.ndarray],
                param: float | None) -> np.ndarray:
    """One input set's sample scores; worst for every sample when the shapes differ."""
    if len(outs) == len(refs) and all(o.shape == r.shape for o, r in zip(outs, refs, strict=False)):
        return np.concatenate([metric.sample_scores(o, r, param)
                               for o, r in zip(outs, refs, strict=True)] or [np.zeros(0)])
    samples = sum(len(metric.samples(r)) for r in refs)
    return np.full(max(samples, 1), metric.worst)


def judged(outputs: Mapping[str, Any], constraint: Constraint) -> dict[str, Any]:
    """`outputs` (one input set's, by name) less a decoder's KV cache no bound reads.

    A decode step's ``present.*`` outputs (`routetune.feeds.decoder.is_cache_output`)
    are the steps' inner state and most of a decode set's bytes (8 layers' keys and
    values at a cache of 600 tokens: 19 MB a set, 2.4 GB over 128 steps of
    ``benchmarks/decoder.py``'s 26 M decoder, against 128 KB of logits). Unless a bound
    names one (`Constraint.binds`), the reference's are not kept, so a candidate's are
    neither measured nor held: a two-backend search over 128 steps of that decoder ran
    out of this machine's 24 GB with them. Every other output is kept.
    """
    return {name: value for name, value in outputs.items()
            if constraint.binds(name) or not (isinstance(value, np.ndarray)
                                              and is_cache_output(name, value.ndim))}


def measure_accuracy(
    registry: Registry,
    outputs: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    params: Params | None = None,
) -> AccuracyMeasurement:
    """Compare a candidate's outputs with the reference outputs, set by set; no bounds.

    Args:
        registry: For the metric functions.
        outputs: One mapping of output name to array per validation input set (a
            sequence output is a list of arrays; outputs that are not numbers, such as
            strings, are compared exactly, without metrics).
        references: The reference outputs, in the same order and with the same names.
        tolerances: Per output name, ``(atol, rtol)`` (`Constraint.tolerance_map`).
        params: Per task metric, the ``@`` values to measure besides its default
            (`Constraint.task_params`).

    Returns:
        Every registered metric per output, over all input sets at once and per input
        set, and the faults; a decoder's KV-cache outputs (``present.*``,
        `routetune.feeds.decoder.is_cache_output`) the tensor metrics only. A task
        metric's value is under its key (``ctc@0``) once per ``@`` value.
    """
    params = params or {}
    metrics: dict[str, dict[str, float]] = {}
    per_set: dict[str, tuple[dict[str, float], ...]] = {}
    faults: list[str] = []
    notes: list[str] = []
    for name in references[0]:
        try:
            out = _flat([o[name] for o in outputs])
        except KeyError:
            faults.append(f"{name}: output missing")
            continue
        ref = _flat([r[name] for r in references])
        if out.shape != ref.shape:
            faults.append(f"{name}: {out.size} elements, reference has {ref.size}")
            continue
        if ref.dtype.kind not in "biuf" or out.dtype.kind not in "biuf":  # strings
            differ = int(np.sum(out.astype(str) != ref.astype(str)))
            metrics[name] = {}
            if differ:
                faults.append(f"{name}: {differ} of {ref.size} values differ from the "
                              "reference's (compared exactly: not numbers)")
            continue
        out, ref = out.astype(np.float64, copy=False), ref.astype(np.float64, copy=False)
        _, kept, mismatches = finite_pair(out, ref)  # every metric reads these float64 copies
        finite = kept.size == ref.size  # every value finite: each set's too
        if mismatches:
            faults.append(f"{name}: {mismatches} NaN/Inf value(s) that differ from the "
                          "reference's (the same infinity, or NaN where it is NaN, match)")
        atol, rtol = tolerances.get(name, (DEFAULT_TOL, DEFAULT_TOL))
        outs, refs = [o[name] for o in outputs], [r[name] for r in references]
        task: dict[str, float] = {}
        task_sets: list[dict[str, float]] = [{} for _ in refs]
        if not all(isinstance(r, np.ndarray) and is_cache_output(name, r.ndim)
                   for r in refs):  # a decoder's cache: no classes, no task metrics
            task, task_sets = task_values(registry, outs, refs, params)
        metrics[name] = {**_tensor_metrics(registry, out, ref, atol, rtol, finite), **task}
        if len(references) > 1:
            per_set[name] = tuple(
                {**tensor, **each} if tensor else {}
                for tensor, each in zip(_set_metrics(registry, out, ref, outs, refs, atol, rtol,
                                                     finite),
                                        task_sets, strict=True))
        span = float(np.ptp(kept)) if kept.size else 0.0
        if span <= atol:
            notes.append(
                f"{name}: the reference is almost constant (range {span:.3g}); "
                "relative metrics say little here"
            )
    return AccuracyMeasurement(metrics, tuple(faults), tuple(notes),
                               {n: tolerances.get(n, (DEFAULT_TOL, DEFAULT_TOL))
                                for n in references[0]}, per_set)


def _tensor_metrics(registry: Registry, out: np.ndarray, ref: np.ndarray, atol: float,
                    rtol: float, finite: bool) -> dict[str, float]:
    """Every tensor metric of `out` against `ref` (flat, float64), by name.

    `finite`: both are known to be finite everywhere, so each metric skips its own check
    (`Metric.of_finite`: the same value).
    """
    return {name: (e.item.of_finite if finite and isinstance(e.item, Metric) else e.item)(
                out, ref, atol, rtol)
            for name, e in registry.metrics.items() if not isinstance(e.item, TaskMetric)}


def _set_metrics(registry: Registry, out: np.ndarray, ref: np.ndarray, outs: Sequence[Any],
                 refs: Sequence[Any], atol: float, rtol: float,
                 finite: bool) -> Iterator[dict[str, float]]:
    """Every tensor metric of each input set's output, computed as `measure_accuracy` does.

    Args:
        registry: For the tensor metrics.
        out: The candidate's output over every set, flat (`_flat` of `outs`), float64.
        ref: The reference's, the same way.
        outs: The candidate's output per set, whose sizes cut `out` into sets.
        refs: The reference's.
        atol: The absolute tolerance of the metrics that take one.
        rtol: The relative tolerance.
        finite: `out` and `ref` are finite everywhere (`_tensor_metrics`).

    Yields:
        One dict per set; empty when its size differs from the reference's (the pooled
        sizes may agree).
    """
    o_end = r_end = 0
    for o_set, r_set in zip(outs, refs, strict=True):
        o_start, r_start = o_end, r_end
        o_end += sum(t.size for t in _tensors([o_set]))
        r_end += sum(t.size for t in _tensors([r_set]))
        if o_end - o_start != r_end - r_start:
            yield {}
            continue
        yield _tensor_metrics(registry, out[o_start:o_end], ref[r_start:r_end], atol, rtol,
                              finite)


def check_accuracy(
    constraint: Constraint,
    registry: Registry,
    outputs: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
) -> Verdict:
    """`measure_accuracy` at the constraint's tolerances, then `judge`.

    Args: as `measure_accuracy`'s, with the parsed accuracy expression.
    """
    tolerances = constraint.tolerance_map(list(references[0]) if references else [])
    return judge(measure_accuracy(registry, outputs, references, tolerances,
                                  constraint.task_params()), constraint)
