"""Build seasonings that only set backend options, declared as data.

Most build seasonings set one or a few namespaced backend options and nothing else
(``ort-threads`` sets ``onnxruntime.intra_op_num_threads``). `option_seasoning` declares
one from its `SeasoningInfo` and the options it sets; a value is fixed, or taken from a
parameter (`FromParam`). Whether the backend knows every key is checked once per run,
before the search (`check_option_keys`), so a misspelled key fails at the start and not
mid-search; a key the installed backend version lacks makes the seasoning not
applicable, with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from routetune.errors import PluginError
from routetune.seasoning import (
    ParamValue,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from routetune.backend import Backend
    from routetune.registry import Registry


def set_options(state: RouteState, values: Mapping[str, object]) -> PassResult:
    """Set backend options in `state.settings`; ``modified`` when any value changed.

    What every build seasoning does: its options are namespaced by backend
    (``onnxruntime.intra_op_num_threads``) and checked against the backend's option
    schema before the build (`routetune.backend.Backend.full_settings`).
    """
    changed = {k: v for k, v in values.items() if state.settings.get(k) != v}
    state.settings.update(values)
    return PassResult(modified=bool(changed), stats={"options": len(changed)})


@dataclass(frozen=True)
class FromParam:
    """An option value taken from one of the seasoning's parameters.

    Args:
        param: The parameter's name.
        convert: Applied to the parameter's value (``str``, or ``True`` to ``"1"``);
            None: the value as it is.
    """

    param: str
    convert: Callable[[ParamValue], Any] | None = None


class OptionSeasoning(Seasoning):
    """A build seasoning that sets backend options and nothing else (`option_seasoning`).

    Attributes:
        sets: Option key to its value: a fixed value or a `FromParam`.
        ops: Operator types of which the model must hold one for the options to
            matter (``Conv`` for a convolution algorithm); empty: any model.
    """

    sets: ClassVar[Mapping[str, Any]]
    ops: ClassVar[frozenset[str]] = frozenset()

    def values(self) -> dict[str, Any]:
        """The option values this step sets, by namespaced key."""
        out = {}
        for key, value in self.sets.items():
            if isinstance(value, FromParam):
                raw = self.params[value.param]
                value = value.convert(raw) if value.convert is not None else raw
            out[key] = value
        return out

    def supports(self, backend: Backend) -> str | None:
        """Why not: another backend, or an option the installed backend does not know."""
        reason = super().supports(backend)
        if reason:
            return reason
        known = backend.options()
        missing = [key for key in self.sets if key not in known]
        if missing:
            return (f"the installed {backend.version()} does not know "
                    f"{', '.join(missing)} (an older version?)")
        return None

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: the model holds none of `ops`."""
        if self.ops and not any(node.op in self.ops for node in graph.nodes):
            return f"no {' or '.join(sorted(self.ops))} in the model"
        return None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the options."""
        return set_options(state, self.values())


def option_seasoning(class_name: str, info: SeasoningInfo, sets: Mapping[str, Any],
                     doc: str, ops: frozenset[str] = frozenset()) -> type[OptionSeasoning]:
    """Declare a seasoning that sets backend options.

    Bind the result to `class_name` at module level (``OrtThreads = option_seasoning(
    "OrtThreads", ...)``): workers and the contract kit pickle instances by that name.

    Args:
        class_name: The class's name, as bound in the calling module.
        info: Name, stage ``build``, summary, parameters and backends.
        sets: Option key to a fixed value or a `FromParam`.
        doc: The docstring: what it sets, and the option's meaning with its source.
        ops: Operator types of which the model must hold one (`OptionSeasoning.ops`).

    Raises:
        PluginError: The stage is not ``build``, nothing is set, or a `FromParam` names
            a parameter that `info` lacks.
    """
    if info.stage != "build" or not sets:
        raise PluginError(f"seasoning '{info.name}': an option seasoning has stage build "
                          "and sets at least one option")
    for key, value in sets.items():
        if isinstance(value, FromParam) and value.param not in {p.name for p in info.params}:
            raise PluginError(f"seasoning '{info.name}': option '{key}' is taken from "
                              f"parameter '{value.param}', which it does not have")
    module = sys._getframe(1).f_globals.get("__name__", __name__)
    return type(class_name, (OptionSeasoning,), {
        "info": info, "sets": MappingProxyType(dict(sets)), "__doc__": doc, "ops": ops,
        "__module__": module, "__qualname__": class_name})


def check_option_keys(registry: Registry, backend: Backend) -> None:
    """Check every option seasoning offered for `backend` against its option keys.

    Raises:
        PluginError: A seasoning sets a key that `backend` never accepts
            (`routetune.backend.Backend.option_keys`): a typo in its plugin; one line
            naming the seasoning, the plugin and the key.
    """
    keys = backend.option_keys()
    for name, entry in registry.seasonings.items():
        if not registry.offered_for(name, backend.name):
            continue  # another backend's (a lazy one is not made for this check)
        cls = entry.item
        if not issubclass(cls, OptionSeasoning) or Seasoning.supports(cls(), backend):
            continue  # not an option seasoning, or not one for this backend
        unknown = sorted(set(cls.sets) - keys)
        if unknown:
            raise PluginError(
                f"seasoning '{name}' of plugin '{entry.plugin}' sets option "
                f"'{unknown[0]}', which backend '{backend.name}' does not have; fix the "
                f"plugin, or disable it with ROUTETUNE_DISABLE_PLUGINS={entry.plugin}")
