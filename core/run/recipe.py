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
- ``[search]``: ``strategy``, ``options`` (the strategy's own, e.g. ``{ beam_width = 4
  }``), ``beam_width`` (its shorthand), ``max_depth``, ``max_trials``, ``time_budget_s``,
  ``memory`` (the route memory file, relative to the recipe, or ``off``).
- ``[accuracy]``: ``expr`` (the ``--accuracy`` expression) and ``[accuracy.outputs]``,
  an expression per output name.
- ``[measure]``: ``min_runs``, ``min_time_s``, ``latency``, ``min_speedup``,
  ``confirm_repeats``, ``busy_machine``.
- ``[decoder]``: ``objective`` (``decode`` or ``prefill``), ``cache_tokens``,
  ``prompt_tokens``, ``generate_tokens``, ``tokens`` (a file, relative to the recipe):
  a KV-cache decoder's phase and the input sets made for it (`routetune.feeds.decoder`).
- ``[libraries]``: ``custom_ops``: custom-op libraries (paths relative to the recipe, or
  ``onnxruntime-extensions``) registered with every ONNX Runtime session; ``plugins``:
  TensorRT plugin libraries (`routetune.libraries`).
- ``[executor]``: ``name`` (``local`` or ``ray``) and ``ray_address``: where trials run
  (`routetune.plugins.ray.pool`).

The tables other than ``[model]``'s validator, ``[[seasonings]]`` and ``[accuracy]
outputs`` are made from the option declarations (`routetune.run.run_spec.RunSpec`).
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from routetune.errors import UsageError, one_line
from routetune.libraries import CUSTOM_OPS, EXTENSIONS, KINDS, PLUGINS, records
from routetune.options import OptionError, OptionInfo, Source, build, option_named, options_of
from routetune.run.recipe_problems import field_path, plugin_problems, schema_problem
from routetune.run.run_spec import RunSpec, defaults

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from routetune.registry import Registry
    from routetune.run.preparation import Prepared
    from routetune.run.tuning import TuneResult

SCHEMA_VERSION = 2
Value = bool | int | float | str | list[Any]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ModelTable(_Table):
    """``[model]``: exactly one of ``path`` and ``example``."""

    @model_validator(mode="after")
    def _one_source(self) -> _ModelTable:
        if (getattr(self, "path", None) is None) == (getattr(self, "example", None) is None):
            raise ValueError("give exactly one of path and example")
        return self


class _AccuracyTable(_Table):
    """``[accuracy]``: one expression, and expressions per output name."""

    outputs: dict[str, str] = Field(default_factory=dict,
                                    description="an accuracy expression per output name")


class SeasoningSpec(_Table):
    """One ``[[seasonings]]`` entry: a seasoning and the values to try per parameter."""

    name: str
    params: dict[str, list[Value]] = Field(
        default_factory=dict, description="per parameter, the values the search tries")


HAND_WRITTEN = ("seasonings", "seasonings.params")
"""Recipe fields of options that `Recipe` declares itself (an array of tables)."""


def _recipe_type(info: OptionInfo) -> Any:
    """The TOML value type of an option: paths as strings, tuples as arrays."""
    if info.meta.choices:
        return Literal[info.meta.choices]  # type: ignore[valid-type]
    text = str(info.type)
    optional = "None" in text
    if "Path" in text:
        kind: Any = str
    elif text.startswith("tuple["):
        kind = list[str]
    elif "Mapping" in text:
        kind = dict[str, Value]
    else:
        return info.type
    return kind | None if optional else kind


