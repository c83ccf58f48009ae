"""The plugin examples in CONTRIBUTING.md work as written."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import conv_bn
from onnx import TensorProto, helper, numpy_helper
from quick import quick_spec

from routetune.errors import UsageError
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace
from routetune.run.tuning import tune
from routetune.testing import check_strategy, registry_with

DOC = Path(__file__).parents[1] / "CONTRIBUTING.md"


def example(marker: str) -> types.ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    source = next(b for b in blocks if b.startswith(f"# {marker}/"))
    module = types.ModuleType(marker)
    sys.modules[marker] = module  # dataclasses look their module up while it runs
    exec(compile(source, f"CONTRIBUTING.md:{marker}", "exec"), module.__dict__)  # noqa: S102
    return module


def mul_by_one(path: Path) -> Path:
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "one"], ["m"], name="mul"),
             helper.make_node("Tanh", ["m"], ["y"], name="tanh")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx >= 1.19 writes IR 11+, which older onnxruntime refuses
    onnx.save(model, path)
    return path


def test_seasoning_example(registry: Registry, tmp_path: Path) -> None:
    example("routetune_mulone").routetune_register_seasonings(registry)
    result = tune(quick_spec(model=mul_by_one(tmp_path / "m.onnx"), output=tmp_path / "out",
                             seasonings=("remove-mul-by-one",), keep="all"),  # every model stays
                  registry)
    trial = next(t for t in result.trials if t.route == "remove-mul-by-one")
    assert trial.status == "ok"
    assert trial.passes[0]["stats"] == {"removed": 1}
    rewritten = onnx.load(tmp_path / "out" / trial.artifact)
    assert [n.op_type for n in rewritten.graph.node] == ["Relu", "Tanh"]


def test_backend_example(registry: Registry, tmp_path: Path) -> None:
    example("routetune_refeval").routetune_register_backends(registry)
    result = tune(quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "out",
                             backend="onnx-reference", shapes="x:1x3x32x32",
                             seasonings=("fuse-bn-into-conv",)), registry)
    assert {t.route: t.status for t in result.trials} == {"base": "ok", "fuse-bn-into-conv": "ok"}
    assert result.base.device == "cpu: onnx.reference"


def test_strategy_example_takes_its_own_options(tmp_path: Path) -> None:
    registry = registry_with(example("routetune_firstn"), "firstn")
    space = RouteSpace([registry.seasoning("ort-threads").info], 1)
    assert len(check_strategy(registry, "first-n", space)) == 1
    spec = quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "out",
                      search="first-n", search_options={"count": 2}, shapes="x:1x3x32x32",
                      seasonings=("ort-threads",), max_depth=1)
    result = tune(spec, registry)
    assert len([t for t in result.trials if t.route != "base"]) == 2
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["search"]["options"] == {"count": 2}
    with pytest.raises(UsageError, match=re.escape(
            "routetune.tune(search_options=...) count=0: must be 1 or more")):
        tune(dataclasses.replace(spec, search_options={"count": 0}), registry)


def test_executor_example_runs_a_search(tmp_path: Path) -> None:
    registry = registry_with(example("routetune_logged"), "logged")
    assert registry.executors["logged"].plugin == "logged"
    result = tune(quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "out",
                             shapes="x:1x3x32x32", seasonings=("ort-threads",),
                             search="exhaustive", executor="logged", in_process=False),
                  registry)
    lines = (tmp_path / "out" / "logged.txt").read_text().splitlines()
    routes = {t.route for t in result.trials if t.status != "skipped"}
    assert {line.split()[1] for line in lines} == routes and len(routes) > 1
    assert all(line.split()[2] == "ok" for line in lines)
    with pytest.raises(UsageError, match="--executor logged with --build-workers"):
        tune(quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "o2",
                        shapes="x:1x3x32x32", executor="logged", in_process=False,
                        build_workers=2, entry="cli"), registry)


def test_contract_kit_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The package test that CONTRIBUTING shows, with its plugin importable."""
    monkeypatch.setitem(sys.modules, "routetune_mulone", example("routetune_mulone"))
    example("tests").test_contract(tmp_path)


def test_metric_example(registry: Registry) -> None:
    from routetune.judging.accuracy import check_accuracy, parse_accuracy
    from routetune.testing import check_metric

    example("routetune_signs").routetune_register_metrics(registry)
    check_metric(registry, "signs")
    ref = np.array([[1.0, -2.0], [3.0, 4.0], [-1.0, 0.5], [2.0, 2.0]], np.float32)
    out = ref.copy()
    out[1, 0] = -0.1  # one sample of four changes a sign
    verdict = check_accuracy(parse_accuracy("signs>=0.9", registry, ["y"]), registry,
                             [{"y": out}], [{"y": ref}])
    assert verdict.metrics["y"]["signs"] == 0.75
    assert verdict.failures == ("y: signs 0.75, needs >= 0.9",)
