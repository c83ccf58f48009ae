"""Route recipes: TOML files that say what to tune and how, or pin one route exactly.

Schema version 2 (``schema_version = 2``); ``routetune schema`` prints it as JSON Schema
(draft 2020-12) for editors. Tables and keys:

- ``[model]``: ``path`` (an ONNX file, relative to the recipe) or ``example`` (a bundled
  example name); ``sha256`` (optional: the file must have this hash).
- ``[backend]``: ``name``; ``[backend.options]``: build options every route starts
  from (``"onnxruntime.intra_op_num_threads" = 2``; see each backend's options).
- ``base``: route steps (graph and precision seasonings) applied to every route, the
  base route included: ``base = ["fold-constants"]``.
- ``[[seasonings]]``: the seasonings to consider, each ``name`` with optional
  ``[seasonings.params]`` listing the values to try per parameter
  (``op_types_to_exclude = [["Softmax"], []]``). Left out: every applicable one. An
  empty list (``seasonings = []``): none, only the pinned routes.
- ``routes``: route texts always tried (pinned), e.g. ``["fp16,ort-threads{intra_op=2}"]``.
- ``[search]``: ``strategy``, ``beam_width``, ``max_depth``, ``max_trials``,
  ``time_budget_s``.
- ``[accuracy]``: ``expr`` (the ``--accuracy`` expression) and ``[accuracy.outputs]``,
  an expression per output name.
- ``[measure]``: ``min_runs``, ``min_time_s``.
- ``[inputs]``: ``path`` (``.npz`` file or folder, relative to the recipe), or
  ``shapes``, ``min_shapes``, ``opt_shapes``, ``max_shapes`` (trtexec spelling).
- ``output``: the output directory (relative to the recipe).
- ``[result]``: what a search measured, in winner recipes; read as information only.

Version 1 (``winner.toml`` before 2026-11-29: ``[route] text``) is read as version 2
with that route pinned and nothing searched.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from routetune.errors import RoutetuneError, UsageError, one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from routetune.preparation import Prepared
    from routetune.registry import Registry
    from routetune.tuning import TuneOptions, TuneResult

SCHEMA_VERSION = 2
Value = bool | int | float | str | list[Any]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Table):
    """``[model]``: exactly one of ``path`` and ``example``."""

    path: str | None = Field(None, description="ONNX file, relative to the recipe")
    example: str | None = Field(None, description="bundled example name, e.g. ppocr-det")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="the model file's sha256 (checked)")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.example is None):
            raise ValueError("give exactly one of path and example")
        return self


class BackendSpec(_Table):
    """``[backend]``: the backend and the build options every route starts from."""

    name: str = "onnxruntime"
    options: dict[str, bool | int | float | str] = Field(default_factory=dict)


class SeasoningSpec(_Table):
    """One ``[[seasonings]]`` entry: a seasoning and the values to try per parameter."""

    name: str
    params: dict[str, list[Value]] = Field(
        default_factory=dict, description="per parameter, the values the search tries")


class SearchSpec(_Table):
    """``[search]``."""

    strategy: str = "beam"
    beam_width: int = Field(3, ge=1)
    max_depth: int = Field(3, ge=0)
    max_trials: int | None = Field(None, ge=1)
    time_budget_s: float | None = Field(None, gt=0)


class AccuracySpec(_Table):
    """``[accuracy]``: one expression, and expressions per output name."""

    expr: str | None = None
    outputs: dict[str, str] = Field(default_factory=dict)


class MeasureSpec(_Table):
    """``[measure]``."""

    min_runs: int = Field(20, ge=1)
    min_time_s: float = Field(1.0, ge=0)
    min_speedup: float = Field(1.03, ge=1.0, description="the smallest speed-up that may win")
    busy_machine: Literal["wait", "warn", "ignore"] = Field(
        "wait", description="what measurements do while other processes load the machine")


class InputsSpec(_Table):
    """``[inputs]``: a path, or shapes."""

    path: str | None = None
    shapes: str | None = None
    min_shapes: str | None = None
    opt_shapes: str | None = None
    max_shapes: str | None = None


class Recipe(_Table):
    """A route recipe, schema version 2 (see the module documentation)."""

    model_config = ConfigDict(extra="forbid", title="routetune recipe")
    schema_version: Literal[2]
    model: ModelSpec
    backend: BackendSpec = Field(default_factory=BackendSpec)
    base: list[str] = Field(default_factory=list)
    seasonings: list[SeasoningSpec] | None = None
    routes: list[str] = Field(default_factory=list)
    search: SearchSpec = Field(default_factory=SearchSpec)
    accuracy: AccuracySpec = Field(default_factory=AccuracySpec)
    measure: MeasureSpec = Field(default_factory=MeasureSpec)
    inputs: InputsSpec = Field(default_factory=InputsSpec)
    output: str | None = None
    result: dict[str, Any] | None = Field(None, description="written by winner recipes")


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema (what ``routetune schema`` prints)."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://routetune.dev/schema/recipe-{SCHEMA_VERSION}.json"
    return schema


def load_recipe(path: Path, registry: Registry) -> Recipe:
    """Read, upgrade (version 1) and validate a recipe against the schema and the plugins.

    Raises:
        UsageError: Unreadable TOML, or field-level problems, all in one line, e.g.
            ``r.toml: seasonings[2].params.op_types_to_exclude: unknown op type 'Softmx'``.
    """
    if path.exists() and not path.is_file():  # a FIFO or a device: reading it never ends
        raise UsageError(f"--recipe {path}: not a regular file")
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise UsageError(f"--recipe {path}: no such file") from e
    except RecursionError as e:  # tomllib recurses per nested array or inline table
        raise UsageError(f"--recipe {path}: not a readable TOML file (arrays or tables "
                         "nested too deeply)") from e
    except (OSError, ValueError) as e:  # TOMLDecodeError, UnicodeDecodeError, int digits
        raise UsageError(f"--recipe {path}: not a readable TOML file ({one_line(e)})") from e
    if doc.get("schema_version") == 1:
        doc = _upgrade_v1(doc)
    try:
        recipe = Recipe.model_validate(doc)
    except ValidationError as e:
        problems = [f"{_where(err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
                    for err in e.errors()]
        raise UsageError(_one_line(f"{path}: " + "; ".join(problems))) from e
    problems = _check_names(recipe, registry)
    if problems:
        raise UsageError(_one_line(f"{path}: " + "; ".join(problems)))
    return recipe


def _one_line(text: str) -> str:
    """`text` with every run of whitespace, line breaks included, as one space.

    Problems quote the recipe's values (a route text with a line break in it).
    """
    return " ".join(text.split())


def _where(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(recipe)"


def _check_names(recipe: Recipe, registry: Registry) -> list[str]:
    """Problems a schema cannot see: names and values that the installed plugins refuse."""
    from routetune.composer import resolve_route
    from routetune.route import parse_route

    problems: list[str] = []

    def check(where: str, call: Any) -> Any:
        try:
            return call()
        except RoutetuneError as e:  # the field path already names the parameter
            field = where.rsplit(".", 1)[-1]
            problems.append(f"{where}: {str(e).removeprefix(f'parameter {field!r}: ')}")
            return None

    check("backend.name", lambda: registry.backend(recipe.backend.name))
    check("search.strategy", lambda: registry.strategy(recipe.search.strategy))
    for i, spec in enumerate(recipe.seasonings or []):
        cls = check(f"seasonings[{i}].name", lambda spec=spec: registry.seasoning(spec.name))
        if cls is None:
            continue
        for name, values in spec.params.items():
            where = f"seasonings[{i}].params.{name}"
            param = check(where, lambda name=name, cls=cls: cls.info.param(name))
            for raw in values if param is not None else []:
                value = tuple(raw) if isinstance(raw, list) else raw
                if check(where, lambda p=param, v=value: p.check(v)) is None:
                    break
    for i, text in enumerate(recipe.routes):
        check(f"routes[{i}]", lambda text=text: resolve_route(parse_route(text), registry))
    for i, text in enumerate(recipe.base):
        route = check(f"base[{i}]", lambda text=text: resolve_route(parse_route(text),
                                                                     registry))
        for step in route or ():
            if registry.seasoning(step.name).info.stage == "build":
                problems.append(f"base[{i}]: '{step.name}' is a build seasoning; put build "
                                "options in [backend.options]")
    return problems


def _upgrade_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A version-1 winner recipe as version 2: its route pinned, nothing searched.

    A table that is not a table (``model = "m.onnx"``) is passed on as it is, for the
    schema to name it.
    """
    def table(name: str, keys: tuple[str, ...]) -> Any:
        value = doc.get(name, {})
        return {k: v for k, v in value.items() if k in keys} if isinstance(
            value, dict) else value

    def entry(name: str, key: str, default: Any) -> Any:
        value = doc.get(name, {})
        return value.get(key, default) if isinstance(value, dict) else value

    return {"schema_version": 2, "model": table("model", ("path", "example", "sha256")),
            "backend": {"name": entry("backend", "name", "onnxruntime")},
            "routes": [entry("route", "text", "base")], "seasonings": [],
            "accuracy": {"expr": entry("accuracy", "expr", None)},
            "inputs": table("inputs", ("path", "shapes")),
            "result": doc.get("result")}


