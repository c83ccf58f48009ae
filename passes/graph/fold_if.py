"""The ``fold-if`` seasoning: an ``If`` whose condition is constant becomes its branch.

Exporters leave shape checks as ``If`` nodes (``if x.shape[0] == 1: ...``). Once shapes
are known the condition is a constant, and TensorRT would otherwise build both branches
as a conditional. Shapes are known where the model fixes a dimension or the
optimisation profile gives it one size (min = max).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from routetune.model.weights_check import resolving_in
from routetune.passes.graph.constants import (
    copy_graph,
    inferred_types,
    taken_names,
    unique_name,
)
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend
    from routetune.feeds.profile import ShapeProfile


class FoldIf(Seasoning):
    """Replace each ``If`` with a constant condition by the nodes of the branch taken.

    1. The condition is evaluated on a copy of the graph whose inputs take every size
       the model or the profile fixes, with onnx-graphsurgeon's ``fold_constants``
       (shapes folded; ONNX Runtime evaluates the constant part; ``flatten_subgraphs``
       off, so that the rest of the graph is left to ``fold-constants``).
    2. For each ``If`` in the main graph whose condition folded to a constant, the
       taken branch's nodes move into the main graph and each branch output feeds the
       matching ``If`` output through an ``Identity``; the ``If`` is removed.
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="fold-if", stage="graph", searched=False, backends=frozenset({"tensorrt"}),
        summary="TensorRT preflight: inline If nodes whose condition is constant")

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """`supports`; a graph without ``If`` is left as it is."""
        return self.supports(backend)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Fold the constant ``If`` nodes of `state.graph` in place."""
        graph = state.model_graph()
        ifs = [n for n in graph.nodes if n.op == "If"]
        if not ifs:
            return PassResult(modified=False, stats={"folded": 0, "if_nodes": 0})
        with resolving_in(ctx.weights):  # ONNX Runtime reads external data from there
            conds = _conditions(graph, getattr(ctx.backend, "profile", None))
        taken = {}
        for node in ifs:
            value = conds.get(node.inputs[0].name)
            if value is not None and value.size == 1:
                taken[id(node)] = bool(value.reshape(()))
        names = taken_names(graph)
        for node in ifs:
            if id(node) in taken:
                inline_branch(graph, node, taken[id(node)], names)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        return PassResult(modified=bool(taken), stats={"folded": len(taken),
                                                       "if_nodes": len(ifs)})


def inline_branch(graph: gs.Graph, node: gs.Node, cond: bool, names: set[str]) -> None:
    """Replace the ``If`` `node` of `graph` by the nodes of the branch `cond` takes, in place.

    Each branch output feeds the matching ``If`` output through an ``Identity``, so a
    branch output that no branch node produces (a constant, or a value of an outer
    graph) stays bound. (onnx-graphsurgeon's own ``flatten_subgraphs`` rebinds only
    outputs that a branch node produces, and leaves the others without a producer.)
    The nodes are appended; sort `graph` afterwards.

    Args:
        graph: The graph that holds `node` (the main graph or a subgraph).
        node: An ``If`` node.
        cond: The value of its condition.
        names: Names in use (`taken_names`), for the ``Identity`` nodes; updated.
    """
    branch = node.attrs["then_branch" if cond else "else_branch"]
    graph.nodes.extend(branch.nodes)
    outs = list(node.outputs)
    node.inputs.clear()
    node.outputs.clear()
    for inner, outer in zip(branch.outputs, outs, strict=True):
        graph.nodes.append(gs.Node("Identity", unique_name(f"{outer.name}_fold_if", names),
                                   inputs=[inner], outputs=[outer]))
    graph.nodes.remove(node)


def inline_constant_ifs(graph: gs.Graph, names: set[str] | None = None) -> int:
    """Inline every ``If`` whose condition is a constant, in `graph` and its subgraphs.

    Args:
        graph: The graph, changed in place; sort it afterwards.
        names: Names in use; `taken_names` of `graph` when None.

    Returns:
        How many ``If`` nodes were inlined.
    """
    names = taken_names(graph) if names is None else names
    count = sum(inline_constant_ifs(sub, names) for sub in graph.subgraphs())
    for node in [n for n in graph.nodes if n.op == "If"]:
        cond = node.inputs[0]
        if isinstance(cond, gs.Constant) and cond.values.size == 1:
            inline_branch(graph, node, bool(cond.values.reshape(())), names)
            count += 1
    return count


def _conditions(graph: gs.Graph, profile: ShapeProfile | None) -> dict[str, np.ndarray]:
    """The values of the ``If`` conditions that fold to constants, by tensor name."""
    copy = copy_graph(graph)
    fixed = profile.shapes if profile is not None else {}
    for tensor in copy.inputs:
        if tensor.name in fixed and tensor.shape is not None:
            low, _, high = fixed[tensor.name]
            tensor.shape = [lo if lo == hi else d
                            for d, lo, hi in zip(tensor.shape, low, high, strict=True)]
    copy.toposort()
    with inferred_types(copy):
        copy.fold_constants(partitioning="recursive", flatten_subgraphs=False)
    wanted = {n.inputs[0].name for n in graph.nodes if n.op == "If"}
    return {name: t.values for name, t in copy.tensors().items()
            if name in wanted and isinstance(t, gs.Constant)}
