"""Recipes: schema errors, override precedence, the winner recipe's round trip, build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomllib
from command import routetune as cli
from graphs import conv_bn
from quick import QUICK_FLAGS, QUICK_KEYWORDS

import routetune
from routetune.errors import UsageError
from routetune.run.recipe import Recipe, json_schema, load_recipe, merge


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


HEAD = 'schema_version = 2\n[model]\npath = "m.onnx"\n'


@pytest.mark.parametrize(("body", "message"), [
    ('[[seasonings]]\nname = "fp16"\n[[seasonings]]\nname = "ort-threads"\n'
     '[[seasonings]]\nname = "fp16"\n[seasonings.params]\n'
     'op_types_to_exclude = [["Softmx"]]\n',
     "seasonings[2].params.op_types_to_exclude: unknown op type 'Softmx'"),
    ('[[seasonings]]\nname = "fp61"\n', "seasonings[0].name: unknown seasoning 'fp61'"),
    ('[[seasonings]]\nname = "ort-threads"\n[seasonings.params]\nthreads = [1]\n',
     "seasonings[0].params.threads: seasoning 'ort-threads' has no parameter 'threads'"),
    ('[[seasonings]]\nname = "int8-qdq"\n[seasonings.params]\ncalibration = ["fast"]\n',
     "seasonings[0].params.calibration: 'fast' is not one of"),
    ('[search]\nbeam_width = "wide"\n', "search.beam_width: Input should be a valid integer"),
    ('[search]\nbeam_width = 0\n', "search.beam_width: Input should be greater than or equal "
                                   "to 1"),
    ('[measure]\nrace = "yes"\n', "measure.race: 'yes' is not a boolean; write true or "
                                    "false (TOML, unquoted)"),
    ('[measure]\nrace = 1\n', "measure.race: 1 is not a boolean; write true or false"),
    ('[serach]\nstrategy = "beam"\n', "serach: unknown field; did you mean 'search'?"),
    ('routes = ["fp16,fold-constants"]\n', "routes[0]: route 'fp16,fold-constants': "
                                           "'fp16' (precision) must come after"),
    ('base = ["ort-threads"]\n', "base[0]: 'ort-threads' is a build seasoning"),
    ('[backend]\nname = "tensort"\n', "backend.name: unknown backend 'tensort'"),
])
def test_schema_errors_name_the_field(tmp_path: Path, registry, body: str,  # noqa: ANN001
                                      message: str) -> None:
    text = HEAD + body if body.startswith("[") else f"schema_version = 2\n{body}{HEAD[19:]}"
    with pytest.raises(UsageError) as err:
        load_recipe(write(tmp_path, text), registry)
    assert str(err.value).startswith(f"{tmp_path / 'r.toml'}: ")
    assert message in str(err.value)


def test_model_must_be_path_or_example_and_toml_must_parse(tmp_path: Path, registry) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match=r"r.toml: model: give exactly one of path and "
                                         "example"):
        load_recipe(write(tmp_path, 'schema_version = 2\n[model]\n'), registry)
    with pytest.raises(UsageError, match="not a readable TOML file"):
        load_recipe(write(tmp_path, 'schema_version = = 2\n'), registry)
    with pytest.raises(UsageError, match="schema_version: Input should be 2"):
        load_recipe(write(tmp_path, 'schema_version = 3\n[model]\npath = "m.onnx"\n'),
                    registry)


def test_the_cli_prints_a_schema_error_as_one_line_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + '[[seasonings]]\nname = "fp16"\n[seasonings.params]\n'
                                  'op_types_to_exclude = [["Softmx"]]\n')
    done = cli("tune", "--recipe", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"routetune: error: {path}: seasonings[0].params."
                           "op_types_to_exclude: unknown op type 'Softmx'\n")


def test_every_bad_field_is_listed_at_once_one_per_line(tmp_path: Path) -> None:
    """Schema problems and the plugins' problems together: one round of fixing, not four."""
    path = write(tmp_path, 'schema_version = 2\nroutes = ["fp16,fold-constants"]\n'
                 + HEAD[19:] + '[backend]\nname = "tensort"\n[search]\nmax_trials = 0\n'
                 '[[seasonings]]\nname = "fp61"\n'
                 '[[seasonings]]\nname = "ort-threads"\n[seasonings.params]\nthreads = [1]\n')
    done = cli("tune", "--recipe", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[:2] == [f"routetune: error: {path}: 5 problems",
                         "  search.max_trials: Input should be greater than or equal to 1"]
    starts = ["  backend.name: unknown backend 'tensort'; did you mean 'tensorrt'? (all: "
              "`routetune seasonings`)",
              "  seasonings[0].name: unknown seasoning 'fp61'; did you mean 'fp16'?",
              "  seasonings[1].params.threads: seasoning 'ort-threads' has no parameter "
              "'threads'; known: intra_op",
              "  routes[0]: route 'fp16,fold-constants': 'fp16' (precision) must come after "
              "'fold-constants' (graph)"]
    assert len(lines) == 6 and all(line.startswith(start)
                                   for line, start in zip(lines[2:], starts, strict=True))


def test_an_unknown_field_gets_the_closest_and_a_bad_expression_comes_in_the_first_pass(
        tmp_path: Path, registry) -> None:  # noqa: ANN001
    path = write(tmp_path, HEAD + '[search]\nmax_dept = 3\n[accuracy]\nexpr = "cos>>0.9"\n')
    with pytest.raises(UsageError) as err:
        load_recipe(path, registry)
    assert err.value.problems == (
        "search.max_dept: unknown field; did you mean 'max_depth'?",
        "accuracy.expr: 'cos>>0.9': '>>' in 'cos>>0.9' is not an operator; write e.g. "
        "cos>=0.99 or cos<=0.01")


def test_flags_given_override_the_recipe_and_the_rest_comes_from_it(tmp_path: Path,
                                                                    registry) -> None:  # noqa: ANN001
    path = write(tmp_path, HEAD + (
        '[[seasonings]]\nname = "ort-threads"\n[seasonings.params]\nintra_op = [1]\n'
        '[search]\nstrategy = "exhaustive"\nmax_depth = 1\n[measure]\nmin_runs = 7\n'
        '[inputs]\nshapes = "x:1x3x32x32"\n[accuracy]\nexpr = "cos>=0.9"\n'))
    given = {"recipe": path, "max_depth": 0, "min_time_s": 0.5,
             "space": {"ort-threads": {"intra_op": (2,)}}}
    opts = merge(given, "cli", registry)
    assert opts.model == tmp_path / "m.onnx"  # relative to the recipe
    assert (opts.search, opts.max_depth, opts.shapes) == ("exhaustive", 0, "x:1x3x32x32")
    assert (opts.measure.min_runs, opts.measure.min_time_s) == (7, 0.5)
    assert opts.seasonings == ("ort-threads",)
    assert opts.space == {"ort-threads": {"intra_op": (2,)}}  # --space wins per parameter
    assert opts.accuracy == "cos>=0.9"  # the flag was not given: the recipe's


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, routetune.tune]:
    root = tmp_path_factory.mktemp("recipe")
    model = conv_bn(root / "m.onnx")
    result = routetune.tune(model, shapes="x:1x3x32x32", search="exhaustive",
                            seasonings="fuse-bn-into-conv,ort-threads,fp16",
                            output=root / "out", max_depth=1, **QUICK_KEYWORDS)
    return root, result


