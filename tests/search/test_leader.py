"""The race's leader and the bar it sets: ``--min-speedup``, a floor, the leading route."""

from __future__ import annotations

from routetune.records.trial import Trial
from routetune.search.leader import Leader
from routetune.timing.measure import Latency, Speedup
from routetune.timing.race import Bar

LAT = Latency(40, 1.0, 1.1, 1.2, 1.0, 0.95, 1.05)


def trial(route: str, low: float, high: float, noisy: str = "") -> Trial:
    return Trial(route, "m", route, "onnxruntime", "cpu", "s", "ok", latency=LAT,
                 paired=Speedup((low + high) / 2, low, high, 12, 0.01), noisy=noisy)


def test_the_bar_is_the_highest_of_min_speedup_the_floor_and_the_leaders_lower_end() -> None:
    leader = Leader(1.03, "wait")
    assert leader.bar() == Bar(1.03, "--min-speedup 1.03")
    leader.consider(trial("ort-threads", 1.10, 1.20))
    assert leader.bar().speedup == 1.10 and "'ort-threads'" in leader.bar().source
    floored = Leader(1.03, "wait", Bar(2.4, "the lower end of openvino's base route"))
    assert floored.bar() == Bar(2.4, "the lower end of openvino's base route")
    floored.consider(trial("ort-threads", 1.10, 1.20))  # leads, but below the floor
    assert floored.bar().speedup == 2.4
    floored.consider(trial("int8", 2.6, 2.9))  # beyond the floor: it is the bar
    assert floored.bar().speedup == 2.6 and "'int8'" in floored.bar().source


def test_a_noisy_or_slower_route_does_not_lead() -> None:
    leader = Leader(1.0, "wait")
    leader.consider(trial("a", 1.10, 1.20))
    leader.consider(trial("b", 1.30, 1.40, noisy="busy: 0.9 cores of foreign load"))
    leader.consider(trial("c", 1.05, 1.50))  # a higher figure, a lower lower end
    assert leader.trial is not None and leader.trial.route == "a"
    ignoring = Leader(1.0, "ignore")
    ignoring.consider(trial("b", 1.30, 1.40, noisy="busy"))
    assert ignoring.trial is not None and ignoring.trial.route == "b"
