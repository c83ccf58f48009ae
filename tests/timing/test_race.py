"""Racing on synthetic paired streams: who leaves the race, and how often by mistake."""

from __future__ import annotations

import numpy as np

from routetune.timing.measure import Block, paired_ratios, paired_speedup
from routetune.timing.race import (
    CLEAR_ERROR,
    CLEAR_PAIRS,
    EARLY_ERROR,
    EARLY_PAIRS,
    FAILED_ACCURACY,
    FAILED_PAIRS,
    HOPELESS,
    RACE_ERROR,
    RACE_PAIRS,
    Bar,
    clears_early,
    decided,
    failed_accuracy,
    out_of_race,
)

BAR = Bar(1.03, "--min-speedup 1.03")
NOISE = 0.03
"""Block-to-block spread of a paired ratio (lognormal sigma): about what this 2-core VM
shows on ONNX Runtime CPU engines (docs/benchmarks.md)."""
BLOCKS = 10
"""Candidate blocks of a full timing (`MeasureSettings.min_blocks`)."""


def stream(true: float, rng: np.random.Generator, n: int = BLOCKS) -> list[Block]:
    """Candidate (0) and base (1) blocks in ABBA order, as `measure_blocks` runs them:
    candidate block k at `true` x with noise."""
    out = []
    for k, ratio in enumerate(true * np.exp(rng.normal(0.0, NOISE, n))):
        pair = [Block(0, 1.0 / ratio, 3), Block(1, 1.0, 3)]
        out += pair if k % 2 == 0 else pair[::-1]
    return out


def raced(blocks: list[Block], bar: Bar = BAR) -> tuple[int | None, list[Block]]:
    """Ask `out_of_race` after every round (two blocks) as `measure_blocks` does: the
    pairs at the stop (None: timed in full), and the blocks timed."""
    for end in range(2, len(blocks) + 1, 2):
        if out_of_race(blocks[:end], bar) is not None:
            return paired_speedup(blocks[:end]).pairs, blocks[:end]
    return None, blocks


STOP = RACE_PAIRS + 1
"""Candidate blocks timed when one leaves the race at the sign test's look: in ABBA
order the sixth candidate block ends its round, and its ratio is final once the next
round's base block ran."""
EARLY_STOP = EARLY_PAIRS
"""The same at the early look: the third round runs the candidate's block first, so its
ratio is final at the round's end."""


def test_a_far_slower_candidate_leaves_after_three_pairs() -> None:
    rng = np.random.default_rng(0)
    for true in (0.25, 0.5):
        assert {raced(stream(true, rng))[0] for _ in range(200)} == {EARLY_STOP}


def test_a_clearly_slower_candidate_leaves_at_one_of_the_two_looks() -> None:
    rng = np.random.default_rng(0)
    stops = [raced(stream(0.90, rng))[0] for _ in range(400)]
    assert set(stops) == {EARLY_STOP, STOP}


def test_a_true_five_percent_effect_is_never_dropped() -> None:
    rng = np.random.default_rng(1)
    assert [raced(stream(1.05, rng))[0] for _ in range(2000)] == [None] * 2000


def test_a_one_percent_effect_ends_as_a_tie_whether_or_not_it_is_dropped() -> None:
    rng = np.random.default_rng(2)
    outcomes = [raced(stream(1.01, rng)) for _ in range(500)]
    dropped = sum(pairs is not None for pairs, _ in outcomes)
    assert 0 < dropped < len(outcomes)  # the bar is 2% away: three noise widths or less
    for _, timed in outcomes:  # its figure never clears the bar: the base route stands
        assert paired_speedup(timed).clears(BAR.speedup) is not None


def test_a_candidate_at_the_bar_leaves_no_more_often_than_the_stated_error() -> None:
    rng = np.random.default_rng(3)
    n = 20_000
    dropped = sum(raced(stream(BAR.speedup, rng, STOP))[0] is not None
                  for _ in range(n))
    assert dropped / n <= RACE_ERROR * 1.15  # 2^-7 + 2^-6, and sampling error (sd 0.1%)
    assert dropped / n >= 2.0 ** -RACE_PAIRS * 0.8  # the sign test's exact tail at least


def test_at_the_bar_the_early_look_alone_stops_no_more_often_than_its_level() -> None:
    rng = np.random.default_rng(9)
    n = 20_000
    early = sum(raced(stream(BAR.speedup, rng, EARLY_STOP))[0] is not None for _ in range(n))
    assert early / n <= EARLY_ERROR * 1.3  # 2^-7 for normal log-ratios, sampling (sd 0.06%)


def test_the_early_look_rests_on_the_first_three_final_ratios() -> None:
    slow = stream(0.5, np.random.default_rng(4), EARLY_STOP)
    assert out_of_race(slow[:2 * EARLY_PAIRS - 1], BAR) is None  # the third ratio waits
    assert out_of_race(slow[:2 * EARLY_PAIRS], BAR) is not None  # for its base block
    fast_start = stream(1.2, np.random.default_rng(5), 1) + stream(0.5, np.random.default_rng(
        6), 20)
    # one of the first three above: not at the early look, at the sign test's (all six
    # below is not the case either), so timed in full
    assert raced(fast_start)[0] is None


