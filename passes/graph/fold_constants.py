"""The ``fold-constants`` seasoning: evaluate constant subgraphs once, ahead of time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.errors import PostconditionError
from routetune.model.weights_check import resolving_in
from routetune.passes.graph.constants import (
    constant_node,
    inferred_types,
    normalize_constant_node,
    onnx_dtype,
    unique_name,
)
from routetune.passes.graph.fold_if import inline_constant_ifs
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

__all__ = ["FoldConstants"]

logger = logging.getLogger(__name__)


class FoldConstants(Seasoning):
    """Replace everything that depends only on constants by its value.

    Uses onnx-graphsurgeon's ``Graph.fold_constants`` (which evaluates the constant
    subgraph with ONNX Runtime on the CPU), then ``cleanup`` and ``toposort``.

    Rewrite rules, in order:

    1. A ``Constant`` node (in the graph, its subgraphs or its functions) with a
       ``value_float(s)`` or ``value_int(s)`` attribute gets a ``value`` tensor
       attribute of float32 or int64 instead. onnx-graphsurgeon reads those attributes
       with ``np.array``, which gives float64 (and int32 on Windows), and ONNX Runtime
       then refuses e.g. ``Mul(float, double)``.
    2. For the duration of the fold, intermediate tensors carry the dtypes and shapes
       of ONNX shape inference (``onnx.shape_inference.infer_shapes``, with data
       propagation). Without them onnx-graphsurgeon cannot fold ``Shape`` of an
       intermediate tensor, so a static ``Shape -> Gather -> Reshape`` chain survives.
       Afterwards the tensors that remain variables get back their declared types, so
       the pass adds no ``value_info`` of its own.
    3. Every ``Constant`` node becomes an initializer, and every node whose inputs are
       all constants (including ``Shape``, ``Gather``/``Slice`` of a ``Shape`` with
       static dims) becomes an initializer holding its output. Partitioning is
       ``recursive``: a node that ONNX Runtime cannot evaluate stays, and its
       constant inputs still fold. (``basic`` partitioning recurses without end on a
       single node that fails, in onnx-graphsurgeon 0.6.1; ``None`` folds nothing
       when any node fails.)
    4. Nodes and initializers that no graph output depends on are removed. Graph
       inputs are the model's signature and stay, with their names and dtypes, even
       when folding leaves them unused (``cleanup(remove_unused_graph_inputs=False)``):
       a caller that feeds them must still be able to. Initializer-backed inputs (an
       initializer also listed as a graph input, which ONNX Runtime treats as an
       overridable initializer, not as a user input) are removed from the inputs; the
       importer already drops them, this catches ones added later.
    5. An ``If`` whose condition folded to a constant, in the graph or a subgraph, is
       replaced by the branch it takes (`inline_constant_ifs`), and what the branch
       computes is folded again, until no such ``If`` is left. onnx-graphsurgeon's own
       ``flatten_subgraphs`` is off: it leaves a branch output that is a constant (or an
       outer value) without a producer, so the model is invalid (Silero VAD 6.2.3's
       nested decoder ``If``).
    6. The nodes are sorted topologically.

    The pass reports ``modified=False`` when the set of nodes (op, inputs, outputs) and
    the graph inputs are the same before and after; node order does not count.
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="fold-constants",
        stage="graph",
        summary="evaluate constant subgraphs ahead of time (onnx-graphsurgeon, ORT on CPU)",
        before=frozenset({"fuse-bn-into-conv"}),
    )

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Return a reason unless the graph has a Constant node, an initializer or a Shape."""
        reason = super().applicable(graph, backend)
        if reason is not None:
            return reason
        if any(node.op in ("Constant", "Shape") for node in graph.nodes):
            return None
        if any(isinstance(t, gs.Constant) for t in graph.tensors().values()):
            return None
        return "no constants to fold"

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Fold the constants of `state.graph` in place.

        Raises:
            PostconditionError: Folding produced a float64 initializer for a tensor that
                was not float64 before (ONNX Runtime would refuse the model).
        """
        graph = state.model_graph()
        before = _signature(graph)
        n_nodes = len(graph.nodes)
        normalized = sum(normalize_constant_node(n) for n in _all_nodes(graph))
        graph.inputs = [t for t in graph.inputs if not isinstance(t, gs.Constant)]
        sliced = _slice_shapes(graph)
        graph.toposort()
        with inferred_types(graph) as n_inferred:
            float64 = {name for name, t in graph.tensors().items() if _is_float64(t)}
            with resolving_in(ctx.weights):  # ONNX Runtime reads external data from there
                graph.fold_constants(partitioning="recursive", flatten_subgraphs=False)
                inlined = 0
                while count := inline_constant_ifs(graph):  # what they computed may fold
                    inlined += count
                    graph.toposort()
                    graph.fold_constants(partitioning="recursive", flatten_subgraphs=False)
        _unslice_shapes(sliced)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        leaks = sorted(
            name
            for name, t in graph.tensors().items()
            if isinstance(t, gs.Constant) and _is_float64(t) and name not in float64
        )
        if leaks:
            raise PostconditionError(
                f"fold-constants produced float64 initializers {leaks[:5]} from tensors "
                "that were not float64; a Constant attribute was read with the wrong dtype"
            )
        stats = {
            "removed_nodes": n_nodes - len(graph.nodes),
            "normalized_constants": normalized,
            "inferred_tensors": n_inferred,
            "inlined_ifs": inlined,
        }
        return PassResult(modified=_signature(graph) != before, stats=stats)


