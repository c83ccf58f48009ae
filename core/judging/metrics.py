"""Accuracy metrics: one number per output, comparing a candidate with the reference.

The names follow trtexec's ``--accuracyAlgorithm`` (samples/common/sampleAccuracy and
the trtexec README, section 7.5), so TensorRT users find them familiar:

- ``l0``: the fraction of elements with ``|out - ref| > atol + rtol * |ref|``.
- ``l1``: the mean absolute error.
- ``l2``: the mean squared error.
- ``linf``: the largest absolute error.
- ``cos``: the cosine similarity (higher is better; trtexec reports ``1 - cos``).
- ``rel_l2``: ``||out - ref||_2 / ||ref||_2``, the relative L2 error.

Every metric computes in float64 over the flattened arrays, with one rule for values
that are not finite (`split_nonfinite`), the same for every metric:

- a position where both sides hold the same infinity matches (``-inf`` by design in a
  masked log-softmax or CTC log-probabilities);
- a position where the reference is NaN matches a NaN;
- every other position where either side is not finite (one side only, or two different
  infinities) is an error;
- the metric is computed over the positions where both sides are finite. An error makes
  a fraction metric (``l0``) count that position as outside the tolerance, and every
  other metric take its worst value (``cos`` -1, the errors +inf).

Task metrics (`TaskMetric`; the built-ins are in `routetune.judging.task_metrics`) judge
what a model's user sees (the class, the decoded text, the detected region) rather than
the tensor. One sees an output of every validation input set at once and gives a rate
(or a mean, or a maximum) over *samples*: the rows its ``samples`` function cuts each
array into. The rule above holds per sample: a sample with a position that does not
match (NaN or Inf in the candidate where the reference is finite, and the like) is a
disagreement and gets the metric's worst score; positions that match (the same
infinity, NaN for NaN) are compared as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from routetune.hookspecs import hookimpl
from routetune.registry import Registry

MetricFn = Callable[[np.ndarray, np.ndarray, float, float], float]
ScoreFn = Callable[[np.ndarray, np.ndarray, "float | None"], np.ndarray]


@dataclass(frozen=True)
class Metric:
    """An accuracy metric usable in ``--accuracy`` expressions.

    Args:
        name: The name used in expressions (``cos``).
        fn: ``fn(out, ref, atol, rtol) -> float`` over float64 flat arrays of equal size.
        higher_is_better: True for similarities (``cos``), False for errors.
        help: One line.
        lowest: The smallest value the metric can take (0 for errors, -1 for ``cos``).
        highest: The largest (1 for ``cos`` and ``l0``; inf for unbounded errors).
        fraction: The metric is the fraction of positions that fail (``l0``): a
            non-finite mismatch counts as one failing position, instead of giving the
            metric its worst value.
    """

    name: str
    fn: MetricFn
    higher_is_better: bool
    help: str = ""
    lowest: float = 0.0
    highest: float = float("inf")
    fraction: bool = False

    @property
    def best(self) -> float:
        """The value of two identical arrays."""
        return 1.0 if self.higher_is_better else 0.0

    @property
    def worst(self) -> float:
        """The value a non-finite mismatch gives (see the module docstring)."""
        return self.lowest if self.higher_is_better else self.highest

    def __call__(self, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
        """Compute the metric on two arrays of the same shape (any numeric dtype).

        Non-finite values follow the module docstring's rule.

        Returns:
            The metric's value as a Python float.
        """
        a = np.asarray(out, dtype=np.float64).ravel()
        b = np.asarray(ref, dtype=np.float64).ravel()
        fa, fb, mismatches = finite_pair(a, b)
        return self._value(fa, fb, atol, rtol, a.size, mismatches)

    def of_finite(self, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
        """`__call__` of two flat float64 arrays already known to be finite everywhere.

        The caller has checked (`all_finite`): the value is `__call__`'s, bit for bit,
        without its two passes over the arrays. `routetune.judging.accuracy` checks the
        pooled output once and reads every metric of it and of each input set this way.
        """
        return self._value(out, ref, atol, rtol, out.size, 0)

    def _value(self, fa: np.ndarray, fb: np.ndarray, atol: float, rtol: float, size: int,
               mismatches: int) -> float:
        """The metric over the finite positions `fa`, `fb` of `size` with `mismatches`."""
        n = fa.size
        if self.fraction:
            inner = float(self.fn(fa, fb, atol, rtol)) if n else 0.0
            return (inner * n + mismatches) / size if size else 0.0
        if mismatches:
            return self.worst
        return float(self.fn(fa, fb, atol, rtol)) if n else self.best


@dataclass(frozen=True)
class TaskParam:
    """The one parameter of a task metric, written after ``@`` (``mask_iou@0.3``).

    Args:
        name: What it is (``threshold``, ``k``, ``blank``), for messages.
        default: Its value when a term gives none (``mask_iou`` is ``mask_iou@0.3``).
        help: What it means, for messages (``the probability threshold``).
        integer: Only whole numbers (``topk@5``, ``ctc@0``).
        minimum: The smallest value allowed.
        classes: A class index or count: it must be below the size of the output's
            last axis (the classes) where the model fixes it.
    """

    name: str
    default: float
    help: str
    integer: bool = False
    minimum: float = -math.inf
    classes: bool = False

    def problem(self, value: float) -> str | None:
        """Why `value` cannot be this parameter, in a few words; None when it can."""
        if not math.isfinite(value):
            return f"{self.name} must be a finite number"
        if self.integer and value != int(value):
            return f"{self.name} must be a whole number"
        if value < self.minimum:
            return f"{self.name} must be {self.minimum:g} or more"
        return None


@dataclass(frozen=True)
class TaskMetric:
    """A task-level accuracy metric: one number over every validation sample at once.

    It is registered like a `Metric` (``registry.add_metric``) and bounded like one in
    ``--accuracy`` (``top1>=0.99``, ``out0:mask_iou@0.5>=0.99``), but it sees one output
    of every input set together (`measure`), cut into samples, so that its value is a
    rate over samples: 39 argmaxes of 40 that agree give 0.975. Non-finite values follow
    the module docstring's rule, per sample.

    Args:
        name: The name used in expressions (``top1``).
        samples: ``samples(array) -> (S, ...)``: one input set's array (any shape) as S
            samples along the first axis (``(N, C)`` stays; ``(C,)`` is one sample).
        score: ``score(out, ref, param) -> (S,)`` float64: each sample's score, from two
            arrays in `samples`' shape and in their own dtypes (a threshold compares as
            the model's post-processing would: 0.3 in float32 is 0.3f); ``param`` is the
            ``@`` value (None without `param`).
        higher_is_better: True for agreement rates, False for errors.
        help: One line.
        lowest: The smallest value it takes (the worst score of a rate).
        highest: The largest.
        pool: How sample scores become its value: ``mean`` (a rate, a mean IoU) or
            ``max`` (the largest error).
        param: Its ``@`` parameter; None when it takes none.
        min_rank: The rank an output needs for the value to mean something (``ctc``:
            2, for ``(T, C)``); a bound on an output of lower rank is refused.
    """

    name: str
    samples: Callable[[np.ndarray], np.ndarray]
    score: ScoreFn
    higher_is_better: bool
    help: str = ""
    lowest: float = 0.0
    highest: float = 1.0
    pool: str = "mean"
    param: TaskParam | None = None
    min_rank: int = 0

    fraction = False
    """Never a fraction of elements (`Metric.fraction`): a mismatch spoils its sample."""

    @property
    def best(self) -> float:
        """The value of identical outputs."""
        return self.highest if self.higher_is_better else self.lowest

    @property
    def worst(self) -> float:
        """The score of a sample whose non-finite values do not match the reference's."""
        return self.lowest if self.higher_is_better else self.highest

    def key(self, param: float | None = None) -> str:
        """The name of its value in a measurement: ``ctc@0``; ``top1`` (no parameter).

        Args:
            param: The ``@`` value; None for the default.
        """
        if self.param is None:
            return self.name
        return f"{self.name}@{self.param.default if param is None else param:g}"

    def sample_scores(self, out: np.ndarray, ref: np.ndarray, param: float | None = None
                      ) -> np.ndarray:
        """Each sample's score for one input set's pair of arrays: float64 (S,).

        A sample with a position whose non-finite values do not match
        (`split_nonfinite`) scores `worst`.

        Raises:
            ValueError: The two arrays differ in shape.
        """
        a, b = np.asarray(out), np.asarray(ref)
        if a.shape != b.shape:
            raise ValueError(f"{self.name}: shapes {a.shape} and {b.shape} differ")
        sa, sb = self.samples(a), self.samples(b)
        if not len(sb):
            return np.zeros(0)
        value = None if self.param is None else (
            self.param.default if param is None else param)
        with np.errstate(invalid="ignore", over="ignore"):
            scores = np.array(self.score(sa, sb, value), dtype=np.float64)
        if all_finite(sa, sb):  # the common case: every position matches
            return scores
        flat_a = sa.reshape(len(sa), -1).astype(np.float64)
        flat_b = sb.reshape(len(sb), -1).astype(np.float64)
        with np.errstate(invalid="ignore"):
            matched = ((np.isfinite(flat_a) & np.isfinite(flat_b))
                       | (np.isinf(flat_b) & (flat_a == flat_b))
                       | (np.isnan(flat_a) & np.isnan(flat_b)))
        scores[~matched.all(axis=1)] = self.worst
        return scores

    def measure(self, outs: Sequence[np.ndarray], refs: Sequence[np.ndarray],
                param: float | None = None) -> float:
        """The metric over every sample of every input set.

        Args:
            outs: The candidate's arrays of one output, one per input set (any shape
                and numeric dtype; a sequence output's tensors one after another).
            refs: The reference's, in the same order and shapes.
            param: The ``@`` value; None for the default.

        Returns:
            The samples' scores pooled (`pool`); `best` when there is no sample.

        Raises:
            ValueError: An array differs in shape from its reference.
        """
        scores = [self.sample_scores(o, r, param) for o, r in zip(outs, refs, strict=True)]
        return self.pooled(np.concatenate(scores) if scores else np.zeros(0))

    def pooled(self, scores: np.ndarray) -> float:
        """Sample scores (`sample_scores`) as the metric's value; `best` for none."""
        if not scores.size:
            return self.best
        return float(np.max(scores) if self.pool == "max" else np.mean(scores))

    def __call__(self, out: np.ndarray, ref: np.ndarray, atol: float = 0.0,
                 rtol: float = 0.0) -> float:
        """The metric of one input set at its default parameter, as `Metric.__call__`.

        `atol` and `rtol` are not used: a task metric has its own parameter.
        """
        return self.measure([out], [ref])


