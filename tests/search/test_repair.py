"""precision-repair in the search: bisection order, and real repairs of failing routes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from graphs import layernorm, matmul_chain

from routetune.measure import Latency, MeasureSettings
from routetune.passes.precision.mixed import Fp16
from routetune.passes.precision.ranges import Ranges
from routetune.registry import Registry
from routetune.route import Route, parse_route
from routetune.search.repair import bisect_repair, repair_point, repairs
from routetune.search.strategy import rank_key
from routetune.store import Trial
from routetune.tune import TuneOptions, tune

QUICK = MeasureSettings(warmup=1, min_runs=3, min_time_s=0.01)


def count_of(route: Route) -> int:
    step = next(s for s in route if s.name == "precision-repair")
    return int(dict(step.params).get("count", 1))


@pytest.mark.parametrize(("needed", "ranked", "tried"), [
    (5, 20, [1, 2, 4, 8, 6, 5]),
    (1, 20, [1]),
    (3, 3, [1, 2, 3]),
    (9, 6, [1, 2, 4, 6]),  # even keeping every ranked node fails: stop there
])
def test_counts_double_until_a_pass_then_bisect(needed: int, ranked: int, tried: list[int]
                                                ) -> None:
    seen: list[Route] = []

    def visit(route: Route) -> Trial:
        seen.append(route)
        ok = count_of(route) >= needed
        return Trial("f", "m", str(route), "b", "d", "s", "ok" if ok else "accuracy-failed",
                     passes=({"step": "fp16"}, {"step": "precision-repair",
                                                "stats": {"ranked": ranked}}))

    bisect_repair(parse_route("fp16,ort-threads{intra_op=1}"), 1, visit)
    assert [count_of(r) for r in seen] == tried
    assert str(seen[0]) == "fp16,precision-repair,ort-threads{intra_op=1}"


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
            trial("fp16,ort-threads{intra_op=1}", "accuracy-failed", 5.0),
            trial("fp16", "ok", 1.0), trial("fold-constants", "accuracy-failed", 1.0)]
    assert [(str(r), at) for r, at in repairs(done, registry, set())] == [
        ("fp16,ort-threads{intra_op=1}", 1), ("int8-qdq{per_channel=false}", 1)]
    assert [str(r) for r, _ in repairs(done, registry, {"fp16"})] == [
        "int8-qdq{per_channel=false}"]


class NaiveFp16(Fp16):
    """fp16 without its range analysis: everything the spec admits runs in float16."""

    info = replace(Fp16.info, name="naive-fp16", conflicts=frozenset())

    def _decide(self, graph, ranges):  # noqa: ANN001, ANN202
        return super()._decide(graph, Ranges())


def test_a_strict_fp16_failure_is_repaired_by_keeping_the_overflowing_node(
        registry: Registry, tmp_path: Path) -> None:
    model = layernorm(tmp_path / "ln.onnx", rows=4, width=2048)
    x = np.random.default_rng(0).uniform(-200, 200, (4, 2048)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    registry.add_seasoning(NaiveFp16)
    opts = TuneOptions(model=model, output=tmp_path / "out", search="exhaustive",
                       seasonings=("naive-fp16", "precision-repair"), inputs=tmp_path / "x.npz",
                       accuracy="rel_l2<=0.01", measure=QUICK)
    trials = {t.route: t for t in tune(opts, registry).trials}
    assert set(trials) == {"base", "naive-fp16", "naive-fp16,precision-repair"}
    failed, repaired = trials["naive-fp16"], trials["naive-fp16,precision-repair"]
    assert failed.status == "accuracy-failed" and "ReduceMean 'var'" in failed.reason
    assert repaired.status == "ok"
    note = repaired.passes[-1]["note"]
    assert note.startswith("kept in FP32: var (ReduceMean 'var': 4 of 4 values overflow")
    assert repaired.passes[-1]["stats"]["kept_fp32"] == 1


def test_a_failing_int8_route_is_repaired_with_as_few_fp32_nodes_as_bisection_finds(
        registry: Registry, tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx", depth=8, width=128, batch=16)
    opts = TuneOptions(model=model, output=tmp_path / "out", search="exhaustive",
                       seasonings=("int8-qdq", "precision-repair"), accuracy="rel_l2<=0.02",
                       measure=QUICK)
    trials = tune(opts, registry).trials
    plain = [t for t in trials if "precision-repair" not in t.route and t.route != "base"]
    assert len(plain) == 4 and all(t.status == "accuracy-failed" for t in plain)
    # one repair per precision seasoning: of the fastest failing route
    fastest = min(plain, key=rank_key).route
    family = {count_of(parse_route(t.route)): t for t in trials if "precision-repair" in t.route}
    assert {t.route.split(",precision-repair")[0] for t in family.values()} == {fastest}
    assert all(t.status in ("ok", "accuracy-failed") for t in family.values())
    passing = [k for k, t in family.items() if t.status == "ok"]
    assert passing, {k: t.reason for k, t in family.items()}
    best = min(passing)
    # doubling then bisection: every count below the smallest pass that was tried failed,
    # and the one just below it was tried
    assert all(t.status == "accuracy-failed" for k, t in family.items() if k < best)
    assert best == 1 or best - 1 in family
    kept = family[best].passes[-1]["note"]
    assert kept.startswith("kept in FP32: matmul") and "Tanh" not in kept.split(";")[0]
    assert family[best].passes[-1]["stats"]["kept_fp32"] == best
