"""The ``name-unknown-dims`` seasoning: each ``?`` dimension gets a name of its own.

Paddle2ONNX writes unknown dimensions as the dimension parameter ``?``. In ONNX, and
in TensorRT's parser, dimensions that share a name must have the same size, so an input
``x[-1,3,?,?]`` fed 48x192 contradicts itself; TensorRT then fails the build ("Input
dimensions with this name have different constant values"). Renaming keeps the meaning
the exporter had: unknown and independent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from routetune.backend import Backend

PLACEHOLDERS = frozenset({"?"})
"""Dimension parameters that mean "unknown", not a shared size."""


class NameUnknownDims(Seasoning):
    """Rename every ``?`` dimension of every tensor to ``<tensor>_dim<i>``."""

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="name-unknown-dims", stage="graph", searched=False,
        backends=frozenset({"tensorrt"}),
        summary="TensorRT preflight: give each '?' dimension its own name")

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """`supports`, whatever the model."""
        return self.supports(backend)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Rename the placeholder dimensions of `state.graph` in place."""
        renamed = 0
        for name, tensor in state.graph.tensors().items():
            shape = getattr(tensor, "shape", None)
            if not shape or not any(d in PLACEHOLDERS for d in shape):
                continue
            tensor.shape = [f"{name}_dim{i}" if d in PLACEHOLDERS else d
                            for i, d in enumerate(shape)]
            renamed += sum(d in PLACEHOLDERS for d in shape)
        return PassResult(modified=bool(renamed), stats={"renamed": renamed})
