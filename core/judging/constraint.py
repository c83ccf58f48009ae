"""The accuracy expression: its grammar, and the parsed constraint.

An expression is a comma-separated list of terms; a term may be scoped to one output
with an ``output:`` prefix, and a task metric may take a parameter after ``@``::

    cos>=0.999
    l0<=0.001,atol=1e-3,rtol=1e-3
    out0:linf<=0.01,rel_l2<=1e-2
    mask_iou@0.3>=0.99
    probs:topk@5>=0.99,probs:top1>=0.95

In full: ``[output:]metric[@param](<=|>=|<|>)number``, or ``[output:](atol|rtol)=number``.
``atol`` and ``rtol`` set the tolerances of ``l0`` (trtexec's ``--atol``/``--rtol``). A
parameter belongs to a task metric (`routetune.judging.metrics.TaskMetric`): a term
without one takes the metric's default (``ctc`` is ``ctc@0``), and a tensor metric takes
none. An output-scoped term replaces the unscoped terms of the same metric for that
output, whatever their parameters.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from routetune.errors import UsageError
from routetune.feeds.decoder import is_cache_output
from routetune.judging.metrics import AnyMetric, TaskMetric
from routetune.options import OptionError
from routetune.registry import Registry

DEFAULT_ACCURACY = "l0<=0.001,atol=1e-3,rtol=1e-3"
"""The default constraint: at most 0.1% of elements outside 1e-3 + 1e-3·|ref|. It
combines a relative bound with an absolute floor, so outputs near zero stay judged.
A bundled example has its own, a task constraint (`routetune.feeds.examples`)."""

DEFAULT_TOL = 1e-5
"""atol and rtol when an expression sets neither (trtexec's defaults)."""

HEADLINE = ("rel_l2", False)
"""The value tables show beside the speed-up when no task metric is bounded: rel-L2,
||out - ref|| / ||ref||, the worst over outputs (lower is better; every trial with
outputs has it)."""

OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_TERM = re.compile(
    r"^(?:(?P<out>.+):)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:@(?P<param>[^\s<>=]*))?"
    r"\s*(?P<op><=|>=|<|>|=)\s*(?P<val>\S+)$"
)


@dataclass(frozen=True)
class Threshold:
    """One bound on one metric, for one output or (``output=None``) for all.

    Args:
        metric: The metric's name.
        op: ``<=``, ``>=``, ``<`` or ``>``.
        value: The bound.
        output: The output it is scoped to; None for every output.
        param: A task metric's ``@`` value (its default when the term gave none);
            None for a metric without one.
    """

    metric: str
    op: str
    value: float
    output: str | None = None
    param: float | None = None

    @property
    def key(self) -> str:
        """The name of the bounded value in a measurement: ``mask_iou@0.3``, ``cos``."""
        return self.metric if self.param is None else f"{self.metric}@{self.param:g}"

    def __str__(self) -> str:
        prefix = f"{self.output}:" if self.output else ""
        return f"{prefix}{self.key}{self.op}{self.value:g}"


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

    def binds(self, output: str) -> bool:
        """Whether a bound reads `output`: one scoped to it, or one scoped to none."""
        return any(t.output in (None, output) for t in self.thresholds)

    def tolerance_map(self, outputs: Sequence[str]) -> dict[str, tuple[float, float]]:
        """``(atol, rtol)`` per output: what a measurement under this constraint uses."""
        return {name: self.tolerances(name) for name in outputs}

    def task_params(self) -> dict[str, tuple[float, ...]]:
        """The ``@`` values to measure each task metric at, by metric name, sorted.

        A measurement computes every task metric at its default and at these
        (`routetune.judging.accuracy.measure_accuracy`).
        """
        found: dict[str, set[float]] = {}
        for t in self.thresholds:
            if t.param is not None:
                found.setdefault(t.metric, set()).add(t.param)
        return {name: tuple(sorted(values)) for name, values in sorted(found.items())}

    def headline(self, registry: Registry) -> tuple[str, bool]:
        """The value the tables show beside the speed-up, and whether higher is better.

        The first task-metric term's value (``mask_iou@0.3``, ``top1``): what the user
        judges the task by; scoped to its output when the term is (``logits:top1``).
        Without one, `HEADLINE` (rel-L2, lower is better).
        """
        for t in self.thresholds:
            entry = registry.metrics.get(t.metric)
            if entry is not None and isinstance(entry.item, TaskMetric):
                return (f"{t.output}:{t.key}" if t.output else t.key), t.op in (">=", ">")
        return HEADLINE

    def margin(self, metrics: Mapping[str, Mapping[str, float]]) -> float | None:
        """How far the tightest bound was from failing: its slack over the bound.

        Per bound, ``(value - bound) / max(|bound|, 1e-12)`` for ``>=`` and ``>``, the
        reverse for ``<=`` and ``<``; the least over every output. Positive: every
        bound held; negative: one failed (-0.01: 1% past its bound).

        Args:
            metrics: Per output name, metric name to value (a trial's ``accuracy``).

        Returns:
            The least slack; None when no bound has a finite value to compare.
        """
        slacks = []
        for name, values in metrics.items():
            for t in self.for_output(name):
                got = values.get(t.key)
                if got is None or not math.isfinite(got):
                    continue
                above = (got - t.value) / max(abs(t.value), 1e-12)
                slacks.append(above if t.op in (">=", ">") else -above)
        return min(slacks) if slacks else None

    def for_output(self, output: str) -> list[Threshold]:
        """The thresholds that apply to one output (scoped ones replace unscoped ones)."""
        scoped = {t.metric for t in self.thresholds if t.output == output}
        return [
            t for t in self.thresholds
            if t.output == output or (t.output is None and t.metric not in scoped)
        ]


def _fail(text: str, rest: str) -> OptionError:
    return OptionError("accuracy", f" '{text}': {rest}")


def parse_accuracy(text: str, registry: Registry, outputs: Sequence[str]) -> Constraint:
    """Parse an ``--accuracy`` expression.

    Args:
        text: The expression.
        registry: For the installed metric names.
        outputs: The model's output names, to check output-scoped terms.

    Raises:
        UsageError: A term does not parse, names an unknown metric or output, bounds
            a metric in the wrong direction, or gives a parameter its metric does not
            take (one line naming the term and the fix).
    """
    thresholds: list[Threshold] = []
    atol: dict[str | None, float] = {}
    rtol: dict[str | None, float] = {}
    for raw in text.split(","):
        term = raw.strip()
        m = _TERM.match(term)
        if not m:
            raise _fail(text, f"cannot parse '{term}'; write terms like cos>=0.999, "
                        "l0<=0.001, atol=1e-3, out0:linf<=0.01 or mask_iou@0.3>=0.99")
        out, name, op, val = m["out"], m["name"], m["op"], m["val"]
        if val[0] in "<>=":  # "rel_l2<=" parses as "<" then "="
            lead = re.match(r"[<>=]+", op + val)
            ops = lead.group() if lead else op
            if ops in ("<=", ">="):
                raise _fail(text, f"'{term}' has no number after {ops}; write e.g. "
                            f"{name}{ops}0.01")
            raise _fail(text, f"'{ops}' in '{term}' is not an operator; write e.g. "
                        f"{name}>=0.99 or {name}<=0.01")
        if out is not None and out not in outputs:
            raise _fail(text, f"unknown output '{out}'; outputs: {', '.join(outputs)}")
        try:
            value = float(val)
        except ValueError as e:
            raise _fail(text, f"'{val}' is not a number") from e
        if not math.isfinite(value):
            raise _fail(text, f"'{val}' must be a finite number")
        if name in ("atol", "rtol"):
            if op != "=" or value < 0 or m["param"] is not None:
                raise _fail(text, f"write {name}=<non-negative number>")
            tolerances = atol if name == "atol" else rtol
            if out in tolerances:
                raise _fail(text, f"{name} is set twice{f' for {out}' if out else ''}; "
                            "give it once")
            tolerances[out] = value
            continue
        if op == "=" and name not in registry.metrics:
            raise _fail(text, f"unknown setting '{name}'; '=' sets only atol or rtol, and a "
                        "metric takes <= or >=")
        if op == "=":
            raise _fail(text, f"'{term}' needs <= or >=, not =")
        metric = _metric(registry, name, text)
        param = _param(metric, m["param"], term, text, op, val)
        threshold = Threshold(name, op, value, out, param)
        if any(t.key == threshold.key and t.output == out for t in thresholds):
            raise _fail(text, f"{threshold.key} is bounded twice"
                        f"{f' for {out}' if out else ''}; give one bound")
        if metric.higher_is_better != (op in (">=", ">")):
            want = ">=" if metric.higher_is_better else "<="
            kind = "a similarity" if metric.higher_is_better else "an error"
            raise _fail(text, f"{name} is {kind}; bound it with {want}")
        _check_range(metric, op, value, term, text)
        thresholds.append(threshold)
    if not thresholds:
        raise _fail(text, "no metric bound; add one such as cos>=0.999")
    return Constraint(text, tuple(thresholds), atol, rtol)


def _param(metric: AnyMetric, given: str | None, term: str, text: str, op: str, val: str
           ) -> float | None:
    """The ``@`` value of a term: checked, or the metric's default when not given."""
    spec = metric.param if isinstance(metric, TaskMetric) else None
    if spec is None:
        if given is None:
            return None
        hint = (f"; for the top-k rate write topk@{given}{op}{val}"
                if metric.name == "top1" and given else "")
        raise _fail(text, f"{metric.name} takes no parameter, and '{term}' gives "
                    f"@{given}; write {metric.name}{op}{val}{hint}")
    if given is None:
        return spec.default
    example = f"{metric.name}@{spec.default:g}{op}{val}"
    if not given:
        raise _fail(text, f"'{term}' has nothing after @; give {metric.name}'s {spec.name} "
                    f"({spec.help}), e.g. {example}, or drop the @ for {spec.default:g}")
    try:
        number = float(given)
    except ValueError as e:
        raise _fail(text, f"'{given}' in '{term}' is not a number; {metric.name}@ takes "
                    f"{spec.help}, e.g. {example}") from e
    why = spec.problem(number)
    if why:
        raise _fail(text, f"'{term}': {metric.name}'s {why} ({spec.help}); write e.g. "
                    f"{example}")
    return number


def check_outputs(constraint: Constraint, registry: Registry,
                  shapes: Mapping[str, Sequence[int | str | None]]) -> None:
    """Refuse a task-metric bound on an output it cannot read, from the model's shapes.

    A decoder's KV-cache output (`routetune.feeds.decoder.is_cache_output`), a rank
    below the metric's ``min_rank`` (``ctc`` on a rank-1 output), or a class
    parameter (``ctc``'s blank, ``topk``'s k) not below the size of a known class axis
    (the last): the value would mean nothing, or always hold.

    Args:
        constraint: The parsed expression.
        registry: For the metrics.
        shapes: Each output's shape (a str or None is a dynamic dimension).

    Raises:
        UsageError: One line naming the term, the output and the fix.
    """
    for t in constraint.thresholds:
        metric = registry.metric(t.metric)
        if not isinstance(metric, TaskMetric):
            continue
        fits = [n for n, s in shapes.items() if len(s) >= metric.min_rank
                and not is_cache_output(n, len(s))]
        for name, shape in shapes.items():
            if t.output not in (None, name):
                continue
            if is_cache_output(name, len(shape)):
                fix = (f"scope it to another output, e.g. {fits[0]}:{t}" if fits else
                       "bound a tensor metric (rel_l2<=0.01)")
                raise _fail(constraint.text, f"{_which(t, constraint)}{t.metric} would "
                            f"read '{name}', a decoder's KV cache (keys and values, not "
                            f"classes), which gets the tensor metrics only; {fix}")
            if len(shape) < metric.min_rank:
                fix = (f"scope it to an output it fits, e.g. {fits[0]}:{t}"
                       if t.output is None and fits else "bound another metric (cos>=0.999)")
                raise _fail(constraint.text, f"{_which(t, constraint)}{t.metric} reads "
                            "outputs of rank "
                            f"{metric.min_rank} or more, and '{name}' has shape "
                            f"{tuple(shape)}; {fix}")
            spec, classes = metric.param, shape[-1] if shape else None
            if (spec is not None and spec.classes and isinstance(classes, int)
                    and t.param is not None and t.param >= classes):
                raise _fail(constraint.text, f"{_which(t, constraint)}{t.metric}'s "
                            f"{spec.name} {t.param:g} is "
                            f"not below the {classes} classes of '{name}' ({spec.help}); "
                            f"give one below {classes}")


def _which(term: object, constraint: Constraint) -> str:
    """``'term': `` to name the term in a longer expression; empty when it is the whole."""
    return "" if str(term) == constraint.text.strip() else f"'{term}': "


def _check_range(metric: AnyMetric, op: str, value: float, term: str, text: str) -> None:
    """Refuse a bound no candidate can meet, or one that every candidate meets."""
    span = f"{metric.name} lies in [{metric.lowest:g}, {metric.highest:g}]"
    lower = op in (">=", ">")  # a lower bound on a similarity
    never = value > metric.highest or (op == ">" and value >= metric.highest) if lower else (
        value < metric.lowest or (op == "<" and value <= metric.lowest))
    always = value <= metric.lowest if lower else value >= metric.highest
    if never:
        raise _fail(text, f"'{term}' can never hold ({span}); loosen the bound")
    if always:
        raise _fail(text, f"'{term}' always holds ({span}); tighten the bound")


def _metric(registry: Registry, name: str, text: str) -> AnyMetric:
    try:
        return registry.metric(name)
    except UsageError as e:
        raise OptionError("accuracy", f" '{text}': {e}") from e
