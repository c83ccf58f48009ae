"""Built-in task metrics: whether a model's user gets the same class, text and regions.

Tensor metrics (`routetune.judging.metrics`) judge every element; a precision route can
fail them while the answer a user reads stays the same (PP-OCRv4's detector in FP16
moves 0.28% of its probability map beyond ``l0``'s tolerance and finds the same text,
issue 17).
These judge the answer. Each sees one output of every validation input set at once
(`routetune.judging.metrics.TaskMetric`) and is bounded per output like any metric:

- ``top1``: the rate of samples whose argmax over the last axis (the classes) agrees.
  A classifier's ``(N, C)`` output is N samples, ``(C,)`` one; any float dtype.
- ``topk@K``: the rate of samples whose reference class (its argmax) is among the
  candidate's K highest: top-k accuracy, the usual definition (ILSVRC's top-5 error,
  Russakovsky et al. 2015, "ImageNet Large Scale Visual Recognition Challenge"), with
  the reference's answer as the label. K is a whole number, 1 or more and below the
  classes; default 5. ``topk@1`` is ``top1``.
- ``ctc@B``: the rate of sequences that greedy CTC decoding reads the same. PP-OCR's
  recogniser gives ``(N, T, C)`` probabilities (``(1, 40, 6625)``): N sequences of T
  steps; B is the blank class, default 0 (`ctc_greedy`).
- ``mask_iou@T``: the mean over samples of the IoU of the maps above T (default 0.3,
  PaddleOCR's DB threshold; `mask_iou_scores`). Rank 3 or more (a detector's
  ``(N, 1, H, W)``) is one sample per index of the first axis; a lower rank is one.
- ``kl``: the mean over samples of the Kullback-Leibler divergence (nats; Kullback and
  Leibler, "On information and sufficiency", Ann. Math. Stat. 22, 1951) of the
  candidate's distribution from the reference's, each the softmax over the last axis
  of logits: a language model's ``(N, T, V)`` is N*T next-token distributions. The
  measure int4 and FP8 LLM evaluations report beside perplexity (llama.cpp's
  ``perplexity --kl-divergence``). 0 for identical logits; lower is better.
- ``prob_abs``: the largest absolute difference of probabilities (a VAD's per-frame
  speech probability, ``(frames,)``), capped at 1: two probabilities differ by at most 1,
  and a NaN where a probability belongs is as wrong as one can be.

Ties in an argmax go to the first index (numpy's ``argmax``, as PaddleOCR's decoders).
A sample with a non-finite value where the reference's is finite disagrees (the module
rule of `routetune.judging.metrics`).
"""

from __future__ import annotations

import math

import numpy as np

from routetune.hookspecs import hookimpl
from routetune.judging.metrics import TaskMetric, TaskParam
from routetune.registry import Registry


