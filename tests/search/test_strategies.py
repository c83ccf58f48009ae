"""Strategy contracts on synthetic outcome tables: no building, no timing."""

from __future__ import annotations

from routetune.records.trial import Status, Trial
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route
from routetune.search.beam import Beam, BeamOptions
from routetune.search.exhaustive import Exhaustive
from routetune.search.mixed import Mixed, MixedOptions
from routetune.search.one_at_a_time import OneAtATime
from routetune.search.strategy import Result
from routetune.seasoning import Param, SeasoningInfo
from routetune.timing.measure import Latency


def space(max_depth: int | None = None) -> RouteSpace:
    infos = [
        SeasoningInfo(name="a", stage="graph", summary=""),
        SeasoningInfo(name="b", stage="graph", summary="", after=frozenset({"a"})),
        SeasoningInfo(name="c", stage="build", summary="", params=(Param("k", (1, 2, 3), 1),)),
        SeasoningInfo(name="d", stage="build", summary=""),
    ]
    return RouteSpace(infos, max_depth)


BASE = Latency(10, 10.0, 10.0, 10.0, 10.0, 9.9, 10.1)
"""The base route's latency, as measured alongside every trial."""


def outcome(route: Route, ms: float, status: Status = Status.OK) -> Trial:
    lat = Latency(10, ms, ms, ms, ms, ms * 0.99, ms * 1.01)
    return Trial("f" + str(route), "m", str(route), "be", "dev", "s", status, latency=lat,
                 base_latency=BASE)


def synthetic_ms(route: Route) -> float:
    """Each step makes the route faster, 'c{k=3}' most; 'd' makes it inaccurate."""
    ms = 10.0
    for step in route:
        ms -= {"a": 1, "b": 1.5, "d": 4}.get(step.name, 0)
        ms -= dict(step.params).get("k", 0)
    return ms


def drive(strategy) -> list[list[Route]]:  # noqa: ANN001
    strategy.tell(Route(), Result.of(outcome(Route(), 10.0)))
    batches = []
    while batch := strategy.ask():
        batches.append(batch)
        for r in batch:
            status = Status.ACCURACY_FAILED if "d" in r.names else Status.OK
            strategy.tell(r, Result.of(outcome(r, synthetic_ms(r), status)))
    return batches


def test_exhaustive_visits_every_route_once() -> None:
    s = space()
    batches = drive(Exhaustive(s))
    asked = [r for b in batches for r in b]
    assert len(asked) == len(set(asked)) == s.size() - 1 == Exhaustive(s).planned()
    assert set(asked) | {Route()} == set(s.routes())


def test_beam_keeps_width_and_grows_from_the_fastest_accurate() -> None:
    s = space()
    batches = drive(Beam(s, BeamOptions(beam_width=2)))
    depth1 = sorted(str(r) for r in batches[0])
    assert depth1 == ["a", "b", "c", "c{k=2}", "c{k=3}", "d"]
    # the beam after depth 1 is c{k=3} and c{k=2} (d is fastest but inaccurate)
    parents = {str(r) for r in batches[1]}
    assert all(("c{k=3}" in p) or ("c{k=2}" in p) for p in parents)
    assert all(len(r) == 2 for r in batches[1])
    assert all(len(r) == i + 1 for i, b in enumerate(batches) for r in b)
    asked = [r for b in batches for r in b]
    assert len(asked) == len(set(asked))


def test_beam_asks_each_depth_in_the_order_the_memory_expects_to_pay() -> None:
    from routetune.records.prior import Prior, StepPrior

    # 'd' paid 2x on a model like this one; 'a' failed accuracy there (chance 0.9)
    prior = Prior({"d": StepPrior(0.69, 0.05, 3.0, 0.05), "a": StepPrior(0.0, 0.3, 3.0, 0.9),
                   "c{k=2}": StepPrior(0.1, 0.05, 3.0, 0.05)}, lessons=9, models=3)
    plain, learned = Beam(space(), BeamOptions(beam_width=2)), Beam(space(), BeamOptions(
        beam_width=2))
    learned.learn(prior)
    first = [str(r) for r in drive(learned)[0]]
    # the hopes first (d, then c{k=2}, then c's other choices at half its effect), the
    # unknown b, the failure last
    assert first == ["d", "c{k=2}", "c", "c{k=3}", "b", "a"]
    assert [str(r) for r in drive(plain)[0]] == ["a", "b", "c", "c{k=2}", "c{k=3}", "d"]
    # the order changes which routes a budget reaches first, never which are measured
    assert {r for b in drive(learned) for r in b} == {r for b in drive(plain) for r in b}


