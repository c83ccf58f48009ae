from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from routetune.backend import Runner
from routetune.timing.measure import (
    Latency,
    MeasureSettings,
    latency_stats,
    measure,
    measure_blocks,
    median_ci,
)


def test_median_ci_uses_order_statistics() -> None:
    # Le Boudec (2010), Table A.1: n=10 -> [x(2), x(9)]; n=6 -> [x(1), x(6)]; n=20 -> [x(6), x(15)]
    assert median_ci(list(range(1, 11))) == (2, 9)
    assert median_ci(list(range(1, 7))) == (1, 6)
    assert median_ci(list(range(1, 21))) == (6, 15)
    assert median_ci([5.0]) == (5.0, 5.0)


def test_median_ci_for_many_samples_does_not_overflow() -> None:
    lo, hi = median_ci([float(i) for i in range(5000)])
    assert 2400 < lo < 2500 < hi < 2600


def test_latency_stats_and_ties() -> None:
    lat = latency_stats([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert (lat.n, lat.p50, lat.mean, lat.ci_low, lat.ci_high) == (10, 5.5, 5.5, 2.0, 9.0)
    assert lat.spread == 3.5
    other = Latency(10, 20, 21, 22, 20, 19, 21)
    assert not lat.ties(other) and lat.ties(Latency(10, 9, 9, 9, 9, 8.5, 9.5))
    with pytest.raises(ValueError):
        latency_stats([])


class SleepRunner(Runner):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare(self, feed):  # noqa: ANN001, ANN201
        return lambda: (self.calls.append(feed["k"]), time.sleep(0.002))


def test_measure_rotates_inputs_and_meets_count_and_duration() -> None:
    runner = SleepRunner()
    settings = MeasureSettings(warmup=2, min_runs=10, min_time_s=0.05)
    lat = measure(runner, [{"k": "a"}, {"k": "b"}], settings)
    assert lat.n >= 10
    assert lat.n * lat.mean >= 50 * 0.9  # the timed runs add up to min_time (50 ms)
    timed = runner.calls[4:]
    assert timed[:4] == ["a", "b", "a", "b"]
    assert 1.9 < lat.p50 < 20


def test_a_sequence_runs_every_set_in_order_as_one_timed_run() -> None:
    runner = SleepRunner()
    settings = MeasureSettings(warmup=1, min_runs=5, min_time_s=0.01, sequence=True)
    lat = measure(runner, [{"k": k} for k in "pab"], settings)  # a prompt, two steps
    timed = runner.calls[3:]  # after one warm-up run of each set
    assert timed == list("pab" * lat.n)  # never a step without the ones before it
    assert lat.p50 >= 3 * 2  # three sleeps of 2 ms in one run


def test_an_engine_that_ran_every_input_set_warms_up_once_per_set() -> None:
    settings = MeasureSettings(warmup=3, min_runs=6, min_time_s=0.02, min_blocks=6)
    cold, warm = SleepRunner(), SleepRunner()
    sets = [{"k": k} for k in "abcd"]
    measure_blocks([cold, warm], sets, settings, warm=frozenset({1}))
    assert cold.calls[:12] == list("abcd" * 3)  # 3 per input set before any timed run
    assert warm.calls[:4] == list("abcd") and warm.calls[4:6] == ["a", "b"]  # timed from here
    one_set = SleepRunner()
    lat = measure(one_set, [{"k": "a"}], settings, warm=True)
    # never fewer than `warmup` runs in all: a single input set still runs 3 times
    assert len(one_set.calls) == 3 + lat.n


class InferLikeRunner(SleepRunner):
    """Its prepared calls run the engine as `infer` does (ONNX Runtime on a CPU)."""

    calls_like_infer = True


def test_an_engine_whose_calls_are_its_accuracy_pass_warms_up_warmup_runs_only() -> None:
    settings = MeasureSettings(warmup=3, min_runs=6, min_time_s=0.02, min_blocks=6)
    cold, warm = InferLikeRunner(), InferLikeRunner()
    sets = [{"k": k} for k in "abcd"]
    measure_blocks([cold, warm], sets, settings, warm=frozenset({1}))
    assert cold.calls[:12] == list("abcd" * 3)  # not warm: 3 per input set, as any engine
    # warm: every set ran in its accuracy pass; 3 runs wake its threads, not 4 (one per
    # input set, as `test_an_engine_that_ran_every_input_set_warms_up_once_per_set`)
    assert warm.calls[:3] == list("abc") and warm.calls[3:5] == ["a", "b"]  # timed from here


class CountingRunner(SleepRunner):
    """Counts its `prepare` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.prepares = 0

    def prepare(self, feed):  # noqa: ANN001, ANN201
        self.prepares += 1
        return super().prepare(feed)


def test_a_runner_timed_again_on_the_same_input_sets_reuses_its_warm_calls() -> None:
    settings = MeasureSettings(warmup=3, min_runs=6, min_time_s=0.02, min_blocks=6)
    base, first, second = CountingRunner(), SleepRunner(), SleepRunner()
    sets = [{"k": k} for k in "abcd"]
    measure_blocks([first, base], sets, settings)
    assert base.prepares == 4 and base.calls[:12] == list("abcd" * 3)
    timed_once = len(base.calls)
    measure_blocks([second, base], sets, settings)
    # the same calls again, already run: `warmup` runs to wake it, not 3 per input set
    assert base.prepares == 4
    assert base.calls[timed_once:timed_once + 5] == ["a", "b", "c", "a", "b"]
    other_sets = [{"k": k} for k in "xy"]  # other input sets: calls of their own
    measure_blocks([SleepRunner(), base], other_sets, settings)
    assert base.prepares == 6


class CopyingRunner(SleepRunner):
    """Device compute takes 2 ms by its own clock; host to host, 2 ms more of copies."""

    host_copies = True

    def prepare_end_to_end(self, feed):  # noqa: ANN001, ANN201
        return lambda: (self.calls.append("e2e"), time.sleep(0.004))

    def timed(self, call):  # noqa: ANN001, ANN201 - a device clock that sees no copies
        call()
        return 2.0


def test_the_latency_setting_picks_device_compute_or_host_to_host_by_wall_clock() -> None:
    quick = MeasureSettings(warmup=1, min_runs=6, min_time_s=0.02, min_blocks=6)
    runner = CopyingRunner()
    device = measure(runner, [{"k": "a"}], quick)
    assert device.p50 == 2.0 and "e2e" not in runner.calls
    runner = CopyingRunner()
    end_to_end = measure(runner, [{"k": "a"}], replace(quick, latency="end-to-end"))
    assert set(runner.calls) == {"e2e"} and end_to_end.p50 >= 3.9  # wall clock, copies in
    assert quick.other_latency == "end-to-end"
    assert replace(quick, latency="end-to-end").other_latency == "device"


def test_measure_stops_at_max_runs() -> None:
    # runs are capped in whole blocks of 3 at least, and never below min_blocks blocks
    lat = measure(SleepRunner(), [{"k": "a"}],
                  MeasureSettings(0, 3, 100.0, max_runs=5, min_blocks=2))
    assert lat.n == 6 and len(lat.blocks) == 2
    fast = measure(SleepRunner(), [{"k": "a"}],
                   MeasureSettings(0, 3, 100.0, max_runs=200, min_blocks=10))
    assert fast.n == 200 and len(fast.blocks) == 10  # 20 runs a block, 10 blocks


# --- paired blocks: synthetic block streams with a known truth -----------------------

from routetune.timing.measure import Block, Speedup, across_repeats, paired_speedup  # noqa: E402,I001


def abba(base_ms: list[float], cand_ms: list[float]) -> list[Block]:
    """Blocks in ABBA order: pair i is (candidate, base) for even i, (base, candidate) else."""
    out = []
    for i, (b, c) in enumerate(zip(base_ms, cand_ms, strict=True)):
        pair = [Block(0, c, 10), Block(1, b, 10)]
        out += pair if i % 2 == 0 else pair[::-1]
    return out


def pooled_verdict(base_runs: list[float], cand_runs: list[float]) -> tuple[float, bool]:
    """What pooling every run gives: the p50 ratio, and 'faster beyond the intervals'."""
    base, cand = latency_stats(base_runs), latency_stats(cand_runs)
    return base.p50 / cand.p50, cand.ci_high < base.ci_low


def test_drift_between_blocks_fools_pooled_medians_but_not_paired_blocks() -> None:
    # The machine's speed moves from block to block (load that comes and goes); within a
    # block it is steady. Candidate and base are the same engine: the truth is 1.0x.
    # Each block holds the minimum of 5 runs (runs long against the block length).
    rng = np.random.default_rng(7)
    speed = rng.choice([1.6, 2.4], size=20)  # per block pair: how slow a busy moment is
    base_runs, cand_runs, base_b, cand_b = [], [], [], []
    for i, s in enumerate(speed):
        # a busy neighbour with its own rhythm: it slows the base block of two pairs in
        # three, and the candidate block of the third
        s_base = s if i % 3 else 1.0
        s_cand = 1.0 if i % 3 else s
        base = 10.0 * s_base * (1 + 0.002 * rng.standard_normal(5))
        cand = 10.0 * s_cand * (1 + 0.002 * rng.standard_normal(5))
        base_runs += list(base)
        cand_runs += list(cand)
        base_b.append(float(np.median(base)))
        cand_b.append(float(np.median(cand)))
    ratio, pooled_claims_win = pooled_verdict(base_runs, cand_runs)
    assert ratio > 1.1 and pooled_claims_win  # pooled: "faster beyond the intervals"
    paired = paired_speedup(abba(base_b, cand_b))
    assert paired.ci_low <= 1.0 <= paired.ci_high  # paired: no evidence of a difference
    assert paired.clears(1.03) is not None
    assert paired.drift > 0.05  # and the base route's own drift is visible


def test_a_real_five_percent_effect_is_found() -> None:
    rng = np.random.default_rng(1)
    drift = np.linspace(1.0, 1.5, 20) * (1 + 0.01 * rng.standard_normal(20))
    base = list(10.0 * drift * (1 + 0.005 * rng.standard_normal(20)))
    cand = list(10.0 / 1.05 * drift * (1 + 0.005 * rng.standard_normal(20)))
    paired = paired_speedup(abba(base, cand))
    assert 1.03 < paired.ci_low and paired.ci_low <= 1.05 <= paired.ci_high
    assert abs(paired.value - 1.05) < 0.01 and paired.pairs == 20


def test_a_one_percent_effect_is_a_tie_at_min_speedup_1_03() -> None:
    rng = np.random.default_rng(2)
    base = list(10.0 * (1 + 0.003 * rng.standard_normal(20)))
    cand = list(10.0 / 1.01 * (1 + 0.003 * rng.standard_normal(20)))
    paired = paired_speedup(abba(base, cand))
    assert paired.ci_low > 1.0  # a real effect...
    assert "not above --min-speedup 1.03" in paired.clears(1.03)  # ...too small to win


def test_drift_larger_than_the_effect_is_a_tie() -> None:
    base = [10.0] * 10 + [14.0] * 10  # the machine slows by 40% halfway
    cand = [b / 1.10 for b in base]  # a steady 10% effect on top
    paired = paired_speedup(abba(base, cand))
    assert paired.ci_low > 1.03
    assert "drifted" in paired.clears(1.03)


def test_a_slow_differential_drift_needs_several_loops() -> None:
    """What 2-vCPU VM showed (docs/benchmarks.md, "One loop is not enough"): one engine
    slows more than the other when the host is busy, and that changes over seconds,
    longer than a loop. Each loop's interval is narrow and misses the others' figures;
    combined (`across_repeats`), the interval spans them and still shows the win."""
    rng = np.random.default_rng(3)
    loops = []
    for state in (1.0, 1.6, 1.2):  # how much the host's state slows the base engine
        base = list(10.0 * state * (1 + 0.004 * rng.standard_normal(30)))
        cand = list(10.0 / 1.4 * (1 + 0.004 * rng.standard_normal(30)))
        loops.append(paired_speedup(abba(base, cand)))
    assert all(a.ci_high < b.ci_low or b.ci_high < a.ci_low  # disjoint, one by one
               for i, a in enumerate(loops) for b in loops[i + 1:])
    combined = across_repeats(loops)
    assert combined.ci_low == min(p.ci_low for p in loops) < 1.45
    assert combined.ci_high == max(p.ci_high for p in loops) > 2.2
    assert combined.value == sorted(p.value for p in loops)[1]
    assert combined.clears(1.03) is None and combined.pairs == 90  # a win, held in each
    tie_parts = [*loops, Speedup(1.0, 0.97, 1.03, 30, 0.01)]
    tie = across_repeats(tie_parts)
    assert tie.clears(1.03) is not None  # one repeat without the win: no win
    assert across_repeats(loops[:1]) is loops[0]
    # two repeats: the lower estimate, not their mean (a figure neither measured)
    assert across_repeats(loops[:2]).value == min(p.value for p in loops[:2])
    assert tie.value == sorted(p.value for p in tie_parts)[1]
    with pytest.raises(ValueError, match="no repeats"):
        across_repeats([])


def test_blocks_run_in_abba_order_and_the_interval_is_over_blocks() -> None:
    a, b = SleepRunner(), SleepRunner()
    settings = MeasureSettings(warmup=0, min_runs=3, min_time_s=0.05, min_blocks=6)
    (la, lb), blocks = measure_blocks([a, b], [{"k": "x"}], settings)
    order = [blk.runner for blk in blocks]
    assert order[:8] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert len(blocks) >= 12 and all(blk.runs >= 3 for blk in blocks)
    assert len(la.blocks) == len(order) // 2
    assert (la.ci_low, la.ci_high) == median_ci(list(la.blocks))
