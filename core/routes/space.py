"""Restricted parameter spaces: the values a search tries for chosen parameters.

``--space SEASONING:PARAM=V1|V2`` replaces a parameter's own choices with the values
listed, like trtexec's ``--tuneBuildRoutes="-knob=[a|b]"``. It is the only way to search
an open-ended parameter (an unbounded TensorRT knob); a bounded one may only be
narrowed to values it allows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from routetune.errors import UsageError
from routetune.options import OptionError
from routetune.registry import Registry
from routetune.routes.route import parse_value
from routetune.seasoning import SeasoningInfo

Space = dict[str, dict[str, tuple[Any, ...]]]


def parse_space(terms: Iterable[str]) -> Space:
    """Parse ``SEASONING:PARAM=V1|V2`` terms; values as in route text (``[Softmax,Pow]``).

    Raises:
        UsageError: A term is not ``seasoning:param=values``, or repeats a parameter.
    """
    space: Space = {}
    for term in terms:
        name, _, rest = term.partition(":")
        param, eq, values = rest.partition("=")
        name, param = name.strip(), param.strip()
        if not name or not param or not eq or not values.strip():
            raise OptionError("space", f" '{term}': write SEASONING:PARAM=VALUE1|VALUE2, e.g. "
                              "trt-opt-level:level=4|5")
        texts = [v.strip() for v in values.split("|")]
        if not all(texts):
            raise OptionError("space", f" '{term}': an empty value; separate values with one '|'")
        choices = tuple(parse_value(v, f"--space '{term}'") for v in texts)
        if param in space.setdefault(name, {}):
            raise OptionError("space", f" '{term}': parameter '{param}' of '{name}' given twice")
        space[name][param] = choices
    return space


def restrict_space(
    infos: Sequence[SeasoningInfo], space: Mapping[str, Mapping[str, tuple[Any, ...]]],
    not_applicable: Mapping[str, str], registry: Registry,
) -> list[SeasoningInfo]:
    """The offered seasonings with the parameter choices of `space` in place of their own.

    Raises:
        UsageError: An unknown or not offered seasoning, an unknown parameter, or a
            value the parameter does not take.
    """
    offered = {info.name: info for info in infos}
    for name in space:
        registry.seasoning(name)  # an unknown name fails here, naming the known ones
        if name not in offered:
            why = not_applicable.get(name, "not in --seasonings")
            raise OptionError("space", f" {name}: this seasoning is not offered here ({why})")
    out = []
    for info in infos:
        changes = space.get(info.name, {})
        params = []
        for p in info.params:
            values = changes.get(p.name)
            if values is not None:
                try:
                    values = tuple(dict.fromkeys(p.check(v) for v in values))
                except UsageError as e:
                    raise OptionError("space", f" {info.name}:{p.name}: {e}") from e
                p = dataclasses.replace(p, choices=values)
            params.append(p)
        for unknown in set(changes) - {p.name for p in info.params}:
            info.param(unknown)  # raises, naming the known parameters
        out.append(dataclasses.replace(info, params=tuple(params)) if changes else info)
    return out