def test_a_candidate_that_failed_accuracy_is_timed_for_three_ratios_whatever_its_speed() -> None:
    for true in (0.5, 1.0, 3.0):
        blocks = stream(true, np.random.default_rng(4))
        pairs, timed = raced(blocks, FAILED_ACCURACY)
        assert pairs == EARLY_STOP
        stopped = out_of_race(timed, FAILED_ACCURACY)
        assert stopped is not None
        ratios = paired_ratios(timed, 0, 1)[:EARLY_PAIRS]
        # its interval is the t interval of those three ratios, not their full range
        assert stopped.ci_low < min(ratios) and stopped.ci_high > max(ratios)
        assert stopped.ci_low < true < stopped.ci_high


def test_a_failed_candidate_is_timed_on_while_its_interval_holds_a_repairs_bar() -> None:
    """A repair keeps nodes in FP32, so it is no faster than the failed route: where the
    failed route's interval holds the bar a repair would race against, a few more
    blocks (up to 7) tell whether a repair is worth its trials."""
    rng = np.random.default_rng(4)
    for true in (0.5, 3.0):  # far from the bar either way: three ratios tell
        pairs, _ = raced(stream(true, rng), failed_accuracy(BAR))
        assert pairs == EARLY_STOP
    tie = stream(1.0, np.random.default_rng(7))
    three = out_of_race(tie[:2 * EARLY_PAIRS], FAILED_ACCURACY)
    assert three is not None and three.ci_low < BAR.speedup < three.ci_high  # holds it
    pairs, timed = raced(tie, failed_accuracy(BAR))
    assert pairs is not None and EARLY_STOP < pairs <= FAILED_PAIRS + 1
    stopped = out_of_race(timed, failed_accuracy(BAR))
    assert stopped is not None and stopped.ci_high - stopped.ci_low < three.ci_high - three.ci_low
    assert stopped.ci_low < 1.0 < stopped.ci_high  # still a 95% interval of the truth
    # without a bar (no racing), three ratios as before
    assert raced(tie, failed_accuracy(None))[0] == EARLY_STOP


def test_the_decision_rests_on_the_first_six_final_ratios() -> None:
    slow = stream(0.97, np.random.default_rng(4), STOP)
    assert out_of_race(slow[:2 * RACE_PAIRS], BAR) is None  # the sixth ratio waits
    assert out_of_race(slow[:2 * RACE_PAIRS + 1], BAR) is not None  # for its base block
    fast_start = stream(1.2, np.random.default_rng(5), 2) + stream(0.9, np.random.default_rng(
        6), 20)
    assert raced(fast_start)[0] is None  # one of the first six above: it stays in


def test_without_racing_only_a_hopeless_candidate_stops() -> None:
    rng = np.random.default_rng(7)
    assert raced(stream(0.9, rng), HOPELESS)[0] is None
    assert raced(stream(0.3, rng), HOPELESS)[0] == EARLY_STOP


def tie_positive_rate(replicate: bool, runs: int = 4000) -> float:
    """How often a tie (true 1.0x, the VM's noise) counts as shown faster."""
    from routetune.candidate.pairing import replicated

    rng = np.random.default_rng(7)
    shown = 0
    for _ in range(runs):
        first = paired_speedup(stream(1.0, rng, 12))
        if first.ci_low > 1.0 and replicate:
            first, _ = replicated(first, lambda: stream(1.0, rng, 12))
        shown += first.ci_low > 1.0
    return shown / runs


def test_a_tie_shown_faster_by_chance_is_caught_by_its_replication() -> None:
    """One stretch of 12 pairs shows a tie faster about 2% of the time (the interval's
    one-sided 2.5%, discrete); with the replication, both stretches must show it."""
    alone, twice = tie_positive_rate(False), tie_positive_rate(True)
    assert 0.005 < alone < 0.04
    assert twice < 0.002 and twice < alone / 10


def test_a_real_gain_survives_its_replication_and_the_note_gives_both_figures() -> None:
    from routetune.candidate.pairing import replicated

    rng = np.random.default_rng(3)
    first = paired_speedup(stream(1.15, rng, 12))
    assert first.ci_low > 1.0
    both, (note,) = replicated(first, lambda: stream(1.15, rng, 12))
    assert both.ci_low > 1.0 and both.pairs == 2 * first.pairs
    assert note.startswith(f"shown faster than the base route, so timed again for as many "
                           f"blocks: {first.figure}, then ") and "; both show it," in note


CONFIRM = 30
"""Candidate blocks of a full confirmation (`routetune.candidate.candidate.CONFIRM_BLOCKS`)."""


