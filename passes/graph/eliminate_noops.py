"""The ``eliminate-noops`` seasoning: remove nodes that copy their input to their output."""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from routetune.passes.graph.casts import bypass
from routetune.passes.graph.constants import (
    constant_value,
    infer,
    onnx_dtype,
    remove_orphan_constant_nodes,
)
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

__all__ = ["EliminateNoops"]

logger = logging.getLogger(__name__)

NOOP_OPS = ("Identity", "Dropout", "Cast")


class EliminateNoops(Seasoning):
    """Remove ``Identity``, inference-mode ``Dropout`` and same-type ``Cast`` nodes.

    Only the main graph is rewritten (not ``If``/``Loop`` bodies or functions), but
    consumers inside subgraphs that read a removed node's output are rewired too.

    Rewrite rules:

    1. ``Identity`` is a no-op.
    2. ``Dropout`` is a no-op in inference mode: its ``mask`` output is absent or unused
       (no consumer and not a graph output), and its ``training_mode`` input is absent
       or a constant false (an initializer or a ``Constant`` node). Before opset 7,
       ``is_test=1`` is required instead.
    3. ``Cast`` is a no-op when ``to`` equals the element type of its input, as the
       graph declares it or, failing that, as ONNX shape inference finds it.
    4. A no-op whose output is not a graph output is removed, and its consumers read
       its input instead.
    5. A no-op whose output is a graph output is removed by renaming: the producer of
       its input writes the graph output's name, and the input's other consumers read
       that tensor, so the output names, dtypes and shapes stay as they were.
    6. A no-op is kept when its output is a graph output and its input is a graph input,
       an initializer, or another graph output: removing it would change the model's
       signature. These count as ``kept`` in the stats.
    7. ``Constant`` nodes that fed only removed nodes (a ``Dropout`` ratio, say) are
       removed with them.
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="eliminate-noops",
        stage="graph",
        summary="remove Identity, inference-mode Dropout and same-type Cast",
        before=frozenset({"fold-constants"}),
    )

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Return a reason unless the graph has an Identity, Dropout or Cast node."""
        reason = super().applicable(graph, backend)
        if reason is not None:
            return reason
        if any(node.op in NOOP_OPS for node in graph.nodes):
            return None
        return "no Identity, Dropout or Cast node"

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Remove the no-op nodes of `state.graph` in place."""
        graph = state.model_graph()
        dtypes = _inferred_dtypes(graph)
        removed: dict[int, gs.Node] = {}
        former_inputs: list[gs.Tensor] = []
        stats: Counter[str] = Counter()
        for node in graph.nodes:
            if not _is_noop(graph, node, dtypes):
                continue
            inputs = list(node.inputs)
            if bypass(graph, node):
                removed[id(node)] = node
                former_inputs.extend(inputs)
                stats[node.op] += 1
            else:
                stats["kept"] += 1
        if removed:
            graph.nodes = [n for n in graph.nodes if id(n) not in removed]
            remove_orphan_constant_nodes(graph, former_inputs)
        return PassResult(modified=bool(removed), stats=dict(stats))


def _inferred_dtypes(graph: gs.Graph) -> dict[str, int]:
    """ONNX element types by tensor name, when some Cast's input declares none.

    Shape inference runs at most once, and before anything is rewritten: a graph with
    half-disconnected nodes would not export cleanly.
    """
    casts = (n for n in graph.nodes if n.op == "Cast" and n.inputs)
    if all(onnx_dtype(n.inputs[0]) is not None for n in casts):
        return {}
    inferred = infer(graph)
    if inferred is None:
        return {}
    dtypes = {name: onnx_dtype(t) for name, t in inferred.tensors().items()}
    return {name: dtype for name, dtype in dtypes.items() if dtype is not None}


def _is_noop(graph: gs.Graph, node: gs.Node, inferred: dict[str, int]) -> bool:
    if node.op not in NOOP_OPS or node.domain not in ("", "ai.onnx", None):
        return False
    if not node.inputs or not node.outputs or node.inputs[0].is_empty():
        return False
    if node.op == "Identity":
        return True
    if node.op == "Cast":
        src = node.inputs[0]
        dtype = onnx_dtype(src)
        return (dtype if dtype is not None else inferred.get(src.name)) == node.attrs.get("to")
    return _is_inference_dropout(graph, node)


def _is_inference_dropout(graph: gs.Graph, node: gs.Node) -> bool:
    if graph.opset < 7 and not node.attrs.get("is_test", 0):
        return False
    if len(node.outputs) > 1:
        mask = node.outputs[1]
        graph_outputs = {id(t) for t in graph.outputs}
        if not mask.is_empty() and (mask.outputs or id(mask) in graph_outputs):
            return False
    if len(node.inputs) > 2 and not node.inputs[2].is_empty():
        training = constant_value(node.inputs[2])
        return training is not None and not np.any(training)
    return True