AnyMetric = Metric | TaskMetric
"""What ``registry.add_metric`` takes: a tensor metric or a task metric."""


def split_nonfinite(out: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, int]:
    """Where both arrays are finite, and how many non-finite positions do not match.

    Matches: the same infinity on both sides, or NaN where the reference is NaN. Any
    other position with a non-finite value on either side is a mismatch.

    Args:
        out: The candidate's values, float64, flat.
        ref: The reference's, same shape.

    Returns:
        A boolean mask of the positions finite on both sides, and the mismatch count.
    """
    fo, fr = np.isfinite(out), np.isfinite(ref)
    finite = fo & fr
    with np.errstate(invalid="ignore"):
        same_inf = np.isinf(ref) & (out == ref)
    matched = finite | same_inf | (np.isnan(ref) & np.isnan(out))
    return finite, int(out.size - matched.sum())


def all_finite(*arrays: np.ndarray) -> bool:
    """Whether every value of these float arrays is finite, in one summing pass each.

    A sum is finite only when no value is NaN or infinite; a sum of finite values that
    overflows answers False too, and the caller then takes the exact path
    (`split_nonfinite`), so the answer True is always right.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return all(math.isfinite(float(np.sum(a))) for a in arrays)


def finite_pair(out: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The positions finite on both sides, of each array, and the mismatch count.

    As `split_nonfinite`, without a mask or a copy when every value is finite (the
    common case: the arrays come back as they were given).

    Args:
        out: The candidate's values, float64, flat.
        ref: The reference's, same shape.
    """
    if all_finite(out, ref):
        return out, ref, 0
    finite, mismatches = split_nonfinite(out, ref)
    return out[finite], ref[finite], mismatches


def _l0(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> float:
    return float(np.mean(np.abs(a - b) > atol + rtol * np.abs(b)))


def _cos(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _rel_l2(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> float:
    nb = np.linalg.norm(b)
    diff = np.linalg.norm(a - b)
    return float(diff / nb) if nb > 0 else (0.0 if diff == 0 else float("inf"))


BUILTIN_METRICS = (
    Metric("l0", _l0, False, "fraction of elements outside atol + rtol*|ref|", 0.0, 1.0,
           fraction=True),
    Metric("l1", lambda a, b, *_: np.mean(np.abs(a - b)), False, "mean absolute error"),
    Metric("l2", lambda a, b, *_: np.mean((a - b) ** 2), False, "mean squared error"),
    Metric("linf", lambda a, b, *_: np.max(np.abs(a - b)), False, "largest absolute error"),
    Metric("cos", _cos, True, "cosine similarity", -1.0, 1.0),
    Metric("rel_l2", _rel_l2, False, "||out - ref|| / ||ref||"),
)


@hookimpl
def routetune_register_metrics(registry: Registry) -> None:
    """Register the built-in metrics: l0, l1, l2, linf, cos, rel_l2."""
    for metric in BUILTIN_METRICS:
        registry.add_metric(metric)
