"""precision-repair in the search: bisection order, and real repairs of failing routes."""

from __future__ import annotations

from pathlib import Path

import pytest
from graphs import matmul_chain
from quick import quick_spec

from routetune.judging.ranking import rank_key
from routetune.passes.precision.bisection import (
    bisect_repair,
    reaches,
    repair_point,
    repairs,
)
from routetune.records.trial import Trial
from routetune.registry import Registry
from routetune.routes.route import Route, parse_route
from routetune.run.tuning import tune
from routetune.timing.measure import Latency
from routetune.timing.race import Bar


def count_of(route: Route) -> int:
    step = next(s for s in route if s.name == "precision-repair")
    return int(dict(step.params).get("count", 1))


@pytest.mark.parametrize(("needed", "ranked", "tried"), [
    (5, 20, [1, 10, 2, 4, 7, 5]),  # 1 fails, the most it may keep passes: gallop, bisect
    (1, 20, [1]),
    (3, 3, [1, 3, 2]),
    (9, 6, [1, 6]),  # even keeping every ranked node fails: no fewer can pass, stop
    (50, 80, [1, 40]),  # count 40 fails and is no faster than the base route: stop
    (25, 40, [1, 20]),  # above 8 nodes, at most half of them: 20 fails, stop
    (12, 40, [1, 20, 2, 4, 8, 14, 11, 12]),
])
def test_counts_probe_the_most_then_gallop_and_bisect(needed: int, ranked: int, tried: list[int]
                                                ) -> None:
    seen: list[Route] = []

    def visit(route: Route) -> Trial:
        seen.append(route)
        ok = count_of(route) >= needed
        # each node kept in FP32 costs 1% of speed; the route starts 30% faster
        lat = Latency(10, *[0.7 + 0.01 * count_of(route)] * 6)
        return Trial("f", "m", str(route), "b", "d", "s", "ok" if ok else "accuracy-failed",
                     passes=({"step": "fp16"}, {"step": "precision-repair",
                                                "stats": {"ranked": ranked}}),
                     latency=lat, base_latency=Latency(10, *[1.0] * 6))

    skipped: list[tuple[str, str]] = []
    bisect_repair(parse_route("fp16,ort-threads{intra_op=1}"), 1, visit,
                  lambda route, why: skipped.append((str(route), why)))
    assert [count_of(r) for r in seen] == tried
    assert str(seen[0]) == "fp16,precision-repair,ort-threads{intra_op=1}"
    if needed == 50:  # stopped for speed: the next count is recorded as not tried, and why
        assert skipped == [("fp16,precision-repair{count=80},ort-threads{intra_op=1}",
                            "repair stopped: with 40 of 80 nodes in FP32 it is no faster "
                            "than the base route (0.91x, at best 0.91x)")]
    elif needed == 25:
        assert skipped[0][1] == ("repair stopped: 20 of 40 nodes in FP32 still fail, so no "
                                 "fewer can pass; keeping more than half of them is the FP32 "
                                 "model again")
    else:  # stopped with nothing left to try, or passed
        assert skipped == []


def test_a_repair_stops_at_a_count_that_cannot_reach_the_bar() -> None:
    """OpenVINO's FP16 on PP-OCRv4 rec (2026-12-04): the failing route at 1.03x [0.86,
    1.08], every repaired count a tie or slower; the doubling ran 9 counts to 162 nodes
    (0.90x). Against --min-speedup 1.03 it stops at the first count whose interval lies
    below it, and says why; against the base route's speed it goes on."""
    def visit(route: Route) -> Trial:
        # a tie with the base route: 0.99x [0.95, 1.02], each kept node 1% slower
        slow = 1.0 + 0.01 * count_of(route)
        lat = Latency(10, slow, slow, slow, slow, slow * 0.98, slow * 1.05)
        return Trial("f", "m", str(route), "b", "d", "s", "accuracy-failed",
                     passes=({"step": "fp16"}, {"step": "precision-repair",
                                                "stats": {"ranked": 40}}),
                     latency=lat, base_latency=Latency(10, *[1.0] * 6))

    skipped: list[str] = []
    bar = Bar(1.03, "--min-speedup 1.03")
    tried = bisect_repair(parse_route("fp16"), 1, visit, lambda r, why: skipped.append(why), bar)
    assert [count_of(t.steps) for t in tried] == [1]
    assert skipped == ["repair stopped: with 1 of 40 nodes in FP32 it cannot reach 1.03x, "
                       "--min-speedup 1.03 (0.99x, at best 1.01x)"]
    assert len(bisect_repair(parse_route("fp16"), 1, visit)) == 2  # 1, then 20: both fail
    failing = visit(parse_route("fp16,precision-repair"))
    assert reaches(failing) and not reaches(failing, bar)


