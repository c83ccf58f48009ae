"""Routes that quantize more coarsely than one that failed: the rule, and a real search."""

from __future__ import annotations

from pathlib import Path

from graphs import conv_bn
from quick import quick_spec

from routetune.display import racing_line
from routetune.registry import Registry
from routetune.routes.route import parse_route
from routetune.run.tuning import tune
from routetune.search.coarser import Coarser, coarseness, coarser_reason


def coarser(registry: Registry, *failed: str) -> Coarser:
    rule = Coarser(lambda name: registry.seasoning(name).info.params)
    for route in failed:
        rule.failed(parse_route(route))
    return rule


def test_a_finer_failure_rules_out_only_routes_coarser_in_every_parameter(
        registry: Registry) -> None:
    rule = coarser(registry, "fuse-bn-into-conv,int8-qdq{symmetric_activations=false}")
    finest = parse_route("fuse-bn-into-conv,int8-qdq{symmetric_activations=false}")
    for route, how in (
            ("fuse-bn-into-conv,int8-qdq", "symmetric_activations=false"),
            ("fuse-bn-into-conv,int8-qdq{per_channel=false}",
             "per_channel=true, symmetric_activations=false"),
            ("fuse-bn-into-conv,int8-qdq{per_channel=false,symmetric_activations=false}",
             "per_channel=true")):
        assert rule.finer(parse_route(route)) == (finest, how), route
    for route in ("fuse-bn-into-conv,int8-qdq{symmetric_activations=false}",  # itself
                  "int8-qdq",  # other steps
                  "fuse-bn-into-conv,int8-qdq{calibration=entropy}",  # an unordered one
                  "fold-constants,int8-qdq"):
        assert rule.finer(parse_route(route)) is None, route
    # the default (symmetric, per channel) failing says nothing of asymmetric ranges
    rule = coarser(registry, "int8-qdq")
    assert rule.finer(parse_route("int8-qdq{per_channel=false,symmetric_activations=false}")
                      ) is None
    assert rule.finer(parse_route("int8-qdq{symmetric_activations=false}")) is None
    assert rule.finer(parse_route("int8-qdq{per_channel=false}")) is not None


def test_nncf_presets_are_ordered_and_the_finest_steps_come_first(registry: Registry) -> None:
    params = registry.seasoning("nncf-int8").info.params
    mixed, performance = parse_route("nncf-int8{preset=mixed}"), parse_route("nncf-int8")
    assert coarser(registry, str(mixed)).finer(performance) == (mixed, "preset=mixed")
    assert coarser(registry, str(performance)).finer(mixed) is None
    assert coarseness(mixed.steps[0], params) == 0 < coarseness(performance.steps[0], params)
    assert coarser_reason(mixed, "preset=mixed") == (
        "not built: quantizes more coarsely than route 'nncf-int8{preset=mixed}' "
        "(preset=mixed), which failed the accuracy constraint here")


def test_a_search_builds_the_finest_int8_route_and_not_the_coarser_ones_once_it_fails(
        registry: Registry, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    # a bound no INT8 route meets: its error is far above 1e-6 of the output's scale;
    # no memory, whose order of steps it knows would come before the finest-first order
    spec = quick_spec(model=model, output=out, search="beam", shapes="x:1x3x32x32",
                      seasonings=("int8-qdq",), accuracy="rel_l2<=1e-6", memory="off")
    result = tune(spec, registry)
    trials = {t.route: t for t in result.trials}
    finest = "int8-qdq{symmetric_activations=false}"
    assert trials[finest].status == "accuracy-failed", trials
    assert trials[finest].latency is not None
    for route, how in (("int8-qdq", "symmetric_activations=false"),
                       ("int8-qdq{per_channel=false}",
                        "per_channel=true, symmetric_activations=false"),
                       ("int8-qdq{per_channel=false,symmetric_activations=false}",
                        "per_channel=true")):
        trial = trials[route]
        assert trial.status == "skipped" and trial.latency is None and trial.build_ms is None
        assert trial.reason == coarser_reason(parse_route(finest), how), trial.reason
    assert result.winner.route == "base"
    assert "3 quantizing more coarsely than one that failed accuracy (not built)" in (
        racing_line(result))
    # resumed, the search stores nothing new: the skips are kept, and so is their reason
    again = tune(spec, registry)
    assert {t.route: (t.status, t.reason) for t in again.trials} == {
        r: (t.status, t.reason) for r, t in trials.items()}
