"""A recipe's problems: the schema's, worded, and those only the installed plugins see.

`routetune.run.recipe.load_recipe` reports them all at once, one per line.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from routetune.errors import RoutetuneError
from routetune.options import OptionError

if TYPE_CHECKING:
    from routetune.registry import Registry


def schema_problem(error: Any, fields: Sequence[str]) -> str:
    """A schema error's message; an unknown field gets the closest of `fields`."""
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1)
        return "unknown field" + (f"; did you mean '{close[0]}'?" if close else "")
    if error["type"] == "bool_type":
        return f"{error['input']!r} is not a boolean; write true or false (TOML, unquoted)"
    return str(error["msg"]).removeprefix("Value error, ")


def field_path(loc: tuple[Any, ...]) -> str:
    """A schema error's location as the recipe writes it: ``seasonings[2].params.x``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(recipe)"


class _AnyOutput(tuple[str, ...]):
    """Output names before the model is read: every name is one (checked later)."""

    def __contains__(self, name: object) -> bool:
        return True


def plugin_problems(doc: dict[str, Any], registry: Registry) -> list[str]:
    """Problems a schema cannot see: names and values that the installed plugins refuse.

    It reads the TOML document itself, so that a recipe that the schema refuses gets
    these problems in the same message; a field of the wrong type is the schema's.
    """
    from routetune.routes.composer import resolve_route
    from routetune.routes.route import parse_route

    problems: list[str] = []

    def check(where: str, call: Any) -> Any:
        try:
            return call()
        except RoutetuneError as e:  # the field path already names the parameter
            field = where.rsplit(".", 1)[-1]
            text = e.rest.strip() if isinstance(e, OptionError) else str(e)
            problems.append(f"{where}: {text.removeprefix(f'parameter {field!r}: ')}")
            return None

    def table(name: str) -> dict[str, Any]:
        value = doc.get(name)
        return value if isinstance(value, dict) else {}

    def texts(name: str) -> list[tuple[int, str]]:
        value = doc.get(name)
        return [(i, t) for i, t in enumerate(value) if isinstance(t, str)] if isinstance(
            value, list) else []

    expr = table("accuracy").get("expr")
    if isinstance(expr, str):
        from routetune.judging.accuracy import parse_accuracy

        check("accuracy.expr", lambda: parse_accuracy(expr, registry, _AnyOutput()))
    backend, strategy = table("backend").get("name"), table("search").get("strategy")
    if isinstance(backend, str):
        check("backend.name", lambda: registry.backend(backend))
    if isinstance(strategy, str):
        check("search.strategy", lambda: registry.strategy(strategy))
    seasonings = doc.get("seasonings")
    for i, spec in enumerate(seasonings if isinstance(seasonings, list) else []):
        name = spec.get("name") if isinstance(spec, dict) else None
        cls = check(f"seasonings[{i}].name",
                    lambda name=name: registry.seasoning(name)) if isinstance(name, str) else None
        params = spec.get("params") if cls is not None else None
        for param_name, values in (params.items() if isinstance(params, dict) else ()):
            where = f"seasonings[{i}].params.{param_name}"
            param = check(where, lambda n=param_name, cls=cls: cls.info.param(n))
            for raw in values if param is not None and isinstance(values, list) else []:
                value = tuple(raw) if isinstance(raw, list) else raw
                if check(where, lambda p=param, v=value: p.check(v)) is None:
                    break
    for i, text in texts("routes"):
        check(f"routes[{i}]", lambda text=text: resolve_route(parse_route(text), registry))
    for i, text in texts("base"):
        route = check(f"base[{i}]", lambda text=text: resolve_route(parse_route(text),
                                                                     registry))
        for step in route or ():
            if registry.seasoning(step.name).info.stage == "build":
                problems.append(f"base[{i}]: '{step.name}' is a build seasoning; put build "
                                "options in [backend.options]")
    return problems
