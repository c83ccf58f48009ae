"""precision-repair in the search: bisection order, and real repairs of failing routes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from graphs import layernorm, matmul_chain

from routetune.measure import MeasureSettings
from routetune.passes.precision.mixed import Fp16
from routetune.passes.precision.ranges import Ranges
from routetune.registry import Registry
from routetune.route import Route, parse_route
from routetune.search.repair import bisect_repair, repair_point
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


def test_the_repair_goes_after_the_last_precision_step(registry: Registry) -> None:
    assert repair_point(parse_route("fold-constants,fp16,ort-threads"), registry) == 2
    assert repair_point(parse_route("fold-constants,ort-threads"), registry) is None
    assert repair_point(parse_route("fp16,precision-repair{count=2}"), registry) is None


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
    plain = {t.route: t for t in trials if "precision-repair" not in t.route}
    assert plain["int8-qdq"].status == "accuracy-failed"
    family = {count_of(parse_route(t.route)): t for t in trials
              if t.route.startswith("int8-qdq,precision-repair")}
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
