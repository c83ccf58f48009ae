"""routetune.testing, the contract kit: the built-ins keep it, and broken plugins fail it."""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest
from graphs import conv_bn, folded_mul_one, wasteful

from routetune import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo, hookimpl
from routetune.errors import PluginError
from routetune.passes.precision.bisection import REPAIR
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace
from routetune.search.strategy import Strategy
from routetune.testing import (
    ContractError,
    check_backend,
    check_metric,
    check_seasoning,
    check_strategy,
    registry_with,
)

CHECKED_ON_CPU = {"eliminate-noops", "fold-constants", "fuse-bn-into-conv", "fp16", "int8-qdq"}
"""Built-in graph and precision seasonings the CPU backend offers on the test graphs."""


def test_builtin_seasonings_keep_the_contract(registry: Registry, tmp_path: Path) -> None:
    models = [conv_bn(tmp_path / "conv_bn.onnx"), wasteful(tmp_path / "wasteful.onnx"),
              folded_mul_one(tmp_path / "mul_one.onnx")]
    from routetune.model.loading import prepare
    from routetune.model.weights import import_graph

    cpu = registry.backend("onnxruntime")()
    checked = set()
    for name, entry in registry.seasonings.items():
        seasoning = entry.item()
        if (seasoning.info.stage == "build" or seasoning.supports(cpu)
                or seasoning.info.requires or name == REPAIR):
            continue  # a build option, another backend's, or only after another seasoning
        for model in models:
            graph = import_graph(prepare(model).proto, None)
            if seasoning.why_not(graph, cpu) is None:
                record = check_seasoning(registry, name, model, tmp_path / name / model.stem)
                assert record["step"] == name
                checked.add(name)
                break
    assert checked >= CHECKED_ON_CPU


def test_builtin_backend_strategies_and_metrics_keep_the_contract(
        registry: Registry, tmp_path: Path) -> None:
    check_backend(registry, "onnxruntime", conv_bn(tmp_path / "m.onnx"), tmp_path / "be")
    infos = [registry.seasoning(n).info for n in ("eliminate-noops", "fold-constants",
                                                  "fuse-bn-into-conv", "ort-threads")]
    space = RouteSpace(infos, 2)
    for name in registry.strategies:
        asked = check_strategy(registry, name, space)
        assert asked, name
    for name in registry.metrics:
        check_metric(registry, name)


def _plugin(*seasonings: type[Seasoning], strategy: type[Strategy] | None = None
            ) -> types.ModuleType:
    """A plugin module, as a package would have, registering these items."""
    module = types.ModuleType("broken_plugin")

    @hookimpl
    def routetune_register_seasonings(registry: Registry) -> None:
        for cls in seasonings:
            registry.add_seasoning(cls)

    @hookimpl
    def routetune_register_strategies(registry: Registry) -> None:
        if strategy is not None:
            registry.add_strategy(strategy)

    module.routetune_register_seasonings = routetune_register_seasonings  # type: ignore[attr-defined]
    module.routetune_register_strategies = routetune_register_strategies  # type: ignore[attr-defined]
    return module


class _Renamer(Seasoning):
    """Renames the first node at random: not deterministic."""

    info = SeasoningInfo(name="renamer", stage="graph", summary="rename a node")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        state.graph.nodes[0].name = f"n{random.randrange(10**9)}"
        return PassResult(modified=True)


class _Unpicklable(Seasoning):
    """Keeps a lambda on self: cannot travel to a worker."""

    info = SeasoningInfo(name="unpicklable", stage="graph", summary="keeps a lambda")

    def __init__(self, params=None) -> None:  # noqa: ANN001
        super().__init__(params)
        self.hook = lambda: None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        return PassResult(modified=False)


class _Greedy(Seasoning):
    """Applies to anything, so it cannot refuse the model it must refuse."""

    info = SeasoningInfo(name="greedy", stage="graph", summary="never refuses")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        return PassResult(modified=False)


class _Wanderer(Strategy):
    """Asks for a route outside its space."""

    name = "wanderer"

    def ask(self) -> list:
        from routetune.routes.route import parse_route

        return [parse_route("no-such-seasoning")]


@pytest.mark.parametrize(("cls", "rule"), [
    (_Renamer, "not deterministic"), (_Unpicklable, "does not pickle"),
    (_Greedy, "which it should refuse")])
def test_a_broken_seasoning_fails_the_kit_naming_the_rule(
        cls: type[Seasoning], rule: str, tmp_path: Path) -> None:
    registry = registry_with(_plugin(cls), "broken")
    model = conv_bn(tmp_path / "m.onnx")
    with pytest.raises(ContractError, match=f"seasoning '{cls.info.name}': .*{rule}"):
        check_seasoning(registry, cls.info.name, model, tmp_path / "w", refused=model)


def test_a_broken_strategy_fails_the_kit(tmp_path: Path) -> None:
    registry = registry_with(_plugin(strategy=_Wanderer), "broken")
    space = RouteSpace([registry.seasoning("eliminate-noops").info], 1)
    with pytest.raises(ContractError, match="strategy 'wanderer': asked for 'no-such-seasoning'"):
        check_strategy(registry, "wanderer", space)


def test_a_misspelled_hook_fails_registration_in_one_line() -> None:
    module = types.ModuleType("typo_plugin")

    @hookimpl
    def routetune_register_seasonnings(registry: Registry) -> None:
        """Misspelled."""

    module.routetune_register_seasonnings = routetune_register_seasonnings  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="plugin 'typo' .*not a valid routetune plugin"):
        registry_with(module, "typo")
