"""Accuracy metrics: one number per output, comparing a candidate with the reference.

The names follow trtexec's ``--accuracyAlgorithm`` (samples/common/sampleAccuracy and
the trtexec README, section 7.5), so TensorRT users find them familiar:

- ``l0``: the fraction of elements with ``|out - ref| > atol + rtol * |ref|``.
- ``l1``: the mean absolute error.
- ``l2``: the mean squared error.
- ``linf``: the largest absolute error.
- ``cos``: the cosine similarity (higher is better; trtexec reports ``1 - cos``).
- ``rel_l2``: ``||out - ref||_2 / ||ref||_2``, the relative L2 error.

Every metric computes in float64 over the flattened arrays.
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
    """

    name: str
    fn: MetricFn
    higher_is_better: bool
    help: str = ""
    lowest: float = 0.0
    highest: float = float("inf")

    def __call__(self, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
        """Compute the metric on two arrays of the same shape.

        Returns:
            The metric's value as a Python float.
        """
        a = np.asarray(out, dtype=np.float64).ravel()
        b = np.asarray(ref, dtype=np.float64).ravel()
        if a.size == 0:
            return 1.0 if self.higher_is_better else 0.0
        return float(self.fn(a, b, atol, rtol))


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
    Metric("l0", _l0, False, "fraction of elements outside atol + rtol*|ref|", 0.0, 1.0),
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