def test_the_bisection_stops_at_a_failing_count_below_the_bar_once_one_passes() -> None:
    """OpenVINO's FP16 on PP-OCRv4 rec (2026-12-07): count 1 failed at 0.99x [0.94,
    1.04], all 196 ranked nodes passed at 0.89x, and the galloping and the bisection ran
    13 more counts (2 ... 148), each failing below 1.03x or passing slower. A failing
    count whose interval lies below the bar ends it: every count left keeps more FP32."""
    def visit(route: Route) -> Trial:
        count = count_of(route)
        lat = 0.96 + 0.01 * count  # each node kept in FP32 1% slower
        return Trial("f", "m", str(route), "b", "d", "s",
                     "ok" if count >= 20 else "accuracy-failed",
                     passes=({"step": "fp16"}, {"step": "precision-repair",
                                                "stats": {"ranked": 40}}),
                     latency=Latency(10, lat, lat, lat, lat, lat * 0.98, lat * 1.05),
                     base_latency=Latency(10, *[1.0] * 6))

    skipped: list[tuple[str, str]] = []
    bar = Bar(1.03, "--min-speedup 1.03")
    tried = bisect_repair(parse_route("fp16"), 1, visit,
                          lambda r, why: skipped.append((str(r), why)), bar)
    assert [count_of(t.steps) for t in tried] == [1, 20, 2, 4]
    assert skipped == [("fp16,precision-repair{count=8}",
                        "repair stopped: with 4 of 40 nodes in FP32 it cannot reach 1.03x, "
                        "--min-speedup 1.03 (1.00x, at best 1.02x), and every count up to 20 "
                        "(which passes) keeps more in FP32")]
    # against the base route's speed, count 4 may still reach it: the bisection goes on
    assert [count_of(t.steps) for t in bisect_repair(parse_route("fp16"), 1, visit)][:5] == [
        1, 20, 2, 4, 8]


def test_the_repair_goes_right_after_the_one_precision_step(registry: Registry) -> None:
    assert repair_point(parse_route("fold-constants,fp16,ort-threads"), registry) == 2
    assert repair_point(parse_route("fold-constants,ort-threads"), registry) is None
    assert repair_point(parse_route("fp16,precision-repair{count=2}"), registry) is None
    assert repair_point(parse_route("int8-qdq,fp16"), registry) is None


def test_the_fastest_failing_route_of_each_precision_seasoning_is_repaired_once(
        registry: Registry) -> None:
    def trial(route: str, status: str, p50: float) -> tuple[Route, Trial]:
        lat, base = Latency(10, p50, p50, p50, p50, p50, p50), Latency(10, *[4.0] * 6)
        return parse_route(route), Trial("f", "m", route, "b", "d", "s", status,
                                         latency=lat, base_latency=base)
    done = [trial("int8-qdq", "accuracy-failed", 3.0),
            trial("int8-qdq{per_channel=false}", "accuracy-failed", 2.0),
            trial("fp16,ort-threads{intra_op=1}", "accuracy-failed", 3.5),
            trial("fp16,ort-threads{intra_op=2}", "ok", 1.0),
            trial("fold-constants", "accuracy-failed", 1.0)]
    assert [(str(r), at, why) for r, at, why in repairs(done, registry, set())] == [
        ("fp16,ort-threads{intra_op=1}", 1, None), ("int8-qdq{per_channel=false}", 1, None)]
    assert [str(r) for r, _, _ in repairs(done, registry, {"fp16"})] == [
        "int8-qdq{per_channel=false}"]
    # a failing route no faster than the base route (4 ms) is not worth repairing, and
    # the search says so
    [(route, _, why)] = repairs([trial("fp16", "accuracy-failed", 4.5)], registry, set())
    assert why == ("not repaired: 'fp16', the fastest route of fp16 that failed accuracy, is "
                   "no faster than the base route (0.89x, at best 0.89x); keeping nodes in "
                   "FP32 would only slow it down")


