"""Latency measurement and paired speed-ups, the same for every backend.

Warm-up runs first, then timed runs in blocks until a minimum count, a minimum duration
and a minimum number of blocks are reached (or a cap). Each run is timed by the runner
(`Runner.timed`: wall clock around the call and `synchronize`, or device events). The
runs rotate over the validation input sets, so repeated runs do not measure one input's
cache state.

Two engines are compared in paired blocks (`measure_blocks`, `paired_speedup`): runs
inside one block share the machine's state of that moment and are not independent, so
the unit of evidence is the block, not the run. The block order is ABBA (candidate,
base, base, candidate, …), so that a linear trend favours neither side. A candidate
block's speed-up is the mean of its neighbouring base blocks' medians over its own
median; the speed-up is the median of those ratios, with a distribution-free 95%
interval over blocks (`median_ci`).

Which figure is which:

- ``Latency.p50/p90/p99/mean``: percentiles of all timed runs pooled (ms), for tables;
- ``Latency.ci_low/ci_high``: the 95% interval of the median of the *block medians*
  (ms), honest about drift between blocks;
- ``Speedup.value`` and its interval: the paired estimate that verdicts use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from routetune.backend import Feed, Runner
from routetune.options import option

LATENCIES = ("device", "end-to-end")
"""The figures a GPU run is timed as (`MeasureSettings.latency`)."""


@dataclass(frozen=True)
class MeasureSettings:
    """How long to measure one candidate.

    Args:
        warmup: Untimed runs before timing, per input set.
        min_runs: Timed runs at least.
        min_time_s: Seconds of timed runs at least.
        max_runs: Timed runs at most, once `min_blocks` blocks are done: a block has
            ``max_runs // min_blocks`` runs at most (3 at least).
        max_time_s: Seconds of timed runs at most (wins over `min_runs`).
        min_blocks: Blocks per engine at least (the independent units of a paired
            comparison; 6 is the fewest for which a 95% interval of a median exists).
        latency: What a run's time is (`LATENCIES`): ``device``, the engine's compute
            with inputs and outputs on the device (`Runner.prepare`, timed by
            `Runner.timed`: CUDA events on a GPU); ``end-to-end``, host to host with
            the copies (`Runner.prepare_end_to_end`, wall clock). The same on a CPU.
        race: Whether a candidate's timing stops once its paired blocks show it cannot
            clear its bar, and a confirmation's once they show it clears
            (`routetune.timing.race`); else only below 0.5x.
        sequence: Whether a run is every input set in order, timed as one call (a
            decoder's generation: its prompt, then each decode step against the cache
            the one before grew; set by the run for the ``generate`` objective,
            `routetune.feeds.decoder`), rather than one set, in turn.
    """

    warmup: int = 3
    min_runs: int = option(20, help="Timed runs per candidate, at least.",
                           recipe="measure.min_runs", minimum=1)
    min_time_s: float = option(1.0, help="Seconds of timed runs per candidate, at least.",
                               recipe="measure.min_time_s", minimum=0)
    max_runs: int = 5000
    max_time_s: float = 20.0
    min_blocks: int = 10
    latency: str = option(
        "device", help="What the search optimises on a GPU: device (compute, I/O on the "
        "device) or end-to-end (host to host, copies included); both are recorded.",
        recipe="measure.latency", choices=("device", "end-to-end"))
    race: bool = option(
        True, help="Stop timing a candidate once its first 6 paired blocks are all below "
        "the speed-up it must reach (--min-speedup, or the leading route's), and a "
        "confirmation once its first 10 all clear --min-speedup; --no-race times each in "
        "full (stopping only below 0.5x).", recipe="measure.race",
        flag="--race/--no-race")
    sequence: bool = False

    @property
    def other_latency(self) -> str:
        """The `LATENCIES` entry this one is not: the figure recorded beside it."""
        return LATENCIES[1 - LATENCIES.index(self.latency)]

    @property
    def block_s(self) -> float:
        """Seconds per block: `BLOCK_S`, or less so that `min_time_s` spans `min_blocks`.

        Each block has 3 runs at least, whatever its length.
        """
        return min(BLOCK_S, self.min_time_s / max(self.min_blocks, 1))


@dataclass(frozen=True)
class Latency:
    """Latency statistics of one candidate, all in milliseconds.

    Args:
        n: Timed runs.
        p50: Median.
        p90: 90th percentile.
        p99: 99th percentile.
        mean: Mean.
        ci_low: Lower end of the 95% confidence interval of the median, over block
            medians when there are blocks (runs within a block are not independent).
        ci_high: Upper end of that interval.
        blocks: The median of each block of runs, in time order (ms).
    """

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    ci_low: float
    ci_high: float
    blocks: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """Half the width of the median's confidence interval, in ms."""
        return (self.ci_high - self.ci_low) / 2

    def scaled(self, factor: float) -> Latency:
        """Every statistic multiplied by `factor` (``n`` unchanged)."""
        return Latency(self.n, self.p50 * factor, self.p90 * factor, self.p99 * factor,
                       self.mean * factor, self.ci_low * factor, self.ci_high * factor,
                       tuple(b * factor for b in self.blocks))

    def ties(self, other: Latency) -> bool:
        """Whether the two medians' confidence intervals overlap (a tie)."""
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high


