from __future__ import annotations

import time

import pytest

from routetune.backend import Runner
from routetune.measure import Latency, MeasureSettings, latency_stats, measure, median_ci


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


def test_measure_stops_at_max_runs() -> None:
    lat = measure(SleepRunner(), [{"k": "a"}], MeasureSettings(0, 3, 100.0, max_runs=5))
    assert lat.n == 5
