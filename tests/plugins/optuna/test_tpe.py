"""Optuna's TPE sampler as a search strategy (``--search tpe``), with the real Optuna."""

from __future__ import annotations

import json
from pathlib import Path

from command import routetune
from graphs import matmul_chain
from quick import QUICK_FLAGS

from routetune.registry import Registry
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route
from routetune.testing import check_strategy

NAMES = ("eliminate-noops", "fold-constants", "fuse-bn-into-conv", "ort-threads",
         "ort-no-spinning")


def test_it_keeps_the_strategy_contract_and_asks_only_new_routes(registry: Registry) -> None:
    space = RouteSpace([registry.seasoning(n).info for n in NAMES], 3)
    asked = check_strategy(registry, "tpe", space, options={"n_trials": 12, "seed": 3})
    assert len(asked) == len(set(asked)) == 12
    assert Route() not in asked
    other = check_strategy(registry, "tpe", space, options={"n_trials": 12, "seed": 4})
    assert other != asked  # the seed is the sampler's


def test_a_small_space_ends_once_every_route_was_asked(registry: Registry) -> None:
    space = RouteSpace([registry.seasoning("ort-threads").info], 1)
    asked = check_strategy(registry, "tpe", space, options={"n_trials": 50})
    assert len(asked) == space.size() - 1


def test_a_real_search_with_tpe(tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "m.onnx", depth=3, width=32, batch=4)
    proc = routetune("tune", str(model), "--output", str(tmp_path / "out"), "--search", "tpe",
                     "--search-option", "n_trials=3", "--seasonings",
                     "ort-opt-level,ort-no-spinning", "--in-process", *QUICK_FLAGS)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["search"]["strategy"] == "tpe"
    assert record["search"]["options"]["n_trials"] == 3
    assert "4 trials" in proc.stdout  # the base route and three sampled
