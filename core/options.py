"""One declaration per option: the command line, recipes, the API and errors follow it.

An option is a dataclass field declared with `option`: its name (the API keyword), its
type annotation and default are the field's; its help, command-line flag, recipe field
and bounds are the field's metadata. `options_of` reads them back, walking into nested
option groups (`routetune.timing.measure.MeasureSettings`). From that one table:

- the CLI builds its typer parameters (`routetune.cli`);
- the recipe model builds its pydantic tables, and so the JSON Schema
  (`routetune.run.recipe`);
- the API checks keyword types (`check_keyword`);
- every source's value is checked against the bounds (`problem`);
- an `OptionError` names the option as the user wrote it (`OptionInfo.spelled`): the
  flag on the command line, the field in a recipe, the keyword in Python.

The same machinery declares a search strategy's own options
(`routetune.search.strategy.Strategy.Options`).
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from routetune.errors import UsageError

Source = Literal["cli", "recipe", "api"]
"""Where a value was written: the command line, a recipe, or a Python keyword."""


@dataclass(frozen=True)
class OptionMeta:
    """What an option declares besides its name, type and default (see `option`)."""

    help: str
    flag: str | None = ""
    recipe: str | None = None
    minimum: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()
    commands: tuple[str, ...] = ("tune",)
    argument: bool = False
    cli_type: Any = None
    from_cli: Callable[[Any], Any] | None = None
    from_keyword: Callable[[Any], Any] | None = None
    group: bool = False


def option(default: Any = MISSING, *, help: str, default_factory: Any = MISSING,  # noqa: A002
           **meta: Any) -> Any:
    """A dataclass field that is a user-facing option.

    Args:
        default: The default value (or give `default_factory`).
        default_factory: Makes the default value (a dict, a dataclass).
        help: One line for ``--help``, the JSON Schema and the docs.
        **meta: `OptionMeta` fields:

            - ``flag``: the command-line flag; ``""`` (default) derives it from the
              name (`flag_for`); None: not on the command line.
            - ``recipe``: the recipe field as ``table.key`` (``search.max_trials``) or
              ``key``; None: never in a recipe.
            - ``minimum`` / ``above``: the value must be ``>=`` / ``>`` this (and
              finite, for floats).
            - ``choices``: the strings allowed.
            - ``commands``: the CLI commands that take it (``tune``, ``build``).
            - ``argument``: a positional command-line argument, not a flag.
            - ``cli_type`` and ``from_cli``: the command line's type and its parser
              into the field's value (``--seasonings a,b`` into a tuple).
            - ``from_keyword``: the API's conversion (a string into a `Path`).
            - ``group``: the field is a dataclass of further options (flattened).
    """
    info = {"option": OptionMeta(help=help, **meta)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=info)
    return field(default=default, metadata=info)


def flag_for(name: str) -> str:
    """The flag an option of this name gets by default.

    ``time_budget_s`` gives ``--time-budget``: a unit suffix is left out, and the help
    names the unit.
    """
    for suffix in ("_s", "_mb"):
        name = name.removesuffix(suffix)
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class OptionInfo:
    """One option, read back from its declaration.

    Args:
        name: The API keyword (the field's name).
        path: Field names from the top dataclass to this one (``("measure",
            "min_runs")`` for a grouped option).
        type: The resolved type annotation.
        default: The default value (from the default factory where there is one).
        meta: The declaration.
    """

    name: str
    path: tuple[str, ...]
    type: Any
    default: Any
    meta: OptionMeta

    @property
    def flag(self) -> str | None:
        """The command-line flag, or None when the option is not on the command line."""
        return flag_for(self.name) if self.meta.flag == "" else self.meta.flag

    @property
    def recipe_field(self) -> str | None:
        """The recipe field as a message names it: ``[search] max_trials``, ``output``."""
        if self.meta.recipe is None:
            return None
        table, _, key = self.meta.recipe.rpartition(".")
        if "seasonings" in (table, key):  # an array of tables
            return f"[[seasonings]] {key}" if table else "[[seasonings]]"
        return f"[{table}] {key}" if table else key

    def spelled(self, source: Source, recipe: Path | None = None) -> str:
        """The option as the user wrote it, for messages.

        ``--max-trials`` (cli), ``r.toml [search] max_trials`` (recipe) or
        ``routetune.tune(max_trials=...)`` (api); an option that one source lacks is
        spelled as the next.
        """
        if source == "recipe" and self.recipe_field is not None:
            return f"{recipe} {self.recipe_field}" if recipe else self.recipe_field
        if source == "cli" and self.flag is not None and not self.meta.argument:
            return self.flag.split("/")[0]  # --fresh/--resume: the option is --fresh
        if source == "cli" and self.meta.argument:
            return self.name.upper()
        return f"routetune.tune({self.name}=...)"


@cache
def options_of(cls: type) -> tuple[OptionInfo, ...]:
    """The options a dataclass declares with `option`, grouped ones flattened, in order."""
    hints = typing.get_type_hints(cls)
    out: list[OptionInfo] = []
    for f in fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        if meta.group:
            out.extend(OptionInfo(o.name, (f.name, *o.path), o.type, o.default, o.meta)
                       for o in options_of(hints[f.name]))
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(OptionInfo(f.name, (f.name,), hints[f.name], default, meta))
    return tuple(out)


def option_named(cls: type, name: str) -> OptionInfo:
    """The option `name` of `cls` (a `KeyError` if it has none)."""
    for info in options_of(cls):
        if info.name == name:
            return info
    raise KeyError(name)


class OptionError(UsageError):
    """Bad input in one option, worded after the option's name.

    The text after the name (`rest`) is the same wherever the value came from; the
    entry point that knows the source rewords the name (`RunSpec.reword`). Until then
    the message names the default flag: ``--max-trials 0: must be 1 or more``.

    Args:
        option: The option's name (its API keyword).
        rest: The message after the option's name, starting with a space or a colon.
    """

    def __init__(self, option: str, rest: str) -> None:
        super().__init__(flag_for(option) + rest)
        self.option = option
        self.rest = rest


def problem(info: OptionInfo, value: Any) -> str | None:
    """What is wrong with `value` for this option's bounds and choices; None when fine.

    Types are checked where the value is written (the command-line parser, the recipe
    schema, `check_keyword`); this checks what all sources share.
    """
    meta = info.meta
    if value is None:
        return None
    if meta.choices and value not in meta.choices:
        return f"give one of {', '.join(meta.choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    bound = (f"more than {meta.above:g}" if meta.above is not None else
             f"{meta.minimum:g} or more" if meta.minimum is not None else "")
    if not math.isfinite(value):
        return f"must be a finite number {bound}".rstrip()
    if (meta.minimum is not None and value < meta.minimum) or (
            meta.above is not None and value <= meta.above):
        return f"must be {bound}"
    return None


def check_keyword(info: OptionInfo, value: Any) -> Any:
    """`value` as given to the Python API, converted (`from_keyword`) and type-checked.

    Raises:
        UsageError: The value is not of the option's type, e.g.
            ``routetune.tune(max_trials=...): 'ten' must be int or None``.
    """
    if value is None:
        return None
    want = _runtime_types(info.type)
    names = " or ".join(_NAMES.get(t, t.__name__) for t in want if t is not type(None)
                        and not (t is int and float in want))  # "a number" takes ints
    if info.meta.from_keyword is not None:
        try:
            value = info.meta.from_keyword(value)
        except (TypeError, ValueError) as e:  # seasonings=5: not names at all
            raise UsageError(f"{info.spelled('api')}: {value!r} must be {names}") from e
    ok = isinstance(value, want) and (bool in want or not isinstance(value, bool))
    if not ok:
        raise UsageError(f"{info.spelled('api')}: {value!r} must be {names}")
    return value


_NAMES: dict[type, str] = {Path: "a path (str or Path)", Mapping: "a dict", tuple: "a list",
                           float: "a number"}
"""How a type is named to a Python user, where its class name would puzzle."""


def _runtime_types(annotation: Any) -> tuple[type, ...]:
    """The classes `isinstance` checks for an annotation (``float`` takes ``int``)."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        out: tuple[type, ...] = ()
        for arg in typing.get_args(annotation):
            out += _runtime_types(arg)
        return out
    if annotation is type(None):
        return (type(None),)
    if origin is Literal:
        return tuple({type(a) for a in typing.get_args(annotation)})
    if origin is not None:
        return (Mapping,) if origin in (dict, Mapping) or (
            isinstance(origin, type) and issubclass(origin, Mapping)) else (origin,)
    if annotation is float:
        return (float, int)
    return (annotation,) if isinstance(annotation, type) else (object,)


def values_of(instance: Any) -> dict[str, Any]:
    """An option dataclass as option name → value, grouped options flattened."""
    out: dict[str, Any] = {}
    cls: type = type(instance)
    for info in options_of(cls):
        value = instance
        for part in info.path:
            value = getattr(value, part)
        out[info.name] = value
    return out


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An option dataclass from option name → value (grouped options regrouped).

    Names not given take their defaults; fields that are not options are passed on
    as given.
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        meta = f.metadata.get("option")
        if meta is not None and meta.group:
            inner = {o.name: values[o.name] for o in options_of(hints[f.name])
                     if o.name in values}
            kwargs[f.name] = build(hints[f.name], inner) if is_dataclass(
                hints[f.name]) else inner
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)