def test_the_winner_recipe_round_trips(tuned, registry) -> None:  # noqa: ANN001
    root, result = tuned
    winner_toml = root / "out" / "winner.toml"
    recipe = load_recipe(winner_toml, registry)
    assert recipe.routes == [result.winner.route] and recipe.seasonings == []
    again = cli("tune", "--recipe", str(winner_toml), "--output", str(root / "again"),
                *QUICK_FLAGS)
    assert again.returncode == 0, again.stderr
    run = json.loads((root / "again" / "run.json").read_text())
    assert run["space"]["size"] == 1  # nothing searched: the base route and the pinned one
    routes = {t["route"] for t in json.loads((root / "again" / "report.json").read_text())
              ["trials"]}
    assert routes == {"base", result.winner.route}
    assert tomllib.loads((root / "again" / "winner.toml").read_text())["schema_version"] == 2


def test_re_measuring_the_winner_in_place_keeps_the_original_run(tuned) -> None:  # noqa: ANN001
    root, result = tuned
    out = root / "out"
    kept = {name: (out / name).read_bytes() for name in
            ("run.json", "report.json", "report.md", "winner.toml", "winner.json")}
    again = cli("tune", "--recipe", str(out / "winner.toml"),  # output = "." : this folder
                *QUICK_FLAGS)
    assert again.returncode == 0, again.stderr
    assert {name: (out / name).read_bytes() for name in kept} == kept
    (dated,) = (out / "runs").iterdir()
    run = json.loads((dated / "run.json").read_text())
    assert run["pinned"] == [result.winner.route]
    assert run["result"]["winner"] in ("base", result.winner.route)
    assert (dated / "report.html").exists() and (dated / "winner.json").exists()
    recipe = tomllib.loads((dated / "winner.toml").read_text())
    assert recipe["output"] == "../.."  # points back to the folder that holds the store
    assert f"to {dated}" in again.stdout or str(dated) in again.stdout
    report = cli("report", str(dated))  # a dated record folder reports from the store above
    assert report.returncode == 0, report.stderr


