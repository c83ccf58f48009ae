"""Latency measurement, the same for every backend.

Warm-up runs first, then timed runs until both a minimum count and a minimum duration
are reached (or a cap). Each run is timed with `time.perf_counter_ns` around the
prepared call and the runner's `synchronize`. The runs rotate over the validation input
sets, so repeated runs do not measure one input's cache state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from routetune.backend import Feed, Runner


@dataclass(frozen=True)
class MeasureSettings:
    """How long to measure one candidate.

    Args:
        warmup: Untimed runs before timing, per input set.
        min_runs: Timed runs at least.
        min_time_s: Seconds of timed runs at least.
        max_runs: Timed runs at most.
        max_time_s: Seconds of timed runs at most (wins over `min_runs`).
    """

    warmup: int = 3
    min_runs: int = 20
    min_time_s: float = 1.0
    max_runs: int = 5000
    max_time_s: float = 20.0


@dataclass(frozen=True)
class Latency:
    """Latency statistics of one candidate, all in milliseconds.

    Args:
        n: Timed runs.
        p50: Median.
        p90: 90th percentile.
        p99: 99th percentile.
        mean: Mean.
        ci_low: Lower end of the 95% confidence interval of the median.
        ci_high: Upper end of that interval.
    """

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    ci_low: float
    ci_high: float

    @property
    def spread(self) -> float:
        """Half the width of the median's confidence interval, in ms."""
        return (self.ci_high - self.ci_low) / 2

    def scaled(self, factor: float) -> Latency:
        """Every statistic multiplied by `factor` (``n`` unchanged)."""
        return Latency(self.n, self.p50 * factor, self.p90 * factor, self.p99 * factor,
                       self.mean * factor, self.ci_low * factor, self.ci_high * factor)

    def ties(self, other: Latency) -> bool:
        """Whether the two medians' confidence intervals overlap (a tie)."""
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high


EXACT_UP_TO = 300
"""Sample counts up to which `median_ci` sums exact binomial terms (cheap below this)."""


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The interval is ``[x(j), x(n-j+1)]`` of the sorted samples, with the largest ``j``
    for which ``P(B <= j-1) <= (1-confidence)/2``, ``B ~ Binomial(n, 1/2)``. Above
    `EXACT_UP_TO` samples ``j`` comes from the normal approximation
    ``floor(n/2 - z*sqrt(n)/2)`` (z = 1.96 for 95%). Source: J.-Y. Le Boudec,
    *Performance Evaluation of Computer and Communication Systems*, EPFL Press 2010,
    Theorem 2.1 and the approximation after it. Below 6 samples no such ``j`` exists
    and the interval is the full range.

    Args:
        samples: The measurements (any unit), at least one.
        confidence: The coverage probability of the interval.

    Returns:
        ``(low, high)`` in the samples' unit.
    """
    xs = sorted(samples)
    n = len(xs)
    if n > EXACT_UP_TO:
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        j = max(int(math.floor(n / 2 - z * math.sqrt(n) / 2)), 1)
        return xs[j - 1], xs[n - j]
    alpha = Fraction(1.0 - confidence) / 2
    j, cum, total = 0, 0, 2**n
    while j < n // 2:
        cum += math.comb(n, j)  # cum = 2^n * P(B <= j), exact integers
        if Fraction(cum, total) > alpha:
            break
        j += 1
    j = max(j, 1)
    return xs[j - 1], xs[n - j]


def latency_stats(samples_ms: Sequence[float]) -> Latency:
    """Summarise timed runs (ms) into a `Latency`.

    Raises:
        ValueError: `samples_ms` is empty.
    """
    if not samples_ms:
        raise ValueError("no timed runs")
    arr = np.asarray(samples_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    lo, hi = median_ci(samples_ms)
    return Latency(len(arr), float(p50), float(p90), float(p99), float(arr.mean()), lo, hi)


def measure(runner: Runner, feeds: Sequence[Feed], settings: MeasureSettings) -> Latency:
    """Time `runner` on `feeds`, rotating over them.

    Args:
        runner: An opened engine.
        feeds: One or more input sets (name → array).
        settings: How long to measure.

    Returns:
        The latency statistics, in ms.
    """
    return measure_side_by_side([runner], feeds, settings)[0]


def measure_side_by_side(
    runners: Sequence[Runner], feeds: Sequence[Feed], settings: MeasureSettings,
    block_s: float = 0.1,
) -> list[Latency]:
    """Time several runners in one loop, in alternating blocks of runs.

    Alternating puts every runner under the same machine conditions, so the ratio of
    their medians is fair even when the machine's speed drifts during the loop. Each
    block lasts about `block_s` seconds (3 runs at least) and its first run is not
    counted: a runtime's idle threads may still be busy-waiting after the previous
    block (ONNX Runtime's thread pools spin), which would slow the other runner. The
    count and time limits of `settings` apply per runner.

    Returns:
        One `Latency` per runner, in order (ms).
    """
    calls = [[runner.prepare(feed) for feed in feeds] for runner in runners]
    for runner, prepared in zip(runners, calls, strict=True):
        for call in prepared:
            for _ in range(settings.warmup):
                call()
        runner.synchronize()
    samples: list[list[float]] = [[] for _ in runners]
    spent = [0.0] * len(runners)
    done = [0] * len(runners)  # runs so far, to rotate over the input sets
    while True:
        for i, runner in enumerate(runners):
            block_start = time.perf_counter_ns()
            k = 0
            while True:
                call = calls[i][done[i] % len(feeds)]
                done[i] += 1
                ms = runner.timed(call)
                t1 = time.perf_counter_ns()
                if k > 0 or len(runners) == 1:
                    samples[i].append(ms)
                    spent[i] += ms / 1e3
                k += 1
                if len(runners) == 1 or (k >= 3 and (t1 - block_start) / 1e9 >= block_s):
                    break
        n = min(len(s) for s in samples)
        enough = n >= settings.min_runs and min(spent) >= settings.min_time_s
        if enough or n >= settings.max_runs or max(spent) >= settings.max_time_s:
            return [latency_stats(s) for s in samples]
