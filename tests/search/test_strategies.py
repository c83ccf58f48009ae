"""Strategy contracts on synthetic outcome tables: no building, no timing."""

from __future__ import annotations

from routetune.composer import RouteSpace
from routetune.measure import Latency
from routetune.route import Route
from routetune.search.beam import Beam
from routetune.search.exhaustive import Exhaustive
from routetune.search.strategy import SearchConfig
from routetune.seasoning import Param, SeasoningInfo
from routetune.store import Trial


def space(max_depth: int | None = None) -> RouteSpace:
    infos = [
        SeasoningInfo(name="a", stage="graph", summary=""),
        SeasoningInfo(name="b", stage="graph", summary="", after=frozenset({"a"})),
        SeasoningInfo(name="c", stage="build", summary="", params=(Param("k", (1, 2, 3), 1),)),
        SeasoningInfo(name="d", stage="build", summary=""),
    ]
    return RouteSpace(infos, max_depth)


def outcome(route: Route, ms: float, status: str = "ok") -> Trial:
    lat = Latency(10, ms, ms, ms, ms, ms * 0.99, ms * 1.01)
    return Trial("f" + str(route), "m", str(route), "be", "dev", "s", status, latency=lat)


def synthetic_ms(route: Route) -> float:
    """Each step makes the route faster, 'c{k=3}' most; 'd' makes it inaccurate."""
    ms = 10.0
    for step in route:
        ms -= {"a": 1, "b": 1.5, "d": 4}.get(step.name, 0)
        ms -= dict(step.params).get("k", 0)
    return ms


def drive(strategy) -> list[list[Route]]:  # noqa: ANN001
    strategy.tell(Route(), outcome(Route(), 10.0))
    batches = []
    while batch := strategy.ask():
        batches.append(batch)
        for r in batch:
            status = "accuracy-failed" if "d" in r.names else "ok"
            strategy.tell(r, outcome(r, synthetic_ms(r), status))
    return batches


def test_exhaustive_visits_every_route_once() -> None:
    s = space()
    batches = drive(Exhaustive(s, SearchConfig()))
    asked = [r for b in batches for r in b]
    assert len(asked) == len(set(asked)) == s.size() - 1
    assert set(asked) | {Route()} == set(s.routes())


def test_beam_keeps_width_and_grows_from_the_fastest_accurate() -> None:
    s = space()
    batches = drive(Beam(s, SearchConfig(beam_width=2)))
    depth1 = sorted(str(r) for r in batches[0])
    assert depth1 == ["a", "b", "c", "c{k=2}", "c{k=3}", "d"]
    # the beam after depth 1 is c{k=3} and c{k=2} (d is fastest but inaccurate)
    parents = {str(r) for r in batches[1]}
    assert all(("c{k=3}" in p) or ("c{k=2}" in p) for p in parents)
    assert all(len(r) == 2 for r in batches[1])
    assert all(len(r) == i + 1 for i, b in enumerate(batches) for r in b)
    asked = [r for b in batches for r in b]
    assert len(asked) == len(set(asked))


def test_beam_stops_at_max_depth() -> None:
    batches = drive(Beam(space(max_depth=1), SearchConfig(beam_width=3)))
    assert len(batches) == 1


def test_strategies_are_deterministic() -> None:
    for cls in (Exhaustive, Beam):
        assert drive(cls(space(), SearchConfig())) == drive(cls(space(), SearchConfig()))