def test_build_reproduces_the_winner_and_catches_a_route_that_does_not_match(tuned) -> None:  # noqa: ANN001
    root, result = tuned
    out = root / "out"
    done = cli("build", "--recipe", str(out / "winner.toml"), "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert f"built {result.winner.route}: " in done.stdout
    assert "outputs match the stored winner's outputs (winner_outputs.npz)" in done.stdout
    stored = np.load(out / "winner_outputs.npz")
    assert sorted(stored.files) == ["0/y", "1/y"]
    bad = cli("build", str(root / "m.onnx"), "--route", "fp16", "--shapes", "x:1x3x32x32",
              "--output", str(out))
    assert bad.returncode == 1
    assert "outputs do not match the FP32 reference (the onnxruntime backend): y: l0 " in bad.stdout
    other_inputs = cli("build", str(root / "m.onnx"), "--route", result.winner.route,
                       "--shapes", "x:2x3x32x32", "--output", str(out))
    assert other_inputs.returncode == 0, other_inputs.stderr  # not the stored run's inputs:
    assert "match the FP32 reference" in other_inputs.stdout  # checked against FP32
    neither = cli("build", str(root / "m.onnx"), "--output", str(out))
    assert neither.returncode == 2 and "give --route TEXT or --recipe FILE" in neither.stderr


def test_schema_command_prints_the_json_schema() -> None:
    done = cli("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema == json.loads(json.dumps(json_schema()))
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["properties"]) == set(Recipe.model_fields)


def test_python_api_returns_the_result_with_records_dataframe_and_report(tuned,  # noqa: ANN001
                                                                        tmp_path: Path) -> None:
    root, result = tuned
    assert result.winner is result.trials[0]
    frame = result.to_dataframe()
    assert list(frame["route"]) == [t.route for t in result.trials]
    assert {"p50_ms", "speedup", "error_rel_l2"} <= set(frame.columns)
    paths = result.report(tmp_path / "rep")
    assert paths["html"].read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(UsageError, match="routetune.tune: unknown option 'bogus'"):
        routetune.tune(root / "m.onnx", bogus=1)
    with pytest.raises(UsageError, match=r"routetune.tune\(max_depth=...\): '2' must be int$"):
        routetune.tune(root / "m.onnx", max_depth="2")


def test_the_readme_recipe_validates(tmp_path: Path, registry) -> None:  # noqa: ANN001
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    recipe = load_recipe(write(tmp_path, block), registry)
    assert recipe.routes == ["fp16,ort-threads{intra_op=2}"]
    assert recipe.seasonings[0].params == {"op_types_to_exclude": [["Softmax"], []]}


def test_more_inputs_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    missing = tmp_path / "inputs.toml"  # a recipe whose inputs file does not exist
    missing.write_text(f'schema_version = 2\n[model]\npath = "{model}"\n[inputs]\n'
                       'path = "no.npz"\n')
    path = write(tmp_path, f'schema_version = 2\nroutes = ["trt-tiling"]\n[model]\npath = '
                           f'"{model}"\n[inputs]\nshapes = "x:1x3x32x32"\n')
    for args, message in (
        (["tune", "--recipe", str(path)], "pinned route 'trt-tiling': trt-tiling applies only "
                                          "to backends tensorrt, not onnxruntime"),
        (["tune", str(model), "--max-depth", "abc"], "Invalid value for '--max-depth'"),
        (["report"], "Missing argument 'outdir'"),
        (["tune", "--recipe", str(missing)],
         f"{missing} [inputs] path {tmp_path / 'no.npz'}: no such file"),
    ):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("routetune: error: ") and message in done.stderr
        assert len(done.stderr.splitlines()) == 1


def test_seasonings_flag_replaces_the_recipes_and_its_spaces(tmp_path: Path,
                                                             registry) -> None:  # noqa: ANN001
    path = write(tmp_path, HEAD + '[[seasonings]]\nname = "fp16"\n[seasonings.params]\n'
                                  'keep_io_types = [true]\n')
    opts = merge({"recipe": path, "seasonings": ("ort-threads",)}, "cli", registry)
    assert opts.seasonings == ("ort-threads",) and opts.space == {}


def test_an_api_argument_equal_to_the_default_still_overrides_the_recipe(
        tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    path = write(tmp_path, f'schema_version = 2\n[model]\npath = "{model}"\n[search]\n'
                           'strategy = "exhaustive"\nmax_depth = 1\n[[seasonings]]\n'
                           'name = "ort-threads"\n[inputs]\nshapes = "x:1x3x32x32"\n')
    routetune.tune(recipe=path, search="beam", output=tmp_path / "out", **QUICK_KEYWORDS)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["search"]["strategy"] == "beam"