def test_beam_stops_at_max_depth() -> None:
    batches = drive(Beam(space(max_depth=1), BeamOptions(beam_width=3)))
    assert len(batches) == 1


def test_strategies_are_deterministic() -> None:
    for cls in (Exhaustive, Beam):
        assert drive(cls(space())) == drive(cls(space()))


def paired(route: Route, ms: float, status: str = "ok", base_ms: float = 10.0) -> Trial:
    """A trial timed alongside the base route (±1% intervals)."""
    lat = Latency(10, ms, ms, ms, ms, ms * 0.99, ms * 1.01)
    base = Latency(10, base_ms, base_ms, base_ms, base_ms, base_ms * 0.99, base_ms * 1.01)
    return Trial("f" + str(route), "m", str(route), "be", "dev", "s", status, latency=lat,
                 base_latency=base)


def test_one_at_a_time_is_the_base_plus_each_knob_alone() -> None:
    """trtexec's 'fast': linear in the knobs; a required seasoning comes along."""
    infos = [*space().infos.values(),
             SeasoningInfo(name="e", stage="build", summary="", requires=frozenset({"d"})),
             SeasoningInfo(name="f", stage="build", summary="", conflicts=frozenset({"a"}))]
    asked = drive(OneAtATime(RouteSpace(infos)))
    assert [[str(r) for r in b] for b in asked] == [
        ["a", "b", "c", "c{k=2}", "c{k=3}", "d", "d,e", "f"]]
    assert OneAtATime(RouteSpace(infos)).planned() == 8


def test_mixed_combines_only_the_changes_that_beat_the_base_beyond_noise() -> None:
    """a: 20% faster, c{k=3}: 30% faster, b: 0.5% faster (inside the ±1% noise),
    d: fast but inaccurate, c{k=2}: slower. Phase 2 is a × c{k∈{1,3}} only."""
    times = {"a": 8.0, "b": 9.95, "c": 10.2, "c{k=2}": 11.0, "c{k=3}": 7.0, "d": 5.0}
    strategy = Mixed(space(), MixedOptions(ascent=False))  # trtexec's mixed
    strategy.tell(Route(), Result.of(paired(Route(), 10.0)))
    first = strategy.ask()
    assert [str(r) for r in first] == ["a", "b", "c", "c{k=2}", "c{k=3}", "d"]
    for r in first:
        status = "accuracy-failed" if str(r) == "d" else "ok"
        strategy.tell(r, Result.of(paired(r, times[str(r)], status)))
    second = strategy.ask()
    assert sorted(str(r) for r in second) == ["a,c", "a,c{k=3}"]
    for r in second:
        strategy.tell(r, Result.of(paired(r, 6.0)))
    assert strategy.ask() == []


def test_mixed_ascends_from_the_best_route_to_a_knob_that_helps_only_with_others() -> None:
    """b is slower than the base route alone, so phase 2 leaves it out; with a and c{k=3}
    it halves the time (as fuse_conv_bias does with FP16 and NHWC on ResNet-50)."""
    def ms(route: Route) -> float:
        names = set(route.names)
        if names >= {"a", "b"}:
            return 3.0
        return {"a": 8.0, "b": 10.5, "c{k=3}": 7.0, "a,c{k=3}": 5.0, "a,c": 6.0}.get(
            str(route), 10.2)

    strategy = Mixed(space())
    strategy.tell(Route(), Result.of(paired(Route(), 10.0)))
    batches = []
    while batch := strategy.ask():
        batches.append(sorted(str(r) for r in batch))
        for r in batch:
            status = "accuracy-failed" if "d" in r.names else "ok"
            strategy.tell(r, Result.of(paired(r, ms(r), status)))
    assert batches[:2] == [["a", "b", "c", "c{k=2}", "c{k=3}", "d"], ["a,c", "a,c{k=3}"]]
    assert batches[2] == ["a,b,c{k=3}", "a,c{k=3},d"]  # the extensions of a,c{k=3}
    assert batches[3:] == [["a,b,c{k=3},d"]]  # then of a,b,c{k=3}, the new fastest
    asked = [r for b in batches for r in b]
    assert len(asked) == len(set(asked)) == 11 < space().size() - 1


