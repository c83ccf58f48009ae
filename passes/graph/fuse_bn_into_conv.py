"""The ``fuse-bn-into-conv`` seasoning: fold inference BatchNormalization into Conv."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import (
    constant_value,
    remove_orphan_constant_nodes,
    taken_names,
    unique_name,
)
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

__all__ = ["FuseBnIntoConv"]

logger = logging.getLogger(__name__)

DEFAULT_DOMAINS = ("", "ai.onnx", None)


class FuseBnIntoConv(Seasoning):
    """Fold ``BatchNormalization`` into the ``Conv`` that feeds it.

    With ``s = scale / sqrt(var + epsilon)`` (ONNX BatchNormalization-15, inference),
    ``BN(Conv(x, W, b)) = Conv(x, W * s[:, None, ...], (b - mean) * s + B)``. The scale
    lies on axis 0 of ``W`` (output channels, ``(M, C/group, k...)``), so grouped and
    depthwise convolutions fuse the same way. The arithmetic is done in float64 and cast
    back to ``W``'s dtype, so a variance of 1e8 (PP-OCRv4 detector) gives finite,
    accurate weights.

    Rewrite rules:

    1. A ``Conv`` whose output feeds only a ``BatchNormalization`` and is not a graph
       output, where the BN is in inference form (one output, ``training_mode`` 0 or
       absent, ``spatial`` 1 or absent), matches.
    2. ``W``, ``b`` (if present) and the BN's ``scale``, ``B``, ``mean`` and ``var`` must
       be constants: initializers or ``Constant`` node outputs (the PP-OCR models keep
       every weight in ``Constant`` nodes). The four BN vectors must have ``M``
       elements.
    3. The Conv gets new initializers ``W'`` and ``b'`` (the old ones may be shared with
       other nodes and are left as they are), then writes the BN's output tensor, so the
       output's name, dtype and shape stay. The BN node is removed.
    4. ``Constant`` nodes that fed only the rewritten nodes are removed.
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="fuse-bn-into-conv",
        stage="graph",
        summary="fold inference BatchNormalization into the preceding Conv's weights",
        after=frozenset({"fold-constants"}),
    )

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Return a reason unless some BatchNormalization reads a Conv's output."""
        reason = super().applicable(graph, backend)
        if reason is not None:
            return reason
        for node in graph.nodes:
            if node.op == "BatchNormalization" and node.inputs:
                producers = node.inputs[0].inputs
                if len(producers) == 1 and producers[0].op == "Conv":
                    return None
        return "no Conv -> BatchNormalization pair"

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Fuse every matching Conv -> BatchNormalization pair of `state.graph` in place."""
        graph = state.model_graph()
        taken = taken_names(graph)
        graph_outputs = {id(t) for t in graph.outputs}
        removed: set[int] = set()
        former_inputs: list[gs.Tensor] = []
        for bn in graph.nodes:
            conv = _match(bn, graph_outputs)
            if conv is None:
                continue
            fused = _fused_params(conv, bn)
            if fused is None:
                continue
            weight, bias = fused
            former_inputs.extend([*conv.inputs[1:], *bn.inputs[1:]])
            w_name = unique_name(f"{conv.inputs[1].name}_bn", taken)
            b_name = unique_name(f"{bn.outputs[0].name}_conv_bias", taken)
            y = bn.outputs[0]
            bn.inputs.clear()
            bn.outputs.clear()
            while len(conv.inputs) > 1:  # gs.Node.inputs does not support slice assignment
                conv.inputs.pop()
            conv.inputs.extend([gs.Constant(w_name, weight), gs.Constant(b_name, bias)])
            conv.outputs[0] = y
            removed.add(id(bn))
        if removed:
            graph.nodes = [n for n in graph.nodes if id(n) not in removed]
            remove_orphan_constant_nodes(graph, former_inputs)
        return PassResult(modified=bool(removed), stats={"fused": len(removed)})


def _match(bn: gs.Node, graph_outputs: set[int]) -> gs.Node | None:
    """Return the Conv that `bn` can be fused into, or None."""
    if bn.op != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
        return None
    if len(bn.inputs) != 5 or len([t for t in bn.outputs if not t.is_empty()]) != 1:
        return None
    if bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1:
        return None
    x = bn.inputs[0]
    if len(x.inputs) != 1 or len(x.outputs) != 1 or id(x) in graph_outputs:
        return None
    conv = x.inputs[0]
    if conv.op != "Conv" or conv.domain not in DEFAULT_DOMAINS or len(conv.outputs) != 1:
        return None
    return conv


def _fused_params(conv: gs.Node, bn: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """Return the fused ``(W', b')``, or None when an input is not a usable constant."""
    if len(conv.inputs) < 2:
        return None
    w = constant_value(conv.inputs[1])
    has_bias = len(conv.inputs) > 2 and not conv.inputs[2].is_empty()
    b = constant_value(conv.inputs[2]) if has_bias else None
    scale, offset, mean, var = (constant_value(t) for t in bn.inputs[1:5])
    if w is None or w.ndim < 3 or not np.issubdtype(w.dtype, np.floating):
        return None
    m = w.shape[0]
    if has_bias and (b is None or b.shape != (m,)):
        return None
    bn_params = (scale, offset, mean, var)
    if any(p is None or p.size != m for p in bn_params):
        return None
    scale, offset, mean, var = (np.asarray(p, dtype=np.float64).reshape(m) for p in bn_params)
    b64 = np.zeros(m) if b is None else b.astype(np.float64)
    epsilon = float(bn.attrs.get("epsilon", 1e-5))
    s = scale / np.sqrt(var + epsilon)
    weight = w.astype(np.float64) * s.reshape((m,) + (1,) * (w.ndim - 1))
    bias = (b64 - mean) * s + offset
    return weight.astype(w.dtype), bias.astype(w.dtype)