def recipe_options(recipe: Recipe, path: Path) -> dict[str, Any]:
    """The `TuneOptions` fields a recipe sets; relative paths from the recipe's folder."""
    here = path.parent

    def rel(p: str | None) -> Path | None:
        return None if p is None else (here / p if not Path(p).is_absolute() else Path(p))

    from routetune.measure import MeasureSettings

    accuracy = recipe.accuracy.expr
    per_output = ",".join(f"{name}:{expr}" for name, expr in recipe.accuracy.outputs.items())
    if per_output:
        accuracy = f"{accuracy},{per_output}" if accuracy else per_output
    space = {s.name: {k: tuple(tuple(v) if isinstance(v, list) else v for v in values)
                      for k, values in s.params.items()} for s in recipe.seasonings or []}
    out: dict[str, Any] = {
        "model": rel(recipe.model.path), "example": recipe.model.example,
        "model_sha256": recipe.model.sha256,
        "backend": recipe.backend.name, "backend_options": dict(recipe.backend.options),
        "base": tuple(recipe.base), "routes": tuple(recipe.routes),
        "seasonings": None if recipe.seasonings is None else tuple(
            s.name for s in recipe.seasonings),
        "space": space, "search": recipe.search.strategy,
        "beam_width": recipe.search.beam_width, "max_depth": recipe.search.max_depth,
        "max_trials": recipe.search.max_trials, "time_budget_s": recipe.search.time_budget_s,
        "measure": MeasureSettings(min_runs=recipe.measure.min_runs,
                                   min_time_s=recipe.measure.min_time_s),
        "min_speedup": recipe.measure.min_speedup,
        "busy_machine": recipe.measure.busy_machine,
        "inputs": rel(recipe.inputs.path), "shapes": recipe.inputs.shapes,
        "min_shapes": recipe.inputs.min_shapes, "opt_shapes": recipe.inputs.opt_shapes,
        "max_shapes": recipe.inputs.max_shapes, "output": rel(recipe.output),
    }
    if accuracy:
        out["accuracy"] = accuracy
    return out