def _field(info: OptionInfo) -> tuple[Any, Any]:
    """A pydantic field from an option: its type, default, bounds and help."""
    default = info.default
    if isinstance(default, tuple):
        default = list(default)
    kwargs: dict[str, Any] = {"description": info.meta.help, "title": info.name}
    if "float" in str(info.type):  # NaN and inf are not numbers a bound can hold
        kwargs["allow_inf_nan"] = False
    if info.type is bool or str(info.type) == "bool":  # TOML has true and false: "yes"
        kwargs["strict"] = True  # or 1 is a mistake, not a boolean
    if info.meta.minimum is not None:
        kwargs["ge"] = info.meta.minimum
    if info.meta.above is not None:
        kwargs["gt"] = info.meta.above
    if isinstance(default, (dict, list)):
        return _recipe_type(info), Field(default_factory=type(default), **kwargs)
    return _recipe_type(info), Field(default, **kwargs)


def _table(name: str, base: type[_Table] = _Table) -> Any:
    """The pydantic model of table `name`, with a field per option declared in it."""
    fields: dict[str, Any] = {
        info.meta.recipe.split(".")[1]: _field(info) for info in options_of(RunSpec)
        if info.meta.recipe and info.meta.recipe.startswith(f"{name}.")
        and info.meta.recipe not in HAND_WRITTEN}
    return create_model(f"{name.capitalize()}Spec", __base__=base, **fields)


ModelSpec = _table("model", _ModelTable)
BackendSpec = _table("backend")
SearchSpec = _table("search")
AccuracySpec = _table("accuracy", _AccuracyTable)
MeasureSpec = _table("measure")
DecoderSpec = _table("decoder")
InputsSpec = _table("inputs")
ExecutorSpec = _table("executor")
LibrariesSpec = _table("libraries")
_TOP: dict[str, Any] = {info.meta.recipe: _field(info) for info in options_of(RunSpec)
        if info.meta.recipe in ("base", "routes", "output", "keep")}


class _Recipe(_Table):
    model_config = ConfigDict(extra="forbid", title="routetune recipe")
    schema_version: Literal[2]
    model: ModelSpec  # type: ignore[valid-type]
    backend: BackendSpec = Field(default_factory=BackendSpec)  # type: ignore[valid-type]
    seasonings: list[SeasoningSpec] | None = Field(
        None, description="the seasonings to consider; left out: every applicable one")
    search: SearchSpec = Field(default_factory=SearchSpec)  # type: ignore[valid-type]
    accuracy: AccuracySpec = Field(default_factory=AccuracySpec)  # type: ignore[valid-type]
    measure: MeasureSpec = Field(default_factory=MeasureSpec)  # type: ignore[valid-type]
    inputs: InputsSpec = Field(default_factory=InputsSpec)  # type: ignore[valid-type]
    decoder: DecoderSpec = Field(default_factory=DecoderSpec)  # type: ignore[valid-type]
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)  # type: ignore[valid-type]
    libraries: LibrariesSpec = Field(default_factory=LibrariesSpec)  # type: ignore[valid-type]
    result: dict[str, Any] | None = Field(None, description="written by winner recipes")


Recipe: Any = create_model("Recipe", __base__=_Recipe, **_TOP)
"""A route recipe, schema version 2 (see the module documentation); its tables and
fields come from `routetune.run.run_spec.RunSpec`'s option declarations."""


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema (what ``routetune schema`` prints)."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://routetune.dev/schema/recipe-{SCHEMA_VERSION}.json"
    return schema


