"""``trt-build-route``: TensorRT's Global Performance Tuner knobs as one seasoning.

The knobs are read from ``IBuilderConfig.all_build_routes`` when the TensorRT plugin
registers the seasoning (`build_route_seasoning`); nothing here imports TensorRT.

TensorRT 11.1 describes its build-route knobs as JSON (NvInfer.h, ``getAllBuildRoutes``)::

    {"tuner_version": "2.19.15",
     "tuner_options": [{"option": "-conv_use_long_w",
                        "allowed_values": "-conv_use_long_w=[on|off]",
                        "default_value": "on", "help": "..."}, ...]}

A knob is bounded when ``allowed_values`` lists its values in brackets separated by
``|``; any other form (an integer range, a free value) is open-ended, like trtexec's
``BuildRouteKnobDef.mIsBounded`` (samples/common/sampleTuning.h). A build route is
the knobs that differ from their defaults, written ``-name=value`` and separated by
spaces (the ``config.build_route`` format).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from routetune.errors import PluginError
from routetune.option_seasoning import set_options
from routetune.routes.route import parse_scalar
from routetune.seasoning import (
    Param,
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

NAME = "trt-build-route"
OPTION = "tensorrt.build_route"

_BOUNDED = re.compile(r"^-?[^=\s]+=\[([^\]]*)\]$")


@dataclass(frozen=True)
class Knob:
    """One build-route knob.

    Args:
        option: The knob as TensorRT spells it, with its dash (``-conv_use_long_w``).
        values: The allowed values of a bounded knob, read as route values (``on``,
            ``0``); empty for an open-ended knob.
        default: The default value.
        help: TensorRT's help text.
    """

    option: str
    values: tuple[ParamValue, ...]
    default: ParamValue
    help: str = ""

    @property
    def name(self) -> str:
        """The parameter name in route text: the option without its leading dash."""
        return self.option.lstrip("-")

    @property
    def bounded(self) -> bool:
        """Whether the knob has a closed list of values."""
        return bool(self.values)


@dataclass(frozen=True)
class KnobSet:
    """What ``all_build_routes`` held: the tuner's version and its knobs."""

    tuner_version: str
    knobs: tuple[Knob, ...]


def parse_knobs(doc: str) -> KnobSet:
    """Parse an ``all_build_routes`` JSON document.

    An empty document (TensorRT-RTX, Windows, TensorRT < 11.1) gives no knobs.

    Raises:
        PluginError: The document is not the JSON layout above.
    """
    if not doc.strip():
        return KnobSet("", ())
    try:
        data = json.loads(doc)
        knobs = []
        for entry in data.get("tuner_options", []):
            match = _BOUNDED.match(entry.get("allowed_values", "").strip())
            values = tuple(parse_scalar(v.strip()) for v in match.group(1).split("|")
                           if v.strip()) if match and "|" in match.group(1) else ()
            default = parse_scalar(str(entry["default_value"]).strip())
            knobs.append(Knob(entry["option"], values, default, entry.get("help", "")))
        return KnobSet(str(data.get("tuner_version", "")), tuple(knobs))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PluginError(f"config.all_build_routes is not the documented JSON layout: {e}") \
            from e


def route_text(knobs: Mapping[str, Knob], values: Mapping[str, ParamValue]) -> str:
    """The build route for knob values by parameter name; defaults left out.

    Returns:
        ``-name=value`` tokens in knob order, separated by spaces; "" for all defaults.
    """
    tokens = []
    for name, knob in knobs.items():
        value = values.get(name, knob.default)
        if value != knob.default:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            tokens.append(f"{knob.option}={text}")
    return " ".join(tokens)


def build_route_seasoning(knob_set: KnobSet, source: str) -> type[Seasoning]:
    """The ``trt-build-route`` seasoning for these knobs.

    Every knob is a parameter named as in `Knob.name`. A bounded knob's choices are its
    allowed values; an open-ended knob searches only its default, and takes other
    values only where a route pins them or ``--space trt-build-route:NAME=V1|V2``
    lists them (TensorRT's caveat: open ranges cannot be enumerated).

    Args:
        knob_set: The knobs, from `parse_knobs`.
        source: The TensorRT module and version they came from, for messages.
    """
    params = tuple(
        Param(k.name, k.values if k.bounded else (k.default,), k.default,
              " ".join(k.help.split())[:120], allowed=k.values)
        for k in knob_set.knobs)
    summary = (f"TensorRT build route: {len(params)} Global Performance Tuner knobs "
               f"(tuner {knob_set.tuner_version})" if params else
               "TensorRT build route (Global Performance Tuner knobs)")

    class TrtBuildRoute(Seasoning):
        """Sets ``IBuilderConfig.build_route`` from knob values that differ from defaults."""

        info = SeasoningInfo(name=NAME, stage="build", backends=frozenset({"tensorrt"}),
                             summary=summary, params=params)
        knobs: ClassVar[dict[str, Knob]] = {k.name: k for k in knob_set.knobs}

        def supports(self, backend: Backend) -> str | None:
            """Why not: another backend, or no knobs in this TensorRT."""
            reason = super().supports(backend)
            if reason or self.knobs:
                return reason
            return (f"{source} has no Global Performance Tuner (config.all_build_routes is "
                    "empty; it needs TensorRT >= 11.1 on Linux, not TensorRT-RTX); the "
                    "other trt-* build seasonings are offered")

        def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
            """`supports`, whatever the model."""
            return self.supports(backend)

        def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
            """Set ``tensorrt.build_route`` to the route text (`route_text`)."""
            return set_options(state, {OPTION: route_text(self.knobs, self.params)})

    return TrtBuildRoute
