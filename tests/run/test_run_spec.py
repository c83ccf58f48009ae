"""The run spec: each option declared once, and an error naming it as the user wrote it."""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from command import routetune as cli
from graphs import conv_bn

import routetune
from routetune.api import tune as api_tune
from routetune.errors import UsageError
from routetune.options import option, options_of
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace
from routetune.run.recipe import json_schema, merge
from routetune.run.run_spec import RunSpec
from routetune.search.strategy import Strategy, configure
from routetune.testing import ContractError, check_strategy, registry_with

ROOT = Path(__file__).parents[2]


def test_every_option_is_declared_once_with_help_and_unique_names() -> None:
    infos = options_of(RunSpec)
    assert all(info.meta.help.strip() for info in infos)
    for names in ([i.name for i in infos], [i.flag for i in infos if i.flag],
                  [i.meta.recipe for i in infos if i.meta.recipe]):
        assert len(names) == len(set(names)), names
    assert {"min_runs", "min_time_s"} <= {i.name for i in infos}  # grouped, flattened


def test_the_flags_recipe_schema_docs_and_api_come_from_the_declarations() -> None:
    import typer

    from routetune.cli import app

    command = typer.main.get_command(app).commands["tune"]  # type: ignore[attr-defined]
    flags = {opt for param in command.params
             for opt in [*param.opts, *getattr(param, "secondary_opts", [])]}
    readme = (ROOT / "README.md").read_text()
    schema = json_schema()
    keywords = api_tune.__doc__ or ""
    for flag in sorted(f for f in flags if f.startswith("--") and f != "--help"):
        assert f"`{flag}" in readme, f"README's flag table lacks {flag}"  # --verbose too
    for info in options_of(RunSpec):
        if info.flag and not info.meta.argument:
            flag = info.flag.split("/")[0]
            assert flag in flags, flag  # typer's parameters are made from them
            assert f"`{flag}" in readme, f"README's flag table lacks {flag}"
        if info.meta.recipe and "." in info.meta.recipe and "seasonings" not in (
                info.meta.recipe):
            table, key = info.meta.recipe.split(".")
            ref = schema["properties"][table].get("$ref", "").rsplit("/", 1)[-1]
            field = schema["$defs"][ref]["properties"][key]
            assert field["description"] == info.meta.help
        assert f"``{info.name}``" in keywords or info.name == "model", info.name
    assert schema["$defs"]["SearchSpec"]["properties"]["max_trials"]["anyOf"][0][
        "minimum"] == 1  # the bounds reach the JSON Schema


def test_the_spec_is_frozen_and_picklable_for_the_workers() -> None:
    spec = RunSpec(search_options={"beam_width": 2}, sources={"max_trials": "cli"},
                   entry="cli", max_trials=5)
    assert pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(AttributeError):
        spec.max_trials = 6  # type: ignore[misc]


def test_merge_keeps_where_each_value_came_from(tmp_path: Path, registry: Registry) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('schema_version = 2\n[model]\npath = "m.onnx"\n'
                      "[search]\nmax_trials = 4\nmax_depth = 1\noptions = { a = 1, b = 2 }\n")
    spec = merge({"recipe": recipe, "max_depth": 2, "search_options": {"b": 3}}, "cli",
                 registry)
    assert spec.search_options == {"a": 1, "b": 3}  # merged per option
    assert (spec.max_trials, spec.max_depth, spec.model) == (4, 2, tmp_path / "m.onnx")
    assert spec.spelled("max_trials") == f"{recipe} [search] max_trials"
    assert spec.spelled("max_depth") == "--max-depth"
    assert spec.spelled("time_budget_s") == "--time-budget"  # not given: the front end's
    api = merge({"recipe": recipe}, "api", registry)
    assert api.spelled("inputs") == "routetune.tune(inputs=...)"


