"""Racing: a candidate's timing stops once its paired blocks show it cannot clear its bar.

A candidate races against a bar: the speed-up over the base route it must reach to
matter, ``--min-speedup`` or the lower end of the leading route's interval, whichever
is higher (`Bar`). After `RACE_PAIRS` paired blocks (`routetune.timing.measure.paired_ratios`),
it is out of the race when every one of them is below the bar: its timing ends there,
with the figure those blocks give, and the rest of the search's time goes to the
candidates still in the race.

The rule is a one-sided sign test (Dixon and Mood, "The statistical sign test", JASA
41, 1946) with one look. A candidate whose true paired speed-up is at the bar or above
puts each block's ratio at or above the bar with probability 1/2 or more, so all
`RACE_PAIRS` below it happens with probability at most 2^-6 = 1/64 (`RACE_ERROR`, 1.6%),
for blocks as independent as the paired interval assumes (`median_ci`). The figure of
a candidate out of the race is still a measurement: it is stored and reported with
its interval, and it may still be confirmed later like any other route. Before racing,
routetune stopped only candidates below 0.5x ("hopeless"): that is this rule with a bar
of 0.5 (`HOPELESS`), which still applies when racing is off (``--no-race``).

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
from dataclasses import dataclass

from routetune.timing.measure import Block, Speedup, paired_ratios, paired_speedup

RACE_PAIRS = 6
"""Paired blocks a race is judged on: the fewest for which all below the bar has
probability at most 1/64 under the bar (the sign test's exact tail, 2^-6)."""

RACE_ERROR = 2.0 ** -RACE_PAIRS
"""The chance that a candidate at its bar or above leaves the race (1/64, 1.6%)."""


CLEAR_PAIRS = 10
"""Paired blocks the early look of a confirmation is judged on: all above the bar has
probability at most 2^-10 for a route at the bar or below (the sign test's tail)."""

CLEAR_ERROR = 2.0 ** -CLEAR_PAIRS
"""The chance that a route at its bar or below clears at the early look (1/1024, 0.1%)."""


@dataclass(frozen=True)
class Bar:
    """The paired speed-up over the base route a candidate must be able to reach.

    Args:
        speedup: The bar (x over the base route).
        source: Where it comes from, for the note: ``--min-speedup``, or the leading
            route and its interval.
    """

    speedup: float
    source: str

    @classmethod
    def min_speedup(cls, value: float) -> Bar:
        """The bar of ``--min-speedup`` `value`: what a route must clear to win."""
        return cls(value, f"--min-speedup {value:g}")


HOPELESS = Bar(0.5, "half the base route's speed")
"""The bar of a run without racing: a candidate at less than half the base route's
speed cannot win whatever the others do."""


FAILED_ACCURACY = Bar(math.inf, "it failed the accuracy constraint")
"""The bar of a candidate that failed the accuracy constraint: it cannot win whatever its
speed, so it is timed for `RACE_PAIRS` paired blocks, enough for a figure with an
interval (what a precision repair and the report read), and no more."""


def out_of_race(blocks: Sequence[Block], bar: Bar, candidate: int = 0,
                base: int = 1) -> Speedup | None:
    """The candidate's paired speed-up if it is out of the race, else None.

    Out: `RACE_PAIRS` final paired ratios or more, and the first `RACE_PAIRS` of them
    all below ``bar.speedup``. A ratio is final once the base block after its candidate
    block has run. The decision rests on the first `RACE_PAIRS` final ratios only, so it
    is one test however often it is asked.

    Args:
        blocks: Blocks of both engines in the order they ran (`measure_blocks`).
        bar: The bar the candidate races against.
        candidate: The candidate engine's index.
        base: The base engine's index.
    """
    ratios = _final_ratios(blocks, candidate, base)
    if len(ratios) < RACE_PAIRS or max(ratios[:RACE_PAIRS]) >= bar.speedup:
        return None
    return paired_speedup(blocks, candidate, base)


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
                f"[{speedup.ci_low:.3f}, {speedup.ci_high:.3f}] over the base route; "
                f"{bar.source}, so it cannot win")
    return (f"out of the race after {speedup.pairs} paired blocks: {speedup.value:.3f}x "
            f"[{speedup.ci_low:.3f}, {speedup.ci_high:.3f}] over the base route; its first "
            f"{RACE_PAIRS} all below {bar.speedup:.3g}x ({bar.source}), so it cannot win "
            f"(sign test: a route at that bar or above stops with probability "
            f"{RACE_ERROR:.1%} at most)")