def write_winner_recipe(path: Path, run: Prepared, result: TuneResult,
                        opts: TuneOptions) -> Path:
    """Write the winning route as a version-2 recipe that pins it and searches nothing.

    ``routetune build --recipe`` rebuilds exactly that engine from it, and ``routetune
    tune --recipe`` re-measures it against the base route.

    Returns:
        `path`.
    """
    winner = result.winner
    model: dict[str, Any] = {"sha256": run.model.source_sha256}
    model.update({k: str(v) for k, v in run.source.items() if k in ("path", "example")})
    inputs = {k: v for k, v in run.source.items() if k == "shapes"}
    inputs.update({k: v for k, v in (("min_shapes", opts.min_shapes),
                                     ("max_shapes", opts.max_shapes)) if v})
    if "inputs" in run.source:
        inputs = {"path": run.source["inputs"]}
    measured: dict[str, Any] = {"status": winner.status, "reason": result.winner_reason,
                                "device": winner.device,
                                "speedup": round(result.winner_speedup, 4)}
    confirmed = result.confirmed
    if confirmed is not None:  # the confirmation's own p50, never the search's
        measured["p50_ms"] = round(confirmed.latency.p50, 4)
        measured["speedup_ci"] = [round(confirmed.paired.ci_low, 4),
                                  round(confirmed.paired.ci_high, 4)]
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "backend": {"name": run.backend.name, "options": dict(opts.backend_options)},
        "base": list(opts.base),
        "seasonings": [],
        "routes": [winner.route],
        "search": {"strategy": "exhaustive", "max_depth": 0},
        "accuracy": {"expr": run.constraint.text},
        "measure": {"min_runs": opts.measure.min_runs, "min_time_s": opts.measure.min_time_s,
                    "min_speedup": opts.min_speedup, "busy_machine": opts.busy_machine},
        "inputs": inputs,
        "output": os.path.relpath(run.outdir, path.parent),
        "result": measured,
    }
    path.write_text(tomli_w.dumps(_drop_empty(doc)))
    return path


def _drop_empty(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v not in ({}, None) and not (
        k == "base" and v == [])}