def test_one_bad_value_is_named_as_each_source_wrote_it(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    missing = tmp_path / "nothing.npz"
    done = cli("tune", str(model), "--inputs", str(missing), "--output", str(tmp_path / "c"))
    assert done.returncode == 2
    assert done.stderr == (f"routetune: error: --inputs {missing}: no such file or "
                           "directory\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text('schema_version = 2\noutput = "r"\n[model]\npath = "m.onnx"\n'
                      '[inputs]\npath = "nothing.npz"\n')
    done = cli("tune", "--recipe", str(recipe))
    assert done.returncode == 2
    assert done.stderr == (f"routetune: error: {recipe} [inputs] path {missing}: no such "
                           "file or directory\n")
    with pytest.raises(UsageError) as e:
        routetune.tune(model, inputs=missing, output=tmp_path / "a")
    assert str(e.value) == f"routetune.tune(inputs=...) {missing}: no such file or directory"
    with pytest.raises(UsageError, match=re.escape("routetune.tune(max_trials=...) 0: must "
                                                   "be 1 or more")):
        routetune.tune(model, max_trials=0, output=tmp_path / "a")
    done = cli("tune", str(model), "--trial-timeout", "nan", "--output", str(tmp_path / "c"))
    assert done.stderr == ("routetune: error: --trial-timeout nan: must be a finite number "
                           "more than 0\n")


def test_strategy_options_are_checked_against_the_strategys_declaration(
        tmp_path: Path, registry: Registry) -> None:
    from routetune.search.beam import Beam

    assert configure(Beam, {"beam_width": 5}).beam_width == 5
    assert configure(Beam, {}, beam_width=2).beam_width == 2  # the shorthand
    cases = {
        (("beam_width", 0),): "--search-option beam_width=0: must be 1 or more",
        (("width", 2),): "--search-option width=2: the beam search takes no option "
                         "'width' (its options: beam_width)",
        (("beam_width", "wide"),): "--search-option beam_width='wide': 'wide' must be int",
    }
    for given, message in cases.items():
        spec = RunSpec(search_options=dict(given), entry="cli")
        with pytest.raises(UsageError) as e, spec.worded():
            configure(Beam, spec.search_options, spec.beam_width, spec.spelled)
        assert str(e.value) == message
    model = conv_bn(tmp_path / "m.onnx")
    done = cli("tune", str(model), "--search-option", "beam_width=0", "--output",
               str(tmp_path / "o"))
    assert done.stderr == "routetune: error: --search-option beam_width=0: must be 1 or more\n"
    done = cli("tune", str(model), "--search-option", "beam_width", "--output",
               str(tmp_path / "o"))
    assert done.stderr == ("routetune: error: --search-option 'beam_width': write KEY=VALUE, "
                           "e.g. beam_width=4\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text('schema_version = 2\n[model]\npath = "m.onnx"\n[search]\n'
                      'options = { beam_width = -1 }\n')
    done = cli("tune", "--recipe", str(recipe), "--output", str(tmp_path / "o"))
    assert done.stderr == (f"routetune: error: {recipe} [search] options beam_width=-1: must "
                           "be 1 or more\n")


@dataclass(frozen=True)
class LooseOptions:
    count: int = 1  # not declared with option(): no help, no checks


def with_strategy(name: str, options: type) -> Registry:
    """The installed plugins plus a strategy `name` that takes `options` and asks nothing."""
    strategy = type(name, (Strategy,), {"name": name, "Options": options,
                                        "ask": lambda self: [], "__doc__": "Asks nothing."})

    class Plugin:
        @routetune.hookimpl
        def routetune_register_strategies(self, registry: Registry) -> None:
            registry.add_strategy(strategy)

    return registry_with(Plugin(), name)


def test_the_contract_kit_refuses_options_not_declared_with_option() -> None:
    registry = with_strategy("loose", LooseOptions)
    space = RouteSpace([registry.seasoning("ort-threads").info], 1)
    with pytest.raises(ContractError, match="strategy 'loose': Options field.s. count are "
                                            "not declared with"):
        check_strategy(registry, "loose", space)


def test_the_probe_s_cases_are_one_line_each(tmp_path: Path, registry: Registry) -> None:
    from routetune.search.beam import Beam

    # the shorthand and the option disagree: neither wins silently
    spec = RunSpec(beam_width=2, search_options={"beam_width": 3}, entry="cli")
    with pytest.raises(UsageError) as e, spec.worded():
        configure(Beam, spec.search_options, spec.beam_width, spec.spelled)
    assert str(e.value) == ("--beam-width 2: --search-option also sets beam_width=3; give "
                            "one of them")
    model = conv_bn(tmp_path / "m.onnx")
    for keywords, message in (
            ({"time_budget": 5}, "unknown option 'time_budget'; did you mean "
                                 "'time_budget_s'?"),
            ({"seasonings": 5}, "routetune.tune(seasonings=...): 5 must be a list"),
            ({"time_budget_s": "x"}, "routetune.tune(time_budget_s=...): 'x' must be a "
                                     "number"),
            ({"recipe": tmp_path / "nope.toml"}, "routetune.tune(recipe=...) "
                                                 f"{tmp_path / 'nope.toml'}: no such file"),
            ({"time_budget_s": -1.0}, "routetune.tune(time_budget_s=...) -1: must be more "
                                      "than 0")):
        with pytest.raises(UsageError) as e:
            routetune.tune(model, output=tmp_path / "o", **keywords)
        assert message in str(e.value), str(e.value)
    recipe = tmp_path / "r.toml"
    recipe.write_text('schema_version = 2\n[model]\npath = "m.onnx"\n[search]\n'
                      "time_budget_s = nan\n")
    with pytest.raises(UsageError, match="search.time_budget_s: Input should be a finite "
                                         "number"):
        merge({"recipe": recipe}, "cli", registry)


@dataclass(frozen=True)
class OutOfBoundsOptions:
    count: int = option(0, help="How many.", minimum=1)


def test_the_contract_kit_checks_option_defaults_against_their_bounds() -> None:
    registry = with_strategy("out-of-bounds", OutOfBoundsOptions)
    space = RouteSpace([registry.seasoning("ort-threads").info], 1)
    with pytest.raises(ContractError, match="default of option 'count' .0. must be 1 or more"):
        check_strategy(registry, "out-of-bounds", space)