def _is_float64(tensor: gs.Tensor) -> bool:
    """Whether `tensor` is, or is produced by a ``Constant`` node holding, a float64."""
    node = constant_node(tensor)
    if node is not None and isinstance(node.attrs.get("value"), gs.Constant):
        tensor = node.attrs["value"]
    return onnx_dtype(tensor) == onnx.TensorProto.DOUBLE


def _slice_shapes(graph: gs.Graph) -> list[tuple[gs.Node, gs.Node]]:
    """Write each ``Shape`` with ``start``/``end`` as a plain ``Shape`` and a ``Slice``.

    onnx-graphsurgeon's shape folding reads ``Shape`` as the whole shape, whatever its
    ``start`` and ``end`` (opset 15): ``Shape(end=1)`` of a [3, 4, 5] tensor folded to
    [3, 4, 5] instead of [3] (onnx node test ``test_shape_end_1``). The ``Slice`` on
    axis 0 computes the same (both clamp ``start`` and ``end`` to [0, rank] after
    adding the rank to negative ones) and folds correctly.

    Returns:
        The (Shape, Slice) pairs made, for `_unslice_shapes`.
    """
    pairs = []
    graphs = [g for f in (graph, *graph.functions) for g in (f, *f.subgraphs(recursive=True))]
    for g in graphs:
        names = {n.name for n in g.nodes} | set(g.tensors())
        for node in [n for n in g.nodes if n.op == "Shape"]:
            start, end = node.attrs.get("start", 0), node.attrs.get("end")
            if start == 0 and end is None:
                continue
            out = node.outputs[0]
            whole = gs.Variable(unique_name(f"{out.name}_whole_shape", names), np.int64, None)
            node.attrs.pop("start", None)
            node.attrs.pop("end", None)
            node.outputs = [whole]
            bounds = [gs.Constant(unique_name(f"{out.name}_{what}", names),
                                  np.array([v], np.int64))
                      for what, v in (("start", start), ("end", INT64_MAX if end is None
                                                          else end), ("axis", 0))]
            cut = gs.Node("Slice", unique_name(f"{node.name}_slice", names),
                          inputs=[whole, *bounds], outputs=[out])
            g.nodes.append(cut)
            pairs.append((node, cut))
    return pairs


def _unslice_shapes(pairs: list[tuple[gs.Node, gs.Node]]) -> None:
    """Give back ``start``/``end`` to each `_slice_shapes` pair that did not fold."""
    for shape, cut in pairs:
        if not cut.outputs or not shape.outputs or cut.inputs[0] is not shape.outputs[0]:
            continue  # folded: the Slice is a constant now, cleanup removes the rest
        start, end = (int(t.values[0]) for t in cut.inputs[1:3])
        if start != 0:
            shape.attrs["start"] = start
        if end != INT64_MAX:
            shape.attrs["end"] = end
        shape.outputs = list(cut.outputs)
        cut.inputs.clear()
        cut.outputs.clear()


INT64_MAX = int(np.iinfo(np.int64).max)


def _all_nodes(graph: gs.Graph) -> Iterator[gs.Node]:
    """The nodes of `graph`, of its subgraphs and of its functions (which also fold)."""
    for g in (graph, *graph.functions):
        for sub in (g, *g.subgraphs(recursive=True)):
            yield from sub.nodes


def _signature(graph: gs.Graph) -> tuple[tuple[str, ...], list[tuple]]:
    """The graph inputs and the sorted (op, inputs, outputs) of every node, subgraphs too."""
    nodes = sorted(
        (n.op, tuple(t.name for t in n.inputs), tuple(t.name for t in n.outputs))
        for n in _all_nodes(graph)
    )
    return tuple(t.name for t in graph.inputs), nodes