BLOCK_S = 0.1
"""Seconds per block of runs at the default settings."""

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


def latency_stats(samples_ms: Sequence[float], blocks: Sequence[float] = ()) -> Latency:
    """Summarise timed runs (ms) into a `Latency`.

    Args:
        samples_ms: Every timed run, in ms.
        blocks: The median of each block of runs (ms), in time order; the median's
            interval is taken over them when given, else over the runs.

    Raises:
        ValueError: `samples_ms` is empty.
    """
    if not samples_ms:
        raise ValueError("no timed runs")
    arr = np.asarray(samples_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    lo, hi = median_ci(blocks or samples_ms)
    return Latency(len(arr), float(p50), float(p90), float(p99), float(arr.mean()), lo, hi,
                   tuple(float(b) for b in blocks))


@dataclass(frozen=True)
class Block:
    """One block of consecutive runs of one engine.

    Args:
        runner: Index of the engine in the list given to `measure_blocks`.
        median_ms: The median of the block's timed runs (ms).
        runs: Timed runs in the block.
    """

    runner: int
    median_ms: float
    runs: int


@dataclass(frozen=True)
class Speedup:
    """A candidate's speed-up over the base route from paired blocks (unitless).

    Greater than 1 means faster. See the module docstring for how it is estimated.

    Args:
        value: The median of the block speed-ups.
        ci_low: Lower end of its distribution-free 95% interval (over blocks).
        ci_high: Upper end of that interval.
        pairs: Candidate blocks with a neighbouring base block: the sample size.
        drift: Half the spread (10th to 90th percentile) of the base route's block
            medians, relative to their median: how much the machine's speed moved
            during the comparison.
    """

    value: float
    ci_low: float
    ci_high: float
    pairs: int
    drift: float

    def clears(self, min_speedup: float) -> str | None:
        """Why this is not a clear win at `min_speedup`, or None when it is one.

        A clear win needs the interval's lower end above `min_speedup`, and a drift of
        the base route smaller than the effect claimed (``value - 1``).
        """
        if self.ci_low <= min_speedup:
            return (f"{self.value:.3f}x [{self.ci_low:.3f}, {self.ci_high:.3f}] is not "
                    f"above --min-speedup {min_speedup:g} beyond its 95% interval")
        if self.drift > self.value - 1:
            return (f"the base route's own speed drifted by ±{self.drift:.1%} during the "
                    f"comparison, more than the {self.value - 1:.1%} effect claimed")
        return None

    @property
    def figure(self) -> str:
        """The estimate with its interval, as reports print it: ``1.04x [0.97, 1.14]``."""
        return f"{self.value:.2f}x [{self.ci_low:.2f}, {self.ci_high:.2f}]"

    def ties(self, other: Speedup) -> bool:
        """Whether the two intervals overlap."""
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high


def paired_ratios(blocks: Sequence[Block], candidate: int = 0, base: int = 1) -> list[float]:
    """Each candidate block's speed-up over its neighbours, in time order.

    A candidate block is paired with the base blocks right before and after it in time
    (one or two); its ratio is their mean median over its own. Blocks with no base
    block beside them, or a median of 0 ms, give none.
    """
    ours = [b for b in blocks if b.runner in (candidate, base)]
    ratios = []
    for k, block in enumerate(ours):
        if block.runner != candidate:
            continue
        before = next((b for b in reversed(ours[:k]) if b.runner == base), None)
        after = next((b for b in ours[k + 1:] if b.runner == base), None)
        near = [b.median_ms for b in (before, after) if b is not None]
        if near and block.median_ms > 0:
            ratios.append(sum(near) / len(near) / block.median_ms)
    return ratios


def paired_speedup(blocks: Sequence[Block], candidate: int = 0, base: int = 1,
                   confidence: float = 0.95) -> Speedup:
    """The candidate's speed-up over the base engine from blocks in time order.

    Each candidate block is paired with the base blocks right before and after it in
    time (one or two); its ratio is their mean median over its own. The estimate is the
    median of the ratios, with the order-statistics interval of `median_ci`.

    Args:
        blocks: Blocks of both engines in the order they ran (`measure_blocks`).
        candidate: The candidate engine's index.
        base: The base engine's index.
        confidence: Coverage of the interval.

    Raises:
        ValueError: No candidate block has a base block next to it.
    """
    ratios = paired_ratios(blocks, candidate, base)
    if not ratios:
        raise ValueError("no candidate block next to a base block")
    base_medians = np.array([b.median_ms for b in blocks if b.runner == base])
    q10, q50, q90 = np.percentile(base_medians, [10, 50, 90])
    lo, hi = median_ci(ratios, confidence)
    return Speedup(float(np.median(ratios)), lo, hi, len(ratios),
                   float((q90 - q10) / 2 / q50) if q50 > 0 else 0.0)


def across_repeats(speedups: Sequence[Speedup]) -> Speedup:
    """One speed-up from independent repeats of a paired comparison.

    Paired blocks cancel what the machine does to both engines at once, but not what
    it does to one more than the other, and that changes from process to process and
    over seconds. On a 2-vCPU VM with no other process running, OpenVINO against ONNX
    Runtime measured 1.60x [1.57, 1.69] and then 1.80x [1.73, 1.89] in consecutive
    loops of one process, and 1.09x to 1.14x in four loops of the next process
    (`benchmarks/loop_repeats.py`; docs/benchmarks.md, "One loop is not enough"). A
    single loop's interval, over its blocks, cannot see that. So a verdict
    rests on several loops, each in a fresh process and at another time, as pyperf
    runs a benchmark in several processes because each has its own variance
    (https://pyperf.readthedocs.io/en/latest/run_benchmark.html).

    Returns:
        The median of the repeats' estimates, the lower of the middle two for an even
        count (two repeats are not averaged: on ppocr-cls, ``ort-threads`` measured 2.43x
        [1.08, 2.47] and then 1.07x [1.05, 1.10], and a mean of 1.75x would be a figure
        neither repeat supports); its interval runs from the lowest lower end to the
        highest upper end of theirs (so it clears ``--min-speedup`` only when every
        repeat does); the pairs summed and the largest drift.

    Raises:
        ValueError: No repeats.
    """
    if not speedups:
        raise ValueError("no repeats to combine")
    if len(speedups) == 1:
        return speedups[0]
    values = sorted(s.value for s in speedups)
    return Speedup(values[(len(values) - 1) // 2],
                   min(s.ci_low for s in speedups), max(s.ci_high for s in speedups),
                   sum(s.pairs for s in speedups), max(s.drift for s in speedups))


def measure(runner: Runner, feeds: Sequence[Feed], settings: MeasureSettings,
            warm: bool = False) -> Latency:
    """Time `runner` on `feeds`, rotating over them, in blocks.

    Args:
        runner: The engine.
        feeds: Input sets, run in turn.
        settings: How long.
        warm: It has already run every feed (`measure_blocks`' ``warm``).

    Returns:
        The latency statistics, in ms.
    """
    return measure_blocks([runner], feeds, settings,
                          warm=frozenset({0}) if warm else frozenset())[0][0]


def measure_side_by_side(runners: Sequence[Runner], feeds: Sequence[Feed],
                         settings: MeasureSettings) -> list[Latency]:
    """Time several runners in alternating blocks (`measure_blocks`); one `Latency` each."""
    return measure_blocks(runners, feeds, settings)[0]


def _in_order(calls: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """One call that makes every call of `calls`, in order."""
    def run() -> None:
        for call in calls:
            call()
    return run


def measure_blocks(runners: Sequence[Runner], feeds: Sequence[Feed], settings: MeasureSettings,
                   give_up: Callable[[list[Block]], bool] | None = None,
                   warm: frozenset[int] = frozenset(),
                   ) -> tuple[list[Latency], list[Block]]:
    """Time several runners in one loop, in blocks of runs, in ABBA order.

    Alternating puts every runner under the same machine conditions. The order of the
    runners is reversed every other round (A B, B A, A B …), so that a trend during the
    loop favours none. Each block lasts about `MeasureSettings.block_s` (3 runs at least,
    and at most a `MeasureSettings.min_blocks`-th of `MeasureSettings.max_runs`) and,
    with several runners, its first run is not counted: a runtime's idle threads
    may still be busy-waiting after the previous block (ONNX Runtime's thread pools
    spin), which would slow the other runner. The count, time and block limits of
    `settings` apply per runner. `MeasureSettings.latency` says what a run is: device
    compute, or host to host with the copies. `give_up`, asked after every round with
    the blocks so far, ends the timing early when it answers True
    (`routetune.timing.race.out_of_race`). Warm-up is `MeasureSettings.warmup` runs per
    input set; a runner whose index is in `warm` has already run every input set (a
    candidate after its accuracy pass) and runs each prepared call once, and
    `MeasureSettings.warmup` runs in all at least; where its calls run the engine as its
    accuracy pass did (`Runner.calls_like_infer`), `MeasureSettings.warmup` runs only.
    A runner timed before on the same input sets (the base route's engine, kept open in
    a worker from one candidate to the next) reuses its calls, which have all run
    (`Runner.prepared`): it runs
    `MeasureSettings.warmup` of them, to wake its threads, not one per input set.

    Returns:
        One `Latency` per runner, in order (ms), and every block in time order.
    """
    end_to_end = settings.latency == "end-to-end"
    kept = [runner.prepared(feeds, end_to_end) for runner in runners]
    calls = [k.calls for k in kept]
    if settings.sequence:  # one run is every set in order (a decoder's generation)
        calls = [[_in_order(c)] for c in calls]
    timers = [runner.wall_timed if end_to_end else runner.timed for runner in runners]
    for i, (runner, prepared) in enumerate(zip(runners, kept, strict=True)):
        n = len(prepared.calls)
        runs = (settings.warmup if prepared.ran or (i in warm and runner.calls_like_infer)
                else max(n, settings.warmup) if i in warm else n * settings.warmup)
        for k in range(runs):
            prepared.calls[k % n]()
        runner.synchronize()
        prepared.ran = True
    samples: list[list[float]] = [[] for _ in runners]
    blocks: list[Block] = []
    spent = [0.0] * len(runners)
    done = [0] * len(runners)  # runs so far, to rotate over the input sets
    skip = 1 if len(runners) > 1 else 0
    per_block = max(3, settings.max_runs // max(settings.min_blocks, 1))
    rounds = 0
    while True:
        order = range(len(runners)) if rounds % 2 == 0 else reversed(range(len(runners)))
        for i in order:
            runner = runners[i]
            block_start = time.perf_counter_ns()
            block: list[float] = []
            k = 0
            while True:
                call = calls[i][done[i] % len(calls[i])]
                done[i] += 1
                ms = timers[i](call)
                t1 = time.perf_counter_ns()
                if k >= skip:
                    block.append(ms)
                k += 1
                if k - skip >= 3 and ((t1 - block_start) / 1e9 >= settings.block_s
                                      or len(block) >= per_block):
                    break
            samples[i].extend(block)
            spent[i] += sum(block) / 1e3
            blocks.append(Block(i, float(np.median(block)), len(block)))
        rounds += 1
        n = min(len(s) for s in samples)
        enough = (n >= settings.min_runs and min(spent) >= settings.min_time_s
                  and rounds >= settings.min_blocks)
        capped = n >= settings.max_runs and rounds >= settings.min_blocks
        if (enough or capped or max(spent) >= settings.max_time_s
                or (give_up is not None and give_up(blocks))):
            medians = [[b.median_ms for b in blocks if b.runner == i]
                       for i in range(len(runners))]
            return [latency_stats(s, m) for s, m in zip(samples, medians, strict=True)], blocks