def cleared(blocks: list[Block], bar: Bar = BAR) -> int | None:
    """Ask `clears_early` after every round as a confirmation does: the pairs at the stop
    (None: timed in full)."""
    for end in range(2, len(blocks) + 1, 2):
        paired = clears_early(blocks[:end], bar)
        if paired is not None:
            return paired.pairs
    return None


def test_a_clear_win_holds_at_the_early_look() -> None:
    rng = np.random.default_rng(8)
    stops = {cleared(stream(1.20, rng, CONFIRM)) for _ in range(500)}
    assert stops == {CLEAR_PAIRS + 1}  # the tenth ratio is final with the next base block


def test_a_tie_never_clears_at_the_early_look() -> None:
    rng = np.random.default_rng(9)
    assert all(cleared(stream(1.0, rng, CONFIRM)) is None for _ in range(2000))


def test_a_route_at_the_bar_clears_early_no_more_often_than_the_stated_error() -> None:
    rng = np.random.default_rng(10)
    n = 20_000
    early = sum(cleared(stream(BAR.speedup, rng, CLEAR_PAIRS + 1)) is not None
                for _ in range(n))
    assert early / n <= CLEAR_ERROR * 2  # 1/1024, and sampling error (sd 0.02%)


def test_the_early_look_rests_on_the_first_ten_final_ratios() -> None:
    slow_start = stream(0.95, np.random.default_rng(11), 1) + stream(
        1.3, np.random.default_rng(12), CONFIRM)
    assert cleared(slow_start) is None  # one of the first ten below the bar: timed in full
    fast = stream(1.3, np.random.default_rng(13), CLEAR_PAIRS + 1)
    assert clears_early(fast[:2 * CLEAR_PAIRS], BAR) is None  # the tenth ratio waits
    assert clears_early(fast[:2 * CLEAR_PAIRS + 1], BAR) is not None  # for its base block


def test_a_drifting_base_route_does_not_clear_early() -> None:
    """All ten ratios above the bar, but the base route's own speed moved by more than the
    effect: the full timing's drift rule holds at the early look too."""
    blocks = []
    for k in range(CLEAR_PAIRS + 1):
        base_ms = 1.0 + 0.2 * k  # the machine slows down steadily, 3x over the loop
        pair = [Block(0, base_ms / 1.2, 3), Block(1, base_ms, 3)]  # a true 1.2x
        blocks += pair if k % 2 == 0 else pair[::-1]
    assert min(paired_ratios_of(blocks)) > BAR.speedup
    assert clears_early(blocks, BAR) is None


def paired_ratios_of(blocks: list[Block]) -> list[float]:
    from routetune.timing.measure import paired_ratios

    return paired_ratios(blocks)


def side_by_side_stream(trues: list[float], rng: np.random.Generator, n: int
                        ) -> list[Block]:
    """A base engine (0) and one engine per entry of `trues`, in the alternating order
    `measure_blocks` runs several engines in (0 1 2, 2 1 0, …)."""
    out = []
    for k in range(n):
        row = [Block(0, 1.0, 3)] + [Block(i + 1, 1.0 / (t * np.exp(rng.normal(0, NOISE))), 3)
                                    for i, t in enumerate(trues)]
        out += row if k % 2 == 0 else row[::-1]
    return out


def test_a_side_by_side_loop_is_decided_once_every_engine_cleared_or_left() -> None:
    rng = np.random.default_rng(15)
    blocks = side_by_side_stream([3.0, 0.8], rng, CONFIRM)
    rounds = next(k for k in range(1, CONFIRM + 1)
                  if decided(blocks[:3 * k], BAR, base=0))
    # the fast one clears at its early look (its tenth ratio final in the tenth round or
    # the next), the slow one has left the race after six pairs by then
    assert CLEAR_PAIRS <= rounds <= CLEAR_PAIRS + 1
    tie = side_by_side_stream([3.0, 1.0], np.random.default_rng(16), CONFIRM)
    assert not any(decided(tie[:3 * k], BAR, base=0) for k in range(1, CONFIRM + 1)
                   if out_of_race(tie[:3 * k], BAR, 2, 0) is None)


def test_the_early_figure_is_a_95_percent_interval_and_a_tie_is_rarely_shown_faster() -> None:
    rng = np.random.default_rng(10)
    floor = Bar(1.94, "another backend's base route")
    covered, shown, stops = 0, 0, 0
    for _ in range(4000):
        blocks = stream(1.0, rng)
        for end in range(2, len(blocks) + 1, 2):
            paired = out_of_race(blocks[:end], floor)
            if paired is not None:
                break
        assert paired is not None and paired.pairs == EARLY_STOP  # far below 1.94x
        stops += 1
        covered += paired.ci_low <= 1.0 <= paired.ci_high
        shown += paired.ci_low > 1.0
    # the t interval covers the true ratio 95% of the time (normal log-ratios), so a tie
    # counts as shown faster about 2.5% of the time, as a full timing's would; the full
    # range of 3 ratios would show it 1/8 of the time
    assert covered / stops >= 0.93 and shown / stops <= 0.035