def load_recipe(path: Path, registry: Registry) -> Any:
    """Read, upgrade (version 1) and validate a recipe against the schema and the plugins.

    Raises:
        UsageError: Unreadable TOML, or field-level problems: one in one line, e.g.
            ``r.toml: seasonings[2].params.op_types_to_exclude: unknown op type 'Softmx'``;
            several as ``r.toml: 3 problems`` with each in `UsageError.problems`.
    """
    if path.exists() and not path.is_file():  # a FIFO or a device: reading it never ends
        raise OptionError("recipe", f" {path}: not a regular file")
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise OptionError("recipe", f" {path}: no such file") from e
    except RecursionError as e:  # tomllib recurses per nested array or inline table
        raise OptionError("recipe", f" {path}: not a readable TOML file (arrays or tables "
                          "nested too deeply)") from e
    except (OSError, ValueError) as e:  # TOMLDecodeError, UnicodeDecodeError, int digits
        raise OptionError("recipe", f" {path}: not a readable TOML file ({one_line(e)})") from e
    if doc.get("schema_version") == 1:
        doc = _upgrade_v1(doc)
    try:
        recipe = Recipe.model_validate(doc)
    except ValidationError as e:
        problems = [f"{field_path(err['loc'])}: {schema_problem(err, _field_names())}"
                    for err in e.errors()]
        recipe = None
    else:
        problems = []
    problems += [p for p in plugin_problems(doc, registry)  # a field the schema refused
                 if not any(p.split(":")[0] == q.split(":")[0] for q in problems)]
    if problems:
        raise UsageError(f"{path}: {len(problems)} problem{'s' * (len(problems) != 1)}",
                         [_one_line(p) for p in problems]) if len(problems) > 1 else (
            UsageError(_one_line(f"{path}: {problems[0]}")))
    return recipe


def _field_names() -> list[str]:
    """Every field name of every recipe table (the JSON Schema's properties)."""
    schema = json_schema()
    tables = [schema, *schema.get("$defs", {}).values()]
    return sorted({name for t in tables for name in t.get("properties", {})})


def _one_line(text: str) -> str:
    """`text` with every run of whitespace, line breaks included, as one space.

    Problems quote the recipe's values (a route text with a line break in it).
    """
    return " ".join(text.split())


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


def recipe_values(recipe: Any, path: Path) -> dict[str, Any]:
    """The options a recipe sets, by name: the fields it writes, none of the defaults.

    Paths are taken from the recipe's folder; arrays become tuples. ``[[seasonings]]``
    gives ``seasonings`` (the names) and ``space`` (their parameter values);
    ``[accuracy]`` gives one ``accuracy`` expression, per-output terms appended.
    """
    here = path.parent
    out: dict[str, Any] = {}
    for info in options_of(RunSpec):
        where = info.meta.recipe
        if where is None or where in HAND_WRITTEN:
            continue
        table, _, key = where.rpartition(".")
        holder = getattr(recipe, table) if table else recipe
        if key not in holder.model_fields_set:
            continue
        value = getattr(holder, key)
        if isinstance(value, str) and "Path" in str(info.type):
            value = here / value if not Path(value).is_absolute() else Path(value)
        elif info.name == "memory" and value not in ("off", "") \
                and not Path(value).is_absolute():
            value = str(here / value)  # a file, as the recipe's other paths
        elif info.name in ("custom_op_libraries", "plugin_libraries"):
            value = tuple(v if v == EXTENSIONS or Path(v).is_absolute() else str(here / v)
                          for v in value)
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = dict(value)
        out[info.name] = value
    per_output = ",".join(f"{name}:{expr}" for name, expr in recipe.accuracy.outputs.items())
    if per_output:
        expr = out.get("accuracy")
        out["accuracy"] = f"{expr},{per_output}" if expr else per_output
    if recipe.seasonings is not None:
        out["seasonings"] = tuple(s.name for s in recipe.seasonings)
        out["space"] = {s.name: {k: tuple(tuple(v) if isinstance(v, list) else v
                                          for v in values) for k, values in s.params.items()}
                        for s in recipe.seasonings}
    return out


