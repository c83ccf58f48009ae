"""Seasonings: the passes a route is made of.

A seasoning is a class with a frozen `SeasoningInfo` and an `apply` method. Graph and
precision seasonings rewrite the onnx-graphsurgeon graph in `RouteState.graph` in place;
build seasonings set namespaced backend options in `RouteState.settings`. Both return a
`PassResult` (torch.fx and onnx_ir's pass result, plus MLIR-style statistics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, final

from routetune.errors import PluginError, UsageError
from routetune.stash import Stash

if TYPE_CHECKING:
    from pathlib import Path

    import onnx
    import onnx_graphsurgeon as gs

    from routetune.backend import Backend
    from routetune.refinement import Refinement

logger = logging.getLogger(__name__)

Stage = Literal["graph", "precision", "build"]
STAGES: tuple[Stage, ...] = ("graph", "precision", "build")
"""The fixed phase order of a route: every graph step runs before every precision step,
and every precision step before every build step."""

ParamValue = bool | int | float | str | tuple


@dataclass(frozen=True)
class Param:
    """One parameter of a seasoning: a finite set of choices the search enumerates.

    Args:
        name: The parameter's name, as written in route text (``level`` in
            ``ort-opt-level{level=basic}``).
        choices: The values the search tries, in order.
        default: The value used when a route names the seasoning without this parameter.
        help: One line for ``routetune seasonings``.
        allowed: More values a route may pin that the search does not try by default
            (slow or rarely useful ones); empty means any value of the default's type.
        finest: For a quantizer's parameter, the choice whose quantization grid is at
            least as fine as every other's on every tensor (per-channel scales against
            one per tensor; an asymmetric range against a symmetric one): where a route
            with it fails the accuracy constraint, the same route with another choice
            is not built (`routetune.search.coarser`). None: no such order.
    """

    name: str
    choices: tuple[ParamValue, ...]
    default: ParamValue
    help: str = ""
    allowed: tuple[ParamValue, ...] = ()
    finest: ParamValue | None = None

    def check(self, value: ParamValue) -> ParamValue:
        """Return `value` if this parameter takes it.

        A value outside `choices` is accepted when it is in `allowed`, or, with no
        `allowed` list, when it has the default's type, so that a hand-written route can
        pin a value the search does not enumerate.

        Raises:
            UsageError: The value has the wrong type, is not among the allowed values,
                or (for a parameter named ``*op_type*``) names an op type ONNX does not
                define (``onnx.defs.has``).
        """
        if isinstance(value, tuple) and "op_type" in self.name:
            import onnx

            unknown = [op for op in value if not onnx.defs.has(str(op))]
            if unknown:
                raise UsageError(f"parameter '{self.name}': unknown op type '{unknown[0]}'")
        if value in self.choices or value == self.default or value in self.allowed:
            return value
        if self.allowed:
            known = "|".join(str(c) for c in dict.fromkeys((*self.choices, *self.allowed)))
            raise UsageError(f"parameter '{self.name}': {value!r} is not one of {known}")
        expected = type(self.default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if type(value) is not expected:
            wanted = "a list, written [a,b]" if expected is tuple else expected.__name__
            raise UsageError(
                f"parameter '{self.name}': {value!r} is a {type(value).__name__}, "
                f"expected {wanted}; choices: {_choices_text(self)}"
            )
        return value


def _choices_text(param: Param) -> str:
    return "|".join(str(c) for c in param.choices)


@dataclass(frozen=True)
class SeasoningInfo:
    """What the composer and the CLI know about a seasoning, without running it.

    Args:
        name: Unique kebab-case name, used in routes, the CLI and the trial store.
        stage: ``graph``, ``precision`` or ``build``; a fixed phase order.
        summary: One line for ``routetune seasonings``.
        params: The parameter space; each parameter a finite set of choices.
        requires: Seasonings that must be in a route that holds this one.
        conflicts: Seasonings that may not be in the same route.
        after: Seasonings of the same stage that must run before this one when both are
            present (a soft order).
        before: Seasonings of the same stage that must run after this one when both are
            present.
        backends: Names of the backends this seasoning applies to; empty means all.
        searched: Whether strategies enumerate it. False for a seasoning the search
            loop adds by itself, such as ``precision-repair`` after an accuracy failure.
    """

    name: str
    stage: Stage
    summary: str
    params: tuple[Param, ...] = ()
    requires: frozenset[str] = frozenset()
    conflicts: frozenset[str] = frozenset()
    after: frozenset[str] = frozenset()
    before: frozenset[str] = frozenset()
    backends: frozenset[str] = frozenset()
    searched: bool = True

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise PluginError(f"seasoning '{self.name}': unknown stage '{self.stage}'")
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise PluginError(f"seasoning name {self.name!r} must be kebab-case")
        if self.name == "base":
            raise PluginError("'base' is reserved for the route with no seasonings")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise PluginError(f"seasoning '{self.name}': duplicate parameter names {names}")
        for p in self.params:
            if not p.choices:
                raise PluginError(f"seasoning '{self.name}': parameter '{p.name}' has no choices")

    def param(self, name: str) -> Param:
        """Return the parameter called `name`.

        Raises:
            UsageError: No such parameter.
        """
        for p in self.params:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.params) or "none"
        raise UsageError(f"seasoning '{self.name}' has no parameter '{name}'; known: {known}")

    def defaults(self) -> dict[str, ParamValue]:
        """Return every parameter's default value, by name."""
        return {p.name: p.default for p in self.params}


