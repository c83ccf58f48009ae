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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from routetune import hookimpl
from routetune.registry import Registry

MetricFn = Callable[[np.ndarray, np.ndarray, float, float], float]


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
        finite, mismatches = split_nonfinite(a, b)
        n = int(finite.sum())
        if self.fraction:
            inner = float(self.fn(a[finite], b[finite], atol, rtol)) if n else 0.0
            return (inner * n + mismatches) / a.size if a.size else 0.0
        if mismatches:
            return self.worst
        return float(self.fn(a[finite], b[finite], atol, rtol)) if n else self.best


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
