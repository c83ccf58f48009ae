"""Racing: a candidate's timing stops once its paired blocks show it cannot clear its bar.

A candidate races against a bar: the speed-up over the base route it must reach to
matter, ``--min-speedup`` or the lower end of the leading route's interval, whichever
is higher (`Bar`). It is out of the race at one of two looks at its final paired ratios
(`routetune.timing.measure.paired_ratios`), and its timing ends there, with the figure
its blocks give; the rest of the search's time goes to the candidates still in the race.

- **Far below the bar, after `EARLY_PAIRS` (3).** Its first 3 ratios all below the bar,
  and a one-sided t-test on their logarithms (Student, "The probable error of a mean",
  Biometrika 6, 1908) rejects a median at the bar at level 2^-7 (`EARLY_ERROR`, 0.8%),
  with their standard deviation taken as at least `EARLY_SD` (2%, below the block-to-
  block spread of paired ratios on a quiet 2-core VM, docs/benchmarks.md): on a quiet
  machine a gap of about 9% or more. For the log-ratios of blocks as independent and
  normal as the paired interval assumes; whatever their distribution, the three signs
  alone bound it at 1/8. This is the look that ends candidates a faster backend or
  leader has left far behind (ONNX Runtime's routes against OpenVINO's base route at
  3.7x on PP-OCR's detector).
- **Below the bar, after `RACE_PAIRS` (6).** Every one of its first 6 ratios below the
  bar: a one-sided sign test (Dixon and Mood, "The statistical sign test", JASA 41,
  1946). A candidate whose true paired speed-up is at the bar or above puts each ratio
  at or above it with probability 1/2 or more, so all 6 below happens with probability
  at most 2^-6 = 1/64 (1.6%), for blocks as independent as the paired interval assumes
  (`median_ci`), whatever their distribution.

Each look rests on the first 3 or 6 final ratios only, so each is one test however
often it is asked, and a candidate at its bar or above leaves the race by mistake with
probability at most 2^-7 + 2^-6 (`RACE_ERROR`, 2.3%; two looks, Bonferroni's
inequality). The figure of a candidate out of the race is still a measurement: it is
stored and reported with its interval, and it may still be confirmed later like any
other route. At the early look that interval is the 95% t interval of its 3 ratios
(`EARLY_CI_T`): the full range of 3, the distribution-free order-statistics interval
for so few, covers the median only 3 times in 4, and showed a tie faster 1 time in 8.
Before racing, routetune stopped only candidates below 0.5x ("hopeless"): that is this
rule with a bar of 0.5 (`HOPELESS`), which still applies when racing is off
(``--no-race``). A candidate that failed the accuracy constraint cannot win at any
speed: it is timed for the early look's 3 ratios (`failed_accuracy`), for a figure
with its t interval (what a precision repair and the report read); where that interval
holds the bar a repair of it would race against, up to `FAILED_PAIRS` (7), until it
does not: a repair keeps nodes in FP32, so it is no faster than the failed route, and
is tried only where the failed route's interval reaches that bar
(`routetune.passes.precision.bisection`).

The same test, the other way, ends a confirmation early (`clears_early`): a route whose
first `CLEAR_PAIRS` paired blocks all lie above ``--min-speedup`` holds at that look,
without the rest of its 30 blocks. This is a two-look group-sequential design (Pocock,
"Group sequential methods in the design and analysis of clinical trials", Biometrika
64, 1977), its error split by Bonferroni's inequality: a route whose true speed-up is at
the bar or below passes the early look with probability at most 2^-10 (`CLEAR_ERROR`,
0.1%), and the full timing's 95% interval with at most 2.5% (its lower end, one-sided),
so a confirmation clears by mistake with probability at most 2.6% instead of 2.5%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from routetune.timing.measure import Block, Speedup, paired_ratios, paired_speedup

RACE_PAIRS = 6
"""Paired ratios the sign test's look is judged on: the fewest for which all below the
bar has probability at most 1/64 under the bar (the sign test's exact tail, 2^-6)."""

EARLY_PAIRS = 3
"""Paired ratios the early look is judged on (the t-test's, with 2 degrees of freedom)."""

EARLY_ERROR = 2.0 ** -7
"""The early look's level: the chance that a candidate at its bar leaves there (0.8%)."""

def _t2(tail: float) -> float:
    """Student's t with 2 degrees of freedom exceeded with probability `tail`.

    The closed form of its distribution: P(T > t) = 1/2 - t / (2 sqrt(2 + t^2)).
    """
    q = 1 - 2 * tail
    return math.sqrt(2 * q * q / (1 - q * q))


EARLY_T = _t2(EARLY_ERROR)
"""The early look's critical t (7.91)."""

EARLY_CI_T = _t2(0.025)
"""The t of a two-sided 95% interval from 3 ratios (4.30): the figure of a candidate out
of the race at the early look, whose 3 ratios give no distribution-free 95% interval
(their full range covers the median with probability 3/4 only)."""

EARLY_SD = 0.02
"""The least standard deviation the early look takes for the log-ratios (2%): three
ratios that happen to agree closely do not make a small gap look certain."""

RACE_ERROR = EARLY_ERROR + 2.0 ** -RACE_PAIRS
"""The chance that a candidate at its bar or above leaves the race at either look
(2^-7 + 2^-6, 2.3%; Bonferroni's inequality)."""


CLEAR_PAIRS = 10
"""Paired blocks the early look of a confirmation is judged on: all above the bar has
probability at most 2^-10 for a route at the bar or below (the sign test's tail)."""

CLEAR_ERROR = 2.0 ** -CLEAR_PAIRS
"""The chance that a route at its bar or below clears at the early look (1/1024, 0.1%)."""


FAILED_PAIRS = RACE_PAIRS + 1
"""Paired ratios a candidate that failed accuracy is timed for at most (`failed_accuracy`)."""

T_975 = {2: EARLY_CI_T, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447}
"""Student's t exceeded with probability 2.5%, by degrees of freedom (R. A. Fisher and F.
Yates, "Statistical Tables for Biological, Agricultural and Medical Research", 1938,
Table III): the 95% t interval of 3 to `FAILED_PAIRS` ratios."""


@dataclass(frozen=True)
class Bar:
    """The paired speed-up over the base route a candidate must be able to reach.

    Args:
        speedup: The bar (x over the base route).
        source: Where it comes from, for the note: ``--min-speedup``, or the leading
            route and its interval.
        repair: For a candidate that failed accuracy (`failed_accuracy`): the bar a
            repair of it would race against, or None.
    """

    speedup: float
    source: str
    repair: float | None = None

    @classmethod
    def min_speedup(cls, value: float) -> Bar:
        """The bar of ``--min-speedup`` `value`: what a route must clear to win."""
        return cls(value, f"--min-speedup {value:g}")


HOPELESS = Bar(0.5, "half the base route's speed")
"""The bar of a run without racing: a candidate at less than half the base route's
speed cannot win whatever the others do."""


FAILED_ACCURACY = Bar(math.inf, "it failed the accuracy constraint")
"""The bar of a candidate that failed the accuracy constraint: it cannot win whatever its
speed, so it is timed for `EARLY_PAIRS` paired blocks, enough for a figure with a 95% t
interval (what a precision repair and the report read), and no more. (Until 2026-12-07:
`RACE_PAIRS`, 7 blocks; on PP-OCR's detector with both CPU backends, 10 accuracy failures
took 4 more blocks each.)"""


def failed_accuracy(bar: Bar | None) -> Bar:
    """The bar of a candidate that failed accuracy in a search racing against `bar`.

    As `FAILED_ACCURACY`, but timed on while the t interval of its ratios holds
    ``bar.speedup`` (up to `FAILED_PAIRS`): whether a repair of it could reach the bar
    is what its figure is read for. On the recogniser, OpenVINO's FP16 route at 0.994x
    [0.934, 1.060] after 3 blocks held the bar of 1.03x, and its repair then ran 6
    trials (about 60 s) that could not reach it.
    """
    return FAILED_ACCURACY if bar is None else replace(FAILED_ACCURACY, repair=bar.speedup)


def out_of_race(blocks: Sequence[Block], bar: Bar, candidate: int = 0,
                base: int = 1) -> Speedup | None:
    """The candidate's paired speed-up if it is out of the race, else None.

    Out: `far_below` at its first `EARLY_PAIRS` final paired ratios, or its first
    `RACE_PAIRS` all below ``bar.speedup``; a candidate that failed accuracy
    (`FAILED_ACCURACY`) at its first `EARLY_PAIRS`, whatever they are: it is timed for a
    figure. A ratio is final once the base block after its candidate block has
    run. Each look rests on its first ratios only, so it is one test however often it
    is asked.

    Args:
        blocks: Blocks of both engines in the order they ran (`measure_blocks`).
        bar: The bar the candidate races against.
        candidate: The candidate engine's index.
        base: The base engine's index.
    """
    ratios = _final_ratios(blocks, candidate, base)
    if math.isinf(bar.speedup):
        return _failed_figure(blocks, ratios, bar, candidate, base)
    if len(ratios) >= EARLY_PAIRS and far_below(ratios[:EARLY_PAIRS], bar.speedup):
        paired = paired_speedup(blocks, candidate, base)
        low, high = _t_interval(ratios[:EARLY_PAIRS])
        return replace(paired, ci_low=low, ci_high=high)
    if len(ratios) >= RACE_PAIRS and max(ratios[:RACE_PAIRS]) < bar.speedup:
        return paired_speedup(blocks, candidate, base)
    return None


def _failed_figure(blocks: Sequence[Block], ratios: Sequence[float], bar: Bar,
                   candidate: int, base: int) -> Speedup | None:
    """The figure of a candidate that failed accuracy, once it is timed enough.

    At `EARLY_PAIRS` final ratios or more, with the 95% t interval of them all; later
    while that interval holds ``bar.repair``, up to `FAILED_PAIRS`.
    """
    if len(ratios) < EARLY_PAIRS:
        return None
    low, high = _t_interval(ratios[:FAILED_PAIRS])
    if bar.repair is not None and len(ratios) < FAILED_PAIRS and low <= bar.repair <= high:
        return None
    paired = paired_speedup(blocks, candidate, base)
    return replace(paired, ci_low=low, ci_high=high)


def far_below(ratios: Sequence[float], bar: float) -> bool:
    """Whether paired ratios lie far enough below `bar` for the early look.

    Every ratio below the bar, and the one-sided t statistic of their logarithms against
    the bar's, (log bar - mean) / (max(sd, `EARLY_SD`) / sqrt(n)), at least `EARLY_T`.
    """
    if not ratios or max(ratios) >= bar or min(ratios) <= 0:
        return False
    mean, error = _log_mean(ratios)
    return (math.log(bar) - mean) / error >= EARLY_T


def _log_mean(ratios: Sequence[float]) -> tuple[float, float]:
    """The mean of the ratios' logarithms and its standard error (sd at least `EARLY_SD`)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    sd = max(float(logs.std(ddof=1)) if len(logs) > 1 else 0.0, EARLY_SD)
    return float(logs.mean()), sd / math.sqrt(len(logs))


def _t_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """The 95% t interval of the ratios' geometric mean, as ratios (`T_975`)."""
    mean, error = _log_mean(ratios)
    t = T_975[len(ratios) - 1]
    return math.exp(mean - t * error), math.exp(mean + t * error)


def _final_ratios(blocks: Sequence[Block], candidate: int, base: int) -> list[float]:
    """The candidate's paired ratios whose base block after it has run, in time order."""
    ratios = paired_ratios(blocks, candidate, base)
    ours = [b for b in blocks if b.runner in (candidate, base)]
    if ours and ours[-1].runner == candidate:  # its ratio waits for the next base block
        ratios = ratios[:-1]
    return ratios


def clears_early(blocks: Sequence[Block], bar: Bar, candidate: int = 0,
                 base: int = 1) -> Speedup | None:
    """The candidate's paired speed-up if it clears the bar at the early look, else None.

    Clears: `CLEAR_PAIRS` final paired ratios or more, the first `CLEAR_PAIRS` of them all
    above ``bar.speedup``, and the figure of every block so far clearing it as a full
    timing's must (`routetune.timing.measure.Speedup.clears`: its interval above the bar,
    the base route's drift below the effect). The test rests on the first `CLEAR_PAIRS`
    final ratios only, so it is one look however often it is asked.

    Args:
        blocks: Blocks of both engines in the order they ran (`measure_blocks`).
        bar: What the candidate must clear (``--min-speedup``).
        candidate: The candidate engine's index.
        base: The base engine's index.
    """
    ratios = _final_ratios(blocks, candidate, base)
    if len(ratios) < CLEAR_PAIRS or min(ratios[:CLEAR_PAIRS]) <= bar.speedup:
        return None
    paired = paired_speedup(blocks, candidate, base)
    return paired if paired.clears(bar.speedup) is None else None


def decided(blocks: Sequence[Block], bar: Bar, base: int = 0) -> bool:
    """Whether every engine but `base` has left the race or cleared at the early look.

    For a side-by-side loop of several engines, each against the same base engine:
    once each is decided, more blocks cannot change which of them clears the bar.
    """
    others = sorted({b.runner for b in blocks} - {base})
    return bool(others) and all(
        out_of_race(blocks, bar, k, base) is not None
        or clears_early(blocks, bar, k, base) is not None for k in others)


def cannot_reach(paired: Speedup | None, bar: Bar) -> bool:
    """Whether a paired figure lies wholly below the bar (the top of its 95% interval).

    Under ``--busy-machine wait`` such a figure stands, marked noisy, even if the machine
    was busy while it was timed (`routetune.timing.conditions.measure_watched`'s
    ``settled``): paired blocks cancel load that slows both engines alike, and load that
    slowed the candidate more can cost a missed route, never a false win, since a
    winner is confirmed on a quiet machine.
    """
    return paired is not None and paired.ci_high < bar.speedup


def race_note(speedup: Speedup, bar: Bar) -> str:
    """The note of a candidate out of the race (one line)."""
    if math.isinf(bar.speedup):
        return (f"timed for {speedup.pairs} paired blocks only: {speedup.value:.3f}x "
                f"[{speedup.ci_low:.3f}, {speedup.ci_high:.3f}] over the base route (a t "
                f"interval); {bar.source}, so it cannot win")
    if speedup.pairs < RACE_PAIRS:  # the early look, with its t interval
        return (f"out of the race after {speedup.pairs} paired blocks: {speedup.value:.3f}x "
                f"[{speedup.ci_low:.3f}, {speedup.ci_high:.3f}] over the base route (a t "
                f"interval: {speedup.pairs} blocks give no distribution-free one); its first "
                f"{EARLY_PAIRS} far below {bar.speedup:.3g}x ({bar.source}), so it cannot win "
                f"(t-test: a route at that bar or above stops at this look with probability "
                f"{EARLY_ERROR:.1%} at most)")
    return (f"out of the race after {speedup.pairs} paired blocks: {speedup.value:.3f}x "
            f"[{speedup.ci_low:.3f}, {speedup.ci_high:.3f}] over the base route; its first "
            f"{RACE_PAIRS} all below {bar.speedup:.3g}x ({bar.source}), so it cannot win "
            f"(sign test: a route at that bar or above leaves the race with probability "
            f"{RACE_ERROR:.1%} at most)")