def test_mixed_stops_after_one_at_a_time_when_fewer_than_two_changes_help() -> None:
    strategy = Mixed(space(), MixedOptions(ascent=False))
    strategy.tell(Route(), Result.of(paired(Route(), 10.0)))
    for r in strategy.ask():
        strategy.tell(r, Result.of(paired(r, 8.0 if str(r) == "a" else 10.5)))
    assert strategy.ask() == []


def test_mixed_and_beam_replayed_on_a_recorded_exhaustive_table_find_its_best() -> None:
    """The H200's exhaustive encoder table (docs/benchmarks.md, 2026-12-02 10:35 UTC):
    replayed, mixed asks what its live run asked (19 routes, 14 engines) and both it and
    beam (width 3) win with exhaustive's best route."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location("replay_search",
                                                  root / "benchmarks" / "replay_search.py")
    assert spec is not None and spec.loader is not None
    replay_search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay_search)
    from routetune.plugin_manager import load_registry

    table = replay_search.load(root / "docs/results/gpu-h200-2026-12-02c/"
                                      "exhaustive-bert-trials.sqlite")
    registry = load_registry()
    names = ("fuse-attention", "ort-transformer-fusion", "fp16", "ort-cuda-graph")
    space = RouteSpace([registry.seasoning(n).info for n in names], 4)
    assert space.size() == len(table) - 1  # the base route counted, the inapplicable not
    best = "fuse-attention,ort-transformer-fusion,fp16,ort-cuda-graph"
    mixed = replay_search.replay(Mixed(space), table)
    assert (mixed["asked"], mixed["builds"], mixed["winner"]) == (19, 14, best)
    beam = replay_search.replay(Beam(space, BeamOptions(beam_width=3)), table)
    assert beam["winner"] == best and beam["builds"] < sum(map(replay_search.built,
                                                                 table.values()))


def test_beam_builds_only_on_routes_shown_faster_than_the_base_route() -> None:
    """Every one-step route ties with the base route (±3% intervals around 0.99–1.01 of
    its latency): none is shown faster, so the beam ends after depth 1 (forward
    selection); one shown faster (c{k=3}, 10% faster) is the only route built on."""
    def tied(route: Route, ms: float) -> Trial:
        lat = Latency(10, ms, ms, ms, ms, ms * 0.97, ms * 1.03)
        return Trial("f" + str(route), "m", str(route), "be", "dev", "s", "ok",
                     latency=lat, base_latency=BASE)

    for fast in (None, "c{k=3}"):
        strategy = Beam(space(), BeamOptions(beam_width=3))
        strategy.tell(Route(), Result.of(tied(Route(), 10.0)))
        first = strategy.ask()
        for i, r in enumerate(first):
            strategy.tell(r, Result.of(tied(r, 9.0 if str(r) == fast else 9.9 + 0.05 * i)))
        second = strategy.ask()
        if fast is None:
            assert second == []
        else:
            assert second and all("c{k=3}" in str(r) and len(r) == 2 for r in second)


def test_a_route_faster_only_on_a_busy_machine_is_built_on_only_under_ignore() -> None:
    """c{k=3} is shown faster (10%), but timed while the machine was busy: under
    --busy-machine wait or warn no noisy trial can win, so neither beam nor mixed builds
    on it and the search ends after depth 1; under ignore it is built on."""
    def result(route: Route, mode: str) -> Result:
        ms = 9.0 if str(route) == "c{k=3}" else 10.0
        lat = Latency(10, ms, ms, ms, ms, ms * 0.99, ms * 1.01)
        trial = Trial("f" + str(route), "m", str(route), "be", "dev", "s", "ok", latency=lat,
                      base_latency=BASE, noisy="other processes used 0.7 of 2 CPU cores"
                      if str(route) == "c{k=3}" else "")
        return Result.of(trial, mode)

    for mode in ("wait", "warn", "ignore"):
        for strategy in (Beam(space(), BeamOptions(beam_width=3)), Mixed(space())):
            strategy.tell(Route(), result(Route(), mode))
            asked: list[Route] = []
            while batch := strategy.ask():
                asked += batch
                for r in batch:
                    strategy.tell(r, result(r, mode))
            deeper = [r for r in asked if len(r) > 1]
            assert (mode == "ignore") == bool(deeper), (mode, type(strategy).__name__)
            assert all("c{k=3}" in str(r) for r in deeper)