@dataclass(frozen=True)
class PassResult:
    """What one seasoning did to a route's state.

    Args:
        modified: Whether the graph or the settings changed. "Nothing to rewrite" is
            ``modified=False``, never an exception.
        stats: Small counts, such as ``{"fused": 12}``.
        note: Free text for the trial record.
    """

    modified: bool
    stats: Mapping[str, int] = field(default_factory=dict)
    note: str = ""


@dataclass
class RouteState:
    """The state a route's seasonings act on.

    Args:
        graph: The model being rewritten, as an onnx-graphsurgeon graph; None while only
            build seasonings run (the search does not import the graph for them).
        settings: Backend build options, keyed by namespaced option name
            (``onnxruntime.graph_optimization_level``); checked against the backend's
            option schema before the build.
        stash: What a step leaves for later steps of the route, by typed key
            (`routetune.stash`): a precision seasoning's `Lowering` for
            ``precision-repair``, for instance.
    """

    graph: gs.Graph | None
    settings: dict[str, Any] = field(default_factory=dict)
    stash: Stash = field(default_factory=Stash)

    def model_graph(self) -> gs.Graph:
        """`graph`, for a graph or precision seasoning (the search imports it for them).

        Raises:
            RuntimeError: No graph: a build-stage state (a bug in the caller).
        """
        if self.graph is None:
            raise RuntimeError("no graph in this route state: only build seasonings run here")
        return self.graph


@dataclass(frozen=True)
class RouteContext:
    """Read-only facts a seasoning may use while it runs.

    Args:
        backend: The backend the route is built for.
        feeds: The validation inputs, one mapping of input name to array per set; they
            double as calibration data for precision seasonings.
        applied: The route text of the steps already applied.
        evaluate: Runs an ONNX model in FP32 on the CPU (ONNX Runtime, optimisations
            off) on every set of `feeds` and yields all its outputs, one mapping per
            set, each when it is asked for (a caller that reduces one before asking for
            the next holds one set's intermediates at a time). Precision seasonings
            use it to read activation ranges. None where no reference runtime is
            available. It takes models with external data too.
        run_on_device: Runs an ONNX model on the backend's device with its default
            settings (`Backend.run_on_device`) on every set of `feeds`; all outputs, one
            mapping per set, as `evaluate` yields them. For a model the reference
            cannot run (bfloat16 on ONNX Runtime's CPU provider). Raises
            `BackendError` where the backend cannot.
        weights: For a model with external data (over 2 GiB, say), the folder its
            tensors' locations are relative to; None when the model holds its data. A
            pass that hands the model to another tool as a file loads the data from
            here (``onnx.load_external_data_for_model(model, weights)``) and saves it
            with ``save_as_external_data=True`` (`routetune.model.weights`).
    """

    backend: Backend
    feeds: tuple[Mapping[str, Any], ...] = ()
    applied: str = "base"
    evaluate: Callable[[onnx.ModelProto], Iterable[dict[str, Any]]] | None = None
    weights: Path | None = None
    run_on_device: Callable[[onnx.ModelProto], Iterable[dict[str, Any]]] | None = None


class Seasoning:
    """Base class of every seasoning.

    Subclasses set `info` and implement `apply`. Instances hold only their parameters:
    no state between calls and no module globals, so they can be pickled to a worker.

    Args:
        params: Parameter values by name; missing ones take their defaults.

    Raises:
        UsageError: An unknown parameter or a value of the wrong type.
    """

    info: ClassVar[SeasoningInfo]
    refinement: ClassVar[type[Refinement] | None] = None
    """What the search does with this seasoning after each batch, when it is offered
    (`routetune.refinement`); None for most seasonings."""

    def __init__(self, params: Mapping[str, ParamValue] | None = None) -> None:
        values = self.info.defaults()
        for name, value in (params or {}).items():
            values[name] = self.info.param(name).check(value)
        self.params: Mapping[str, Any] = values  # each checked by its Param: a ParamValue

    def supports(self, backend: Backend) -> str | None:
        """Return why this seasoning can never apply on `backend`, whatever the model.

        ``routetune seasonings`` shows it per backend. The default checks
        `SeasoningInfo.backends`.
        """
        if self.info.backends and backend.name not in self.info.backends:
            return f"applies only to backends {', '.join(sorted(self.info.backends))}"
        return None

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Return why this seasoning cannot apply to `graph` on `backend`, or None.

        It must be cheap: it runs once per seasoning before the search. The backend
        filter (`supports`) is applied before it, by `why_not`, whatever an override
        does. The default: applicable to every graph.
        """
        return None

    @final
    def why_not(self, graph: gs.Graph | None, backend: Backend) -> str | None:
        """Why this seasoning is not offered here, or None: the template the search calls.

        `supports` (the backend filter) first, then, with a graph, `applicable`.
        """
        return self.supports(backend) or (
            self.applicable(graph, backend) if graph is not None else None)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Rewrite `state.graph` in place (graph, precision) or set `state.settings` (build).

        Raises:
            Exception: Anything a seasoning raises is caught by the search and recorded
                as the candidate's ``build-failed`` reason.
        """
        raise NotImplementedError

    def __call__(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Apply the seasoning and check that it kept to its contract.

        Raises:
            PluginError: `apply` returned something other than a `PassResult`, or
                replaced the graph instead of rewriting it in place.
        """
        graph = state.graph
        result = self.apply(state, ctx)
        if not isinstance(result, PassResult):
            raise PluginError(
                f"seasoning '{self.info.name}' returned {type(result).__name__}, "
                "expected a PassResult"
            )
        if state.graph is not graph:
            raise PluginError(
                f"seasoning '{self.info.name}' replaced the graph; rewrite it in place"
            )
        logger.debug("%s: modified=%s %s", self.info.name, result.modified, dict(result.stats))
        return result
