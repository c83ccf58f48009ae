"""Real ONNX Runtime searches on small generated graphs."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from graphs import conv_bn, matmul_chain, wasteful
from quick import quick_spec

from routetune.display import racing_line
from routetune.errors import UsageError
from routetune.judging.metrics import Metric
from routetune.judging.verdict import CONFIRM_REPEATS, pick_winner
from routetune.registry import Registry
from routetune.run.tuning import TuneResult, tune
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo
from routetune.timing.measure import MeasureSettings
from routetune.timing.race import CLEAR_PAIRS


class Shortcut(Seasoning):
    """Feeds the model input straight to the last MatMul: much faster, and wrong."""

    info = SeasoningInfo(name="shortcut", stage="graph", summary="drop all but the last layer")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        last = [n for n in state.graph.nodes if n.op == "MatMul"][-1]
        last.inputs[0] = state.graph.inputs[0]
        state.graph.cleanup().toposort()
        return PassResult(True, {"dropped": 1})


class DropWaste(Seasoning):
    """Removes the branch multiplied by zero: exact and much faster."""

    info = SeasoningInfo(name="drop-waste", stage="graph", summary="remove x*0 branches")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        add = next(n for n in state.graph.nodes if n.name == "add")
        relu_out = add.inputs[0]
        add.op, add.inputs = "Identity", [relu_out]
        state.graph.cleanup().toposort()
        return PassResult(True, {"removed": 1})


class Explode(Seasoning):
    """Changes the graph, then raises midway."""

    info = SeasoningInfo(name="explode", stage="graph", summary="raises midway")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        state.graph.nodes[0].name = "half-done"
        raise RuntimeError("boom")


class Refuse(Seasoning):
    """Refuses the route the documented way: ValueError."""

    info = SeasoningInfo(name="refuse", stage="graph", summary="raises ValueError")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        raise ValueError("this model has no such layer")


class RenameOutput(Seasoning):
    """Breaks the signature by renaming the graph output."""

    info = SeasoningInfo(name="rename-output", stage="graph", summary="renames the output")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        state.graph.outputs[0].name = "renamed"
        return PassResult(True)


class TwinNames(Seasoning):
    """Gives two nodes one name (the quantizer and opset conversion have done this)."""

    info = SeasoningInfo(name="twin-names", stage="graph", summary="repeats a node name")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        state.graph.nodes[1].name = state.graph.nodes[0].name
        return PassResult(True)


class Nameless(Seasoning):
    """Leaves a node without a name."""

    info = SeasoningInfo(name="nameless", stage="graph", summary="clears a node name")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        state.graph.nodes[-1].name = ""
        return PassResult(True)


class SameTypeCast(Seasoning):
    """Puts a Cast to FLOAT on the float32 input (legal ONNX, and redundant)."""

    info = SeasoningInfo(name="same-type-cast", stage="graph", summary="adds a no-op Cast")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        x = state.graph.inputs[0]
        copy = gs.Variable("x_again", np.float32, x.shape)
        for node in list(x.outputs):
            node.inputs = [copy if t is x else t for t in node.inputs]
        state.graph.nodes.append(gs.Node("Cast", "recast", {"to": 1}, [x], [copy]))
        state.graph.toposort()
        return PassResult(True)


@pytest.fixture
def test_registry(registry: Registry) -> Registry:
    for cls in (Shortcut, DropWaste, Explode, Refuse, RenameOutput, TwinNames, Nameless,
                SameTypeCast):
        registry.add_seasoning(cls)
    registry.add_metric(Metric("unit_error", lambda a, b, *_: 1.0, False, "always 1"))
    return registry


def run(registry: Registry, model: Path, out: Path, **kw: Any) -> TuneResult:
    return tune(quick_spec(model=model, output=out, search="exhaustive", **kw), registry)


def by_route(result: TuneResult) -> dict[str, object]:
    return {t.route: t for t in result.trials}


def test_fastest_but_inaccurate_never_wins(test_registry: Registry, tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx")
    result = run(test_registry, model, tmp_path / "out", seasonings=("shortcut",))
    trials = by_route(result)
    fast = trials["shortcut"]
    assert fast.status == "accuracy-failed"
    assert fast.latency.p50 < result.base.latency.p50 / 2  # clearly the fastest
    assert fast.reason.startswith("y: l0 ")
    assert result.winner.route == "base"


def test_nothing_accurate_falls_back_to_base(test_registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out", seasonings=("ort-opt-level",),
                 shapes="x:1x3x32x32", accuracy="unit_error<=0.5")
    assert {t.status for t in result.trials} == {"accuracy-failed"}
    assert result.winner.route == "base" and result.fallback
    assert "no other route met the accuracy constraint" in result.winner_reason
    assert (tmp_path / "out" / "winner.onnx").exists()


def test_a_seasoning_that_raises_is_recorded_and_the_search_goes_on(
    test_registry: Registry, tmp_path: Path
) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out",
                 seasonings=("explode", "refuse", "ort-opt-level"), shapes="x:1x3x32x32",
                 max_depth=1)
    trials = by_route(result)
    # an unexpected exception is a bug in the plugin: crashed, with where it was raised
    assert trials["explode"].status == "crashed"
    assert trials["explode"].reason.startswith(
        "seasoning 'explode' crashed after 'base': RuntimeError: boom (at search/test_loop.py:")
    assert trials["explode"].reason.endswith(" in apply)")
    # ValueError is how a seasoning refuses a route: build-failed
    assert trials["refuse"].status == "build-failed"
    assert trials["refuse"].reason == (
        "seasoning 'refuse' failed after 'base': ValueError: this model has no such layer")
    assert trials["ort-opt-level{level=basic}"].status == "ok"
    assert len(result.trials) == 6  # base, explode, refuse, three opt levels


def test_a_pass_that_breaks_node_names_is_build_failed_and_named(test_registry: Registry,
                                                                 tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out", seasonings=("twin-names", "nameless"),
                 shapes="x:1x3x32x32", max_depth=1)
    twin, nameless = by_route(result)["twin-names"], by_route(result)["nameless"]
    assert twin.status == nameless.status == "build-failed"
    assert twin.reason.startswith("after 'twin-names': the rewrite gave 1 name(s) to several")
    assert nameless.reason == "after 'nameless': the rewrite left 1 node(s) without a name"


def test_a_pass_that_adds_a_redundant_cast_is_build_failed_and_named(
        test_registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out", seasonings=("same-type-cast",),
                 shapes="x:1x3x32x32")
    failed = by_route(result)["same-type-cast"]
    assert failed.status == "build-failed"
    assert failed.reason == ("after 'same-type-cast': the rewrite left a redundant Cast: "
                             "Cast 'recast' casts 'x' to FLOAT, the type it already has")


def test_a_broken_signature_is_build_failed(test_registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out", seasonings=("rename-output",),
                 shapes="x:1x3x32x32")
    failed = by_route(result)["rename-output"]
    assert failed.status == "build-failed"
    assert "changed the model's signature" in failed.reason


def test_resume_reuses_stored_trials_without_rebuilding(registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    seen: list[bool] = []
    opts = quick_spec(model=model, output=tmp_path / "out", search="exhaustive",
                      shapes="x:1x3x32x32", seasonings=("fuse-bn-into-conv", "ort-opt-level"))
    first = tune(opts, registry, on_trial=lambda t, cached: seen.append(cached))
    assert seen and not any(seen)
    rows = sqlite3.connect(tmp_path / "out" / "trials.sqlite").execute(
        "SELECT count(*) FROM trials").fetchone()[0]
    seen.clear()
    second = tune(opts, registry, on_trial=lambda t, cached: seen.append(cached))
    assert seen and all(seen)
    assert sqlite3.connect(tmp_path / "out" / "trials.sqlite").execute(
        "SELECT count(*) FROM trials").fetchone()[0] == rows
    # the same stored trials give the same best route (the final side-by-side re-measures)
    assert [t.route for t in pick_winner(second.trials)[0]] == [
        t.route for t in pick_winner(first.trials)[0]]
    # the same trials; only the order may differ, since it starts with the confirmed winner
    assert sorted(t.fingerprint for t in second.trials) == sorted(
        t.fingerprint for t in first.trials)


def test_fresh_moves_the_old_store_aside(registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    opts = quick_spec(model=model, output=tmp_path / "out", shapes="x:1x3x32x32",
                      seasonings=("fuse-bn-into-conv",))
    tune(opts, registry)
    seen: list[bool] = []
    tune(dataclasses.replace(opts, fresh=True), registry,
         on_trial=lambda t, cached: seen.append(cached))
    assert not any(seen)
    assert len(list((tmp_path / "out").glob("trials.*.sqlite"))) == 1


def test_identical_candidates_are_not_rebuilt(test_registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    result = run(test_registry, model, tmp_path / "out", shapes="x:1x3x32x32",
                 seasonings=("fuse-bn-into-conv", "eliminate-noops"))
    trials = by_route(result)
    # both steps change the model, and in either order give one model
    assert [t.status for t in trials.values()].count("skipped") == 1
    assert trials["fuse-bn-into-conv,eliminate-noops"].reason == (
        "same model and settings as route 'eliminate-noops,fuse-bn-into-conv'")


def test_a_step_that_changes_nothing_is_the_same_engine_built_once_and_never_timed(
        test_registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")  # no constant subgraph: folding changes nothing
    result = run(test_registry, model, tmp_path / "out", shapes="x:1x3x32x32",
                 seasonings=("fold-constants", "fuse-bn-into-conv", "ort-threads"))
    trials = by_route(result)
    single = trials["fold-constants"]
    assert single.status == "skipped" and single.latency is None
    assert single.reason == ("same engine as the base route: 'fold-constants' changes "
                             "nothing on this model there (no build or timing of its own)")
    assert single.passes[-1]["modified"] is False  # built once: that is how it is known
    longer = [t for route, t in trials.items() if "fold-constants" in route and t is not single]
    assert longer, sorted(trials)
    for trial in longer:  # known before they were built: no build, no timing
        shortest = trial.route.replace("fold-constants,", "").replace(",fold-constants", "")
        assert trial.status == "skipped" and trial.reason.startswith(
            f"same engine as route '{shortest}': 'fold-constants' changes nothing")
        assert trial.build_ms is None and not trial.passes and trial.latency is None
        assert trials[shortest].latency is not None  # the engine, measured once
    measured = [t for t in result.trials if t.latency is not None]
    assert len(measured) == len({t.candidate_sha256 for t in measured})
    assert f"{len(longer) + 1} the same engine as another route (not timed)" in (
        racing_line(result))


class Unmodified(Seasoning):
    """Writes new weights equal to the old ones and says it changed nothing."""

    info = SeasoningInfo(name="unmodified", stage="graph", summary="new arrays, same values")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        conv = next(n for n in state.graph.nodes if n.op == "Conv")
        conv.inputs[1] = gs.Constant(conv.inputs[1].name + "_copy",
                                     np.array(conv.inputs[1].values) * np.float32(1))
        return PassResult(False)


def test_a_pass_that_says_it_changed_nothing_and_did_is_recorded_as_modified(
        registry: Registry, tmp_path: Path) -> None:
    registry.add_seasoning(Unmodified)
    model = conv_bn(tmp_path / "m.onnx")
    result = run(registry, model, tmp_path / "out", shapes="x:1x3x32x32",
                 seasonings=("unmodified",))
    trial = by_route(result)["unmodified"]
    assert trial.status == "ok" and trial.latency is not None  # its own engine, timed
    record = trial.passes[-1]
    assert record["modified"] is True
    assert record["note"] == ("reported modified: false, but changed the model or the "
                              "settings: recorded as modified")


def test_winner_files_are_written(registry: Registry, tmp_path: Path) -> None:
    import json

    import onnxruntime as ort
    import tomllib

    model = conv_bn(tmp_path / "m.onnx")
    result = run(registry, model, tmp_path / "out", shapes="x:1x3x32x32",
                 seasonings=("fuse-bn-into-conv",))
    out = tmp_path / "out"
    recipe = tomllib.loads((out / "winner.toml").read_text())
    assert recipe["routes"] == [result.winner.route] and recipe["seasonings"] == []
    assert recipe["schema_version"] == 2
    settings = json.loads((out / "winner.json").read_text())
    assert settings["settings"]["onnxruntime.graph_optimization_level"] == "all"
    assert settings["stopped"] is None  # the search ran its course
    sess = ort.InferenceSession(str(out / "winner.onnx"), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.zeros((1, 3, 32, 32), np.float32)})[0]
    assert y.shape == (1, 16, 32, 32)


def test_not_applicable_seasonings_are_listed(registry: Registry, tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx", depth=2)
    result = run(registry, model, tmp_path / "out",
                 seasonings=("fuse-bn-into-conv", "ort-no-spinning"))
    assert "fuse-bn-into-conv" in result.not_applicable
    skipped = by_route(result)["fuse-bn-into-conv"]
    assert skipped.status == "skipped" and skipped.reason == result.not_applicable[
        "fuse-bn-into-conv"]
    assert result.space_size == 2
    with pytest.raises(UsageError, match="none applies here .fuse-bn-into-conv: no Conv"):
        run(registry, model, tmp_path / "out2", seasonings=("fuse-bn-into-conv",))


def test_a_faster_exact_route_wins_and_is_confirmed_side_by_side(
    test_registry: Registry, tmp_path: Path
) -> None:
    """The verdict as a user gets it: three confirmations (the default), 5 runs and
    0.05 s per candidate at least."""
    result = run(test_registry, wasteful(tmp_path / "w.onnx"), tmp_path / "out",
                 seasonings=("drop-waste",), accuracy="linf<=0", confirm_repeats=CONFIRM_REPEATS,
                 measure=MeasureSettings(warmup=1, min_runs=5, min_time_s=0.05))
    assert result.winner.route == "drop-waste"
    assert result.winner.status == "ok" and result.winner.accuracy["y"]["linf"] == 0.0
    confirmed = result.confirmed
    assert confirmed is not None and confirmed.route == "drop-waste"
    assert confirmed.latency.p50 < confirmed.base_latency.p50
    assert confirmed.paired.ci_low > 2
    assert len(confirmed.repeats) == CONFIRM_REPEATS  # each held
    # each repeat cleared --min-speedup at the early look, after 10 paired blocks
    # (routetune.timing.race.clears_early), not the 30 of a full confirmation
    assert all(CLEAR_PAIRS <= r.pairs < 30 for r in confirmed.repeats)
    assert confirmed.conditions["cleared"] == 1.03
    assert result.winner_speedup > 2  # six 256x256 MatMuls removed, only a Relu left


@pytest.mark.serial  # other tests' load would be the reason given first
def test_a_confirmation_is_judged_against_the_pace_from_before_the_search(
        test_registry: Registry, tmp_path: Path) -> None:
    """The search's pace for its confirmations starts from the one given before it (a
    multi-backend run's side-by-side loop): a confirmation whose base route runs far
    slower is marked (under ``ignore``, which lets marked figures win, so that the
    trials marked in the search are confirmed at all), and under ``ignore`` too it
    does not hold so far off its pace."""
    result = tune(quick_spec(model=wasteful(tmp_path / "w.onnx"), output=tmp_path / "out",
                             search="exhaustive", seasonings=("drop-waste",),
                             accuracy="linf<=0", busy_machine="ignore"),
                  test_registry, pace_ms=1e-4)
    busy = [c.conditions.get("busy", "") for c in result.confirmations]
    assert busy and any("its p50 earlier in this run (0.0001 ms)" in b for b in busy), busy
    assert all(c.conditions["pace_x"] > 1000 for c in result.confirmations)
    assert result.winner.route == "base", result.winner_reason
    assert "(--busy-machine ignore takes a confirmation under load while the base route " \
        "stays within 1.8x its pace" in result.winner_reason, result.winner_reason
