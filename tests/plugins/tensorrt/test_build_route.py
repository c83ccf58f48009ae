"""``trt-build-route`` from a recorded ``all_build_routes`` document (TensorRT 11.1 layout).

TensorRT-RTX, the builder installed here, has no knobs; the knob logic is pinned with a
document in the layout of NvInfer.h's ``getAllBuildRoutes`` (research notes, trt-gpt.md).
"""

from __future__ import annotations

import json

import pytest

from routetune.errors import PluginError, UsageError
from routetune.plugins.tensorrt.backend import TensorRtBackend
from routetune.plugins.tensorrt.build_route import (
    build_route_seasoning,
    parse_knobs,
    route_text,
)
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route, Step, parse_route
from routetune.routes.space import parse_space, restrict_space
from routetune.search.one_at_a_time import single_changes
from routetune.seasoning import RouteContext, RouteState

RECORDED = json.dumps({
    "tuner_version": "2.19.15",
    "tuner_options": [
        {"option": "-conv_use_long_w", "allowed_values": "-conv_use_long_w=[on|off]",
         "default_value": "on", "help": "Use long W tiles for convolutions."},
        {"option": "-kgen:codegen:cuda_tile",
         "allowed_values": "-kgen:codegen:cuda_tile=[0|1|2|3]", "default_value": "1",
         "help": "CUDA Tile codegen. 0: disable, 1: where profitable, 2: supported kdags, "
                 "3: force all."},
        {"option": "-cask_fusion:num_tactics", "allowed_values": "-cask_fusion:num_tactics=<int>",
         "default_value": "10", "help": "Tactics tried per fusion."},
    ],
})


@pytest.fixture
def knob_set():  # noqa: ANN201
    return parse_knobs(RECORDED)


def test_bounded_and_open_knobs(knob_set) -> None:  # noqa: ANN001
    assert knob_set.tuner_version == "2.19.15"
    long_w, tile, tactics = knob_set.knobs
    assert (long_w.name, long_w.values, long_w.default, long_w.bounded) == (
        "conv_use_long_w", ("on", "off"), "on", True)
    assert (tile.name, tile.values, tile.default) == ("kgen:codegen:cuda_tile", (0, 1, 2, 3), 1)
    assert (tactics.name, tactics.values, tactics.default, tactics.bounded) == (
        "cask_fusion:num_tactics", (), 10, False)


def test_empty_document_means_no_knobs() -> None:
    assert parse_knobs("").knobs == ()
    with pytest.raises(PluginError, match="not the documented JSON layout"):
        parse_knobs('{"tuner_options": [{"option": "-x"}]}')


def test_route_text_lists_only_changed_knobs(knob_set) -> None:  # noqa: ANN001
    knobs = {k.name: k for k in knob_set.knobs}
    assert route_text(knobs, {"conv_use_long_w": "on", "kgen:codegen:cuda_tile": 1}) == ""
    assert route_text(knobs, {"conv_use_long_w": "off", "kgen:codegen:cuda_tile": 2,
                              "cask_fusion:num_tactics": 20}) == (
        "-conv_use_long_w=off -kgen:codegen:cuda_tile=2 -cask_fusion:num_tactics=20")


def test_seasoning_sets_the_route_and_round_trips_through_route_text(knob_set) -> None:  # noqa: ANN001
    cls = build_route_seasoning(knob_set, "tensorrt 11.1.0")
    assert [p.name for p in cls.info.params] == [
        "conv_use_long_w", "kgen:codegen:cuda_tile", "cask_fusion:num_tactics"]
    route = parse_route("trt-build-route{conv_use_long_w=off,kgen:codegen:cuda_tile=3}")
    (step,) = route.steps
    state = RouteState(None)
    result = cls(dict(step.params))(state, RouteContext(TensorRtBackend()))
    assert state.settings == {
        "tensorrt.build_route": "-conv_use_long_w=off -kgen:codegen:cuda_tile=3"}
    assert result.modified
    assert parse_route(str(route)) == route


def test_pinned_values_are_checked(knob_set) -> None:  # noqa: ANN001
    cls = build_route_seasoning(knob_set, "tensorrt 11.1.0")
    with pytest.raises(UsageError, match=r"'kgen:codegen:cuda_tile': 7 is not one of 0\|1\|2\|3"):
        cls({"kgen:codegen:cuda_tile": 7})
    assert cls({"cask_fusion:num_tactics": 40}).params["cask_fusion:num_tactics"] == 40
    with pytest.raises(UsageError, match="has no parameter 'slice_fusion'"):
        cls({"slice_fusion": "off"})


def test_one_at_a_time_changes_each_bounded_knob_alone(knob_set) -> None:  # noqa: ANN001
    cls = build_route_seasoning(knob_set, "tensorrt 11.1.0")
    space = RouteSpace([cls.info])
    assert space.size() == 2 * 4 * 1 + 1  # full: the product of bounded values, plus base
    routes = [str(r) for r in single_changes(space)]
    assert routes == [
        "trt-build-route",  # every knob at its default: the same build as the base route
        "trt-build-route{conv_use_long_w=off}",
        "trt-build-route{kgen:codegen:cuda_tile=0}",
        "trt-build-route{kgen:codegen:cuda_tile=2}",
        "trt-build-route{kgen:codegen:cuda_tile=3}",
    ]


def test_open_knobs_are_searched_only_with_listed_values(knob_set, registry) -> None:  # noqa: ANN001
    cls = build_route_seasoning(knob_set, "tensorrt 11.1.0")
    registry.seasonings.pop("trt-build-route")
    registry._current = "test"
    registry.add_seasoning(cls)
    space = parse_space(["trt-build-route:cask_fusion:num_tactics=20|40",
                         "trt-build-route:kgen:codegen:cuda_tile=1|2"])
    (info,) = restrict_space([cls.info], space, {}, registry)
    routes = [str(r) for r in single_changes(RouteSpace([info]))]
    assert "trt-build-route{cask_fusion:num_tactics=40}" in routes
    assert "trt-build-route{kgen:codegen:cuda_tile=3}" not in routes
    with pytest.raises(UsageError, match=r"--space trt-build-route:kgen:codegen:cuda_tile: "
                                         r"parameter 'kgen:codegen:cuda_tile': 9 is not one"):
        restrict_space([cls.info], parse_space(["trt-build-route:kgen:codegen:cuda_tile=9"]),
                       {}, registry)
    # the knobs at their defaults are a route only where every default is still listed:
    # not with num_tactics restricted to 20|40 (default 10), but with cuda_tile's 1|2
    assert Route((Step("trt-build-route"),)) not in single_changes(RouteSpace([info]))
    (tile_only,) = restrict_space([cls.info], parse_space(
        ["trt-build-route:kgen:codegen:cuda_tile=1|2"]), {}, registry)
    assert Route((Step("trt-build-route"),)) in single_changes(RouteSpace([tile_only]))
