"""The accuracy constraint: which candidates are close enough to the FP32 reference.

An expression is a comma-separated list of terms; a term may be scoped to one output
with an ``output:`` prefix::

    cos>=0.999
    l0<=0.001,atol=1e-3,rtol=1e-3
    out0:linf<=0.01,rel_l2<=1e-2

A metric term is ``metric<=value`` or ``metric>=value`` (also ``<`` and ``>``); ``atol``
and ``rtol`` set the tolerances of ``l0`` (trtexec's ``--atol``/``--rtol``). An
output-scoped term replaces the unscoped term of the same metric for that output.
Whatever the terms, an output whose non-finite values differ from the reference's
fails (`routetune.judging.metrics.split_nonfinite`: the same infinity on both sides, and NaN where
the reference is NaN, match; anything else non-finite does not).

Measuring and judging are apart: `measure_accuracy` computes every metric of a
candidate's outputs (it depends on the tolerances only), and `judge` applies the bounds
to a stored measurement. So another ``--accuracy`` re-judges stored trials without
building, running or timing anything (`routetune.judging.judge`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routetune.errors import UsageError
from routetune.judging.metrics import Metric, split_nonfinite
from routetune.registry import Registry
from routetune.run.option_schema import OptionError

DEFAULT_ACCURACY = "l0<=0.001,atol=1e-3,rtol=1e-3"
"""The default constraint: at most 0.1% of elements outside 1e-3 + 1e-3·|ref|. It
combines a relative bound with an absolute floor, so outputs near zero stay judged."""

DEFAULT_TOL = 1e-5
"""atol and rtol when an expression sets neither (trtexec's defaults)."""

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_TERM = re.compile(
    r"^(?:(?P<out>.+):)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op><=|>=|<|>|=)\s*(?P<val>\S+)$"
)


@dataclass(frozen=True)
class Threshold:
    """One bound on one metric, for one output or (``output=None``) for all."""

    metric: str
    op: str
    value: float
    output: str | None = None

    def __str__(self) -> str:
        prefix = f"{self.output}:" if self.output else ""
        return f"{prefix}{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True)
class Constraint:
    """A parsed accuracy expression.

    Args:
        text: The expression as given.
        thresholds: Every metric bound.
        atol: Absolute tolerance per output name (key None: every output).
        rtol: Relative tolerance per output name (key None: every output).
    """

    text: str
    thresholds: tuple[Threshold, ...]
    atol: Mapping[str | None, float] = field(default_factory=dict)
    rtol: Mapping[str | None, float] = field(default_factory=dict)

    def tolerances(self, output: str) -> tuple[float, float]:
        """Return ``(atol, rtol)`` for one output."""
        atol = self.atol.get(output, self.atol.get(None, DEFAULT_TOL))
        rtol = self.rtol.get(output, self.rtol.get(None, DEFAULT_TOL))
        return atol, rtol

    def tolerance_map(self, outputs: Sequence[str]) -> dict[str, tuple[float, float]]:
        """``(atol, rtol)`` per output: what a measurement under this constraint uses."""
        return {name: self.tolerances(name) for name in outputs}

    def for_output(self, output: str) -> list[Threshold]:
        """The thresholds that apply to one output (scoped ones replace unscoped ones)."""
        scoped = {t.metric for t in self.thresholds if t.output == output}
        return [
            t for t in self.thresholds
            if t.output == output or (t.output is None and t.metric not in scoped)
        ]


def parse_accuracy(text: str, registry: Registry, outputs: Sequence[str]) -> Constraint:
    """Parse an ``--accuracy`` expression.

    Args:
        text: The expression.
        registry: For the installed metric names.
        outputs: The model's output names, to check output-scoped terms.

    Raises:
        UsageError: A term does not parse, names an unknown metric or output, or bounds
            a metric in the wrong direction.
    """
    thresholds: list[Threshold] = []
    atol: dict[str | None, float] = {}
    rtol: dict[str | None, float] = {}
    for raw in text.split(","):
        term = raw.strip()
        m = _TERM.match(term)
        if not m:
            raise OptionError(
                "accuracy", f" '{text}': cannot parse '{term}'; write terms like "
                "cos>=0.999, l0<=0.001, atol=1e-3 or out0:linf<=0.01"
            )
        out, name, op, val = m["out"], m["name"], m["op"], m["val"]
        if val[0] in "<>=":  # "rel_l2<=" parses as "<" then "="
            lead = re.match(r"[<>=]+", op + val)
            ops = lead.group() if lead else op
            if ops in ("<=", ">="):
                raise OptionError("accuracy", f" '{text}': '{term}' has no number after "
                                  f"{ops}; write e.g. {name}{ops}0.01")
            raise OptionError("accuracy", f" '{text}': '{ops}' in '{term}' is not an "
                              f"operator; write e.g. {name}>=0.99 or {name}<=0.01")
        if out is not None and out not in outputs:
            raise OptionError(
                "accuracy", f" '{text}': unknown output '{out}'; outputs: {', '.join(outputs)}"
            )
        try:
            value = float(val)
        except ValueError as e:
            raise OptionError("accuracy", f" '{text}': '{val}' is not a number") from e
        if not math.isfinite(value):
            raise OptionError("accuracy", f" '{text}': '{val}' must be a finite number")
        if name in ("atol", "rtol"):
            if op != "=" or value < 0:
                raise OptionError("accuracy", f" '{text}': write {name}=<non-negative number>")
            tolerances = atol if name == "atol" else rtol
            if out in tolerances:
                raise OptionError("accuracy", f" '{text}': {name} is set twice"
                                  f"{f' for {out}' if out else ''}; give it once")
            tolerances[out] = value
            continue
        if op == "=" and name not in registry.metrics:
            raise OptionError("accuracy", f" '{text}': unknown setting '{name}'; '=' sets only "
                              "atol or rtol, and a metric takes <= or >=")
        if op == "=":
            raise OptionError("accuracy", f" '{text}': '{term}' needs <= or >=, not =")
        if any(t.metric == name and t.output == out for t in thresholds):
            raise OptionError("accuracy", f" '{text}': {name} is bounded twice"
                              f"{f' for {out}' if out else ''}; give one bound")
        metric = _metric(registry, name, text)
        if metric.higher_is_better != (op in (">=", ">")):
            want = ">=" if metric.higher_is_better else "<="
            kind = "a similarity" if metric.higher_is_better else "an error"
            raise OptionError("accuracy", f" '{text}': {name} is {kind}; bound it with {want}")
        _check_range(metric, op, value, term, text)
        thresholds.append(Threshold(name, op, value, out))
    if not thresholds:
        raise OptionError("accuracy", f" '{text}': no metric bound; add one such as cos>=0.999")
    return Constraint(text, tuple(thresholds), atol, rtol)


def _check_range(metric: Metric, op: str, value: float, term: str, text: str) -> None:
    """Refuse a bound no candidate can meet, or one that every candidate meets."""
    span = f"{metric.name} lies in [{metric.lowest:g}, {metric.highest:g}]"
    lower = op in (">=", ">")  # a lower bound on a similarity
    never = value > metric.highest or (op == ">" and value >= metric.highest) if lower else (
        value < metric.lowest or (op == "<" and value <= metric.lowest))
    always = value <= metric.lowest if lower else value >= metric.highest
    if never:
        raise OptionError("accuracy", f" '{text}': '{term}' can never hold ({span}); "
                          "loosen the bound")
    if always:
        raise OptionError("accuracy", f" '{text}': '{term}' always holds ({span}); "
                          "tighten the bound")


def _metric(registry: Registry, name: str, text: str):  # noqa: ANN202
    try:
        return registry.metric(name)
    except UsageError as e:
        raise OptionError("accuracy", f" '{text}': {e}") from e


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
            if t.metric not in values:
                raise Unjudgeable(f"{name}: metric {t.metric} was not measured")
            got = values[t.metric]
            if not _OPS[t.op](got, t.value):
                failures.append(f"{name}: {t.metric} {got:.6g}, needs {t.op} {t.value:g}")
    return Verdict(not failures, measurement.metrics, tuple(failures), measurement.notes)


def _flat(values: Sequence[Any]) -> np.ndarray:
    """One output over every input set, as one flat array.

    A sequence output (a list of tensors, which may differ in shape) is its tensors
    one after another; a tensor is itself.
    """
    parts = [np.asarray(t).ravel() for v in values
             for t in (v if isinstance(v, (list, tuple)) else [v])]
    return np.concatenate(parts) if parts else np.zeros(0)


def measure_accuracy(
    registry: Registry,
    outputs: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
    tolerances: Tolerances,
) -> AccuracyMeasurement:
    """Compare a candidate's outputs with the reference outputs, set by set; no bounds.

    Args:
        registry: For the metric functions.
        outputs: One mapping of output name to array per validation input set (a
            sequence output is a list of arrays; outputs that are not numbers, such as
            strings, are compared exactly, without metrics).
        references: The reference outputs, in the same order and with the same names.
        tolerances: Per output name, ``(atol, rtol)`` (`Constraint.tolerance_map`).

    Returns:
        Every registered metric per output, over all input sets at once and per input
        set, and the faults.
    """
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
        finite, mismatches = split_nonfinite(out.astype(np.float64), ref.astype(np.float64))
        if mismatches:
            faults.append(f"{name}: {mismatches} NaN/Inf value(s) that differ from the "
                          "reference's (the same infinity, or NaN where it is NaN, match)")
        atol, rtol = tolerances.get(name, (DEFAULT_TOL, DEFAULT_TOL))
        metrics[name] = {m: registry.metric(m)(out, ref, atol, rtol) for m in registry.metrics}
        if len(references) > 1:
            per_set[name] = tuple(_set_metrics(registry, o[name], r[name], atol, rtol)
                                  for o, r in zip(outputs, references, strict=True))
        kept = ref.astype(np.float64)[finite]
        span = float(np.ptp(kept)) if kept.size else 0.0
        if span <= atol:
            notes.append(
                f"{name}: the reference is almost constant (range {span:.3g}); "
                "relative metrics say little here"
            )
    return AccuracyMeasurement(metrics, tuple(faults), tuple(notes),
                               {n: tolerances.get(n, (DEFAULT_TOL, DEFAULT_TOL))
                                for n in references[0]}, per_set)


def _set_metrics(registry: Registry, out: Any, ref: Any, atol: float, rtol: float
                 ) -> dict[str, float]:
    """Every metric of one input set's output, computed as `measure_accuracy` does.

    Empty when its size differs from the reference's (the pooled sizes may agree).
    """
    o, r = _flat([out]), _flat([ref])
    if o.shape != r.shape:
        return {}
    return {m: registry.metric(m)(o, r, atol, rtol) for m in registry.metrics}


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
    return judge(measure_accuracy(registry, outputs, references, tolerances), constraint)