def write_winner_recipe(path: Path, run: Prepared, result: TuneResult,
                        opts: RunSpec) -> Path:
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
    made = opts.decoder  # a decoder's sets, made again from these by the recipe's run
    decoder = {"objective": made.objective, "cache_tokens": made.cache_tokens,
               "prompt_tokens": made.prompt_tokens, "generate_tokens": made.generate_tokens,
               **({"tokens": str(made.tokens.resolve())} if made.tokens else {})
               } if "decoder" in run.source else {}
    measured: dict[str, Any] = {"status": winner.status, "reason": result.winner_reason,
                                "device": winner.device,
                                "speedup": round(result.winner_speedup, 4)}
    for kind, listed in records(run.libraries).items():  # what was loaded, with hashes
        if listed:
            measured[{CUSTOM_OPS: "custom_op_libraries", PLUGINS: "plugin_libraries"}[kind]] = (
                listed)
    if run.saved_reference is not None:  # what the winner was judged against
        measured["reference_outputs"] = run.saved_reference.record()
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
        "accuracy": {"expr": run.constraint.text, **(
            {"reference_outputs": str(run.saved_reference.path)}
            if run.saved_reference is not None else {})},
        "measure": {"min_runs": opts.measure.min_runs, "min_time_s": opts.measure.min_time_s,
                    "latency": opts.measure.latency,
                    "min_speedup": opts.min_speedup, "busy_machine": opts.busy_machine,
                    "confirm_repeats": opts.confirm_repeats},
        "inputs": inputs,
        "decoder": decoder,
        "output": os.path.relpath(run.outdir, path.parent),
        "libraries": {kind: [lib.named if lib.named == EXTENSIONS else str(lib.path)
                             for lib in run.libraries if lib.kind == kind] for kind in KINDS},
        "result": measured,
    }
    path.write_text(tomli_w.dumps(_drop_empty(doc)))
    return path


def _drop_empty(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v not in ({}, None) and not (
        k == "base" and v == []) and not (k == "libraries" and not any(v.values()))}


def merge(given: Mapping[str, Any], entry: Source, registry: Registry) -> RunSpec:
    """One `RunSpec` from the options given and the recipe among them.

    Each option takes, in order of precedence: the value given (on the command line
    or as a keyword), the recipe's, the default. ``space`` is merged per parameter and
    ``search_options`` per option;
    ``seasonings`` given drops the recipe's spaces of seasonings left out; a model or
    example given replaces the recipe's model and its sha256.

    Args:
        given: Option name → value, for the options the user gave (not the defaults).
        entry: The front end that gave them (``cli`` or ``api``).
        registry: The installed plugins, to validate the recipe against.

    Raises:
        UsageError: The recipe does not validate (one line, field by field).
    """
    values = defaults()
    sources: dict[str, Source] = {}
    recipe = given.get("recipe")
    if recipe is not None:
        try:
            from_recipe = recipe_values(load_recipe(recipe, registry), recipe)
        except OptionError as e:  # the recipe file itself: named as the user gave it
            raise UsageError(option_named(RunSpec, e.option).spelled(entry) + e.rest) from e
        values.update(from_recipe)
        sources.update(dict.fromkeys(from_recipe, "recipe"))
    for name, value in given.items():
        if name == "space":
            value = _merged_space(values["space"], value)
        elif name == "search_options":  # per option, as --space is per parameter
            value = {**values["search_options"], **value}
        values[name] = value
        sources[name] = entry
    if recipe is not None and "seasonings" in given and values["seasonings"] is not None:
        keep = set(values["seasonings"])  # the recipe's spaces of seasonings left out go
        values["space"] = {k: v for k, v in values["space"].items() if k in keep}
    if recipe is not None and ("model" in given or "example" in given):
        values["model"], values["example"] = given.get("model"), given.get("example")
        values["model_sha256"] = None  # the recipe's hash is of its own model
    return build(RunSpec, {**values, "sources": sources, "entry": entry})


def _merged_space(recipe: Mapping[str, Mapping[str, tuple[Any, ...]]],
                  given: Mapping[str, Mapping[str, tuple[Any, ...]]]
                  ) -> dict[str, dict[str, tuple[Any, ...]]]:
    out = {k: dict(v) for k, v in recipe.items()}
    for name, params in given.items():
        out.setdefault(name, {}).update(params)
    return out