def _rows(a: np.ndarray) -> np.ndarray:
    """Samples along every axis but the last: ``(..., C)`` as ``(S, C)``; ``()`` as (1, 1)."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(-1, a.shape[-1]) if a.size else np.zeros((0, 1))


def _sequences(a: np.ndarray) -> np.ndarray:
    """``(..., T, C)`` as ``(S, T, C)``; rank 1 ``(C,)`` as one step ``(1, 1, C)``."""
    if not a.size:
        return np.zeros((0, 1, 1))
    if a.ndim < 2:
        return a.reshape(1, 1, -1)
    return a.reshape(-1, *a.shape[-2:])


def _maps(a: np.ndarray) -> np.ndarray:
    """Rank 3 or more: one sample per index of the first axis (the batch); else one."""
    if not a.size:
        return np.zeros((0, 1))
    return a.reshape(a.shape[0], -1) if a.ndim >= 3 else a.reshape(1, -1)


def _whole(a: np.ndarray) -> np.ndarray:
    """The whole array as one sample."""
    return a.reshape(1, -1)


def topk_scores(out: np.ndarray, ref: np.ndarray, k: float | None) -> np.ndarray:
    """1.0 per row whose reference argmax is within the candidate's top `k`, else 0.0.

    The candidate's order is descending with ties to the lower index (a stable sort of
    ``-out``), so ``k=1`` is ``argmax(out) == argmax(ref)``.

    Args:
        out: The candidate's rows ``(S, C)``, any real dtype.
        ref: The reference's, same shape.
        k: How many of the candidate's highest classes count; None for 1.

    Returns:
        float64 ``(S,)`` of 0.0 and 1.0.
    """
    label = np.argmax(ref, axis=1)
    at = out[np.arange(len(out)), label][:, None]
    index = np.arange(out.shape[1])[None, :]
    ahead = (out > at) | ((out == at) & (index < label[:, None]))
    return (ahead.sum(axis=1) < (1 if k is None else k)).astype(np.float64)


def ctc_greedy(probs: np.ndarray, blank: int = 0) -> list[np.ndarray]:
    """Greedy (best-path) CTC decoding of a batch of sequences.

    The class of each time step is its argmax; repeats are collapsed, then blanks are
    dropped (Graves et al. 2006, "Connectionist Temporal Classification", section 3.2,
    best path decoding; PaddleOCR's ``CTCLabelDecode``, ppocr/postprocess/rec_postprocess.py,
    with ``is_remove_duplicate=True`` and ignored token 0). A blank index outside the
    classes drops nothing.

    Args:
        probs: Scores ``(S, T, C)``: probabilities, logits or log-probabilities (any
            dtype; only their order counts).
        blank: The blank class (PP-OCR: 0).

    Returns:
        S int64 arrays of class indices, each of length 0 to T.
    """
    ids = np.argmax(probs, axis=2)
    keep = ids != blank
    keep[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    return [row[mask] for row, mask in zip(ids, keep, strict=True)]


def _ctc_scores(out: np.ndarray, ref: np.ndarray, blank: float | None) -> np.ndarray:
    b = 0 if blank is None else int(blank)
    return np.array([np.array_equal(x, y) for x, y in
                     zip(ctc_greedy(out, b), ctc_greedy(ref, b), strict=True)], np.float64)


def mask_iou_scores(out: np.ndarray, ref: np.ndarray, threshold: float | None) -> np.ndarray:
    """Per sample, the IoU of ``out > threshold`` and ``ref > threshold``.

    The map is cut as PaddleOCR's ``DBPostProcess`` cuts a DB probability map
    (``segmentation = pred > self.thresh``, ppocr/postprocess/db_postprocess.py;
    ``thresh`` 0.3 in the PP-OCR configs). Two empty masks agree: IoU 1.

    Args:
        out: The candidate's maps ``(S, H*W)``, any float dtype: the threshold is
            compared in it, as the post-processing would (0.3 as float32 is 0.3f).
        ref: The reference's, same shape.
        threshold: The cut; None for 0.3.

    Returns:
        float64 ``(S,)`` in [0, 1].
    """
    t = 0.3 if threshold is None else threshold
    a, b = out > t, ref > t
    inter, union = (a & b).sum(axis=1), (a | b).sum(axis=1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def kl_scores(out: np.ndarray, ref: np.ndarray, _: float | None) -> np.ndarray:
    """Per row, KL(softmax(ref) || softmax(out)) in nats, computed in float64.

    Args:
        out: The candidate's logits ``(S, V)``, any real dtype.
        ref: The reference's, same shape.

    Returns:
        float64 ``(S,)``, each 0 or more; inf where a candidate's log-probability is
        -inf where the reference's probability is not 0.
    """
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        shifted = x - x.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    log_p, log_q = log_softmax(ref), log_softmax(out)
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)


def _prob_abs_scores(out: np.ndarray, ref: np.ndarray, _: float | None) -> np.ndarray:
    a, b = out.astype(np.float64), ref.astype(np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    diff = np.where(both, np.abs(a - b), 0.0)
    return np.minimum(diff.max(axis=1, initial=0.0), 1.0)


TASK_METRICS = (
    TaskMetric("top1", _rows, topk_scores, True,
               "rate of samples whose argmax over the last axis agrees"),
    TaskMetric("topk", _rows, topk_scores, True,
               "rate of samples whose reference argmax is in the candidate's top k",
               param=TaskParam("k", 5, "how many of the candidate's classes count",
                               integer=True, minimum=1, classes=True), min_rank=1),
    TaskMetric("ctc", _sequences, _ctc_scores, True,
               "rate of (T, C) sequences that greedy CTC decoding reads the same",
               param=TaskParam("blank", 0, "the blank class index", integer=True,
                               minimum=0, classes=True), min_rank=2),
    TaskMetric("mask_iou", _maps, mask_iou_scores, True,
               "mean IoU per sample of the maps thresholded at the parameter",
               param=TaskParam("threshold", 0.3, "the probability threshold")),
    TaskMetric("kl", _rows, kl_scores, False,
               "mean KL divergence (nats) of the softmax over the last axis (logits) from "
               "the reference's", highest=math.inf),
    TaskMetric("prob_abs", _whole, _prob_abs_scores, False,
               "largest absolute difference of probabilities (capped at 1)", pool="max"),
)
"""The built-in task metrics (the module docstring says what each measures)."""


@hookimpl
def routetune_register_metrics(registry: Registry) -> None:
    """Register the built-in task metrics: top1, topk, ctc, mask_iou, kl, prob_abs."""
    for metric in TASK_METRICS:
        registry.add_metric(metric)