@pytest.mark.slow
def test_a_failing_int8_route_is_repaired_with_as_few_fp32_nodes_as_bisection_finds(
        registry: Registry, tmp_path: Path) -> None:
    # big enough that INT8 GEMMs beat FP32 on a CPU, so a repair is worth trying
    model = matmul_chain(tmp_path / "chain.onnx", depth=4, width=512, batch=256)
    opts = quick_spec(model=model, output=tmp_path / "out", search="exhaustive",
                      seasonings=("int8-qdq", "precision-repair"), accuracy="rel_l2<=0.02")
    trials = tune(opts, registry).trials
    plain = [t for t in trials if "precision-repair" not in t.route and t.route != "base"]
    assert len(plain) == 4
    coarser = [t for t in plain if t.status == "skipped"]  # than one that failed: not built
    assert all(t.reason.startswith("not built: quantizes more coarsely") for t in coarser)
    plain = [t for t in plain if t not in coarser]
    assert plain and all(t.status == "accuracy-failed" for t in plain)
    # one repair per precision seasoning: of the fastest failing route
    fastest = min(plain, key=rank_key)
    assert reaches(fastest)
    ran = sorted((t for t in trials if "precision-repair" in t.route
                  and t.status != "skipped"),  # a stopped doubling leaves a skipped row
                 key=lambda t: t.created_at)
    assert ran and {t.route.split(",precision-repair")[0] for t in ran} == {fastest.route}
    counts = [count_of(parse_route(t.route)) for t in ran]
    ranked = ran[0].passes[-1]["stats"]["ranked"]  # up to 8: it may keep every one
    assert counts[:2] == [1, ranked][: len(counts)]  # 1, then the most it may keep
    assert all(t.status in ("ok", "accuracy-failed") for t in ran), [
        (t.route, t.status, t.reason) for t in ran]
    last, passing = ran[-1], [k for k, t in zip(counts, ran, strict=True) if t.status == "ok"]
    if passing:  # bisection ended next to a failing count, or at 1
        best = min(passing)
        assert best == 1 or any(k == best - 1 and t.status == "accuracy-failed"
                                for k, t in zip(counts, ran, strict=True))
        kept = next(t for k, t in zip(counts, ran, strict=True) if k == best).passes[-1]
        assert kept["note"].startswith("kept in FP32: matmul") and kept["stats"][
            "kept_fp32"] == best
    else:  # it stopped because keeping more nodes in FP32 was no faster than the base
        assert not reaches(last) or counts[-1] == 4


@pytest.mark.slow
def test_a_route_failing_a_task_metric_is_repaired_through_the_same_judgement(
        registry: Registry, tmp_path: Path) -> None:
    """top1 (a task metric) decides the repair as rel_l2 does: every repaired route's
    status is its top1 against the bound, and the plain INT8 route's reason names it."""
    model = matmul_chain(tmp_path / "chain.onnx", depth=4, width=512, batch=256)
    opts = quick_spec(model=model, output=tmp_path / "out", search="exhaustive",
                      seasonings=("int8-qdq", "precision-repair"), accuracy="top1>=0.99")
    trials = tune(opts, registry).trials
    plain = [t for t in trials if "precision-repair" not in t.route and t.route != "base"
             and t.status != "skipped"]  # skipped: coarser than one that failed
    assert plain and all(t.status == "accuracy-failed" for t in plain)
    assert all(t.reason.startswith("y: top1 0.") and "needs >= 0.99" in t.reason
               for t in plain), [t.reason for t in plain]
    ran = [t for t in trials if "precision-repair" in t.route and t.status != "skipped"]
    assert ran, [(t.route, t.status, t.reason) for t in trials]
    for t in ran:  # judged by the task metric, like any trial
        assert t.status == ("ok" if t.accuracy["y"]["top1"] >= 0.99 else "accuracy-failed")
    fewer = min(ran, key=lambda t: count_of(parse_route(t.route)))
    more = max(ran, key=lambda t: count_of(parse_route(t.route)))
    assert more.accuracy["y"]["top1"] >= fewer.accuracy["y"]["top1"]  # FP32 nodes help
