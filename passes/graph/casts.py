"""Cast hygiene shared by the rewrites: bypass a copying node, drop redundant Casts.

Two Cast patterns are legal ONNX that rewrites must not leave behind (issue 14, kind 6):
a Cast to the type its input already has, which ONNX Runtime's optimiser has been seen
to break on (onnxruntime#32416), and two Casts of one tensor to one type, which do the
same work twice. `tidy_casts` removes both; `routetune.model.postconditions.cast_faults` finds them.
"""

from __future__ import annotations

from collections import Counter

import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import dtype_to_onnx

from routetune.passes.graph.constants import constant_value, onnx_dtype

__all__ = ["bypass", "replace_input", "tidy_casts"]


def bypass(graph: gs.Graph, node: gs.Node) -> bool:
    """Disconnect `node`, which copies ``inputs[0]`` to ``outputs[0]``; False if it must stay.

    Consumers of the output read the input instead. When the output is a graph output,
    the input's producer writes the graph output's tensor instead, so the model's
    signature stays; a node whose input is a graph input, an initializer or another
    graph output stays (False).
    """
    src, dst = node.inputs[0], node.outputs[0]
    graph_outputs = {id(t) for t in graph.outputs}
    if id(dst) not in graph_outputs:
        node.inputs.clear()
        node.outputs.clear()
        replace_input(dst, src)
        return True
    if len(src.inputs) != 1 or id(src) in graph_outputs:
        return False  # a graph input, an initializer or a graph output: keep the signature
    producer = src.inputs[0]
    node.inputs.clear()
    node.outputs.clear()
    replace_input(src, dst)
    index = next(i for i, t in enumerate(producer.outputs) if t is src)
    producer.outputs[index] = dst
    return True


def replace_input(old: gs.Tensor, new: gs.Tensor) -> None:
    """Make every consumer of `old` read `new` instead."""
    for consumer in list(old.outputs):
        for i, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[i] = new


def tidy_casts(graph: gs.Graph) -> Counter[str]:
    """Remove same-type Casts and merge Casts of one tensor to one type, in place.

    Only the top-level graph's Cast nodes are looked at; consumers inside subgraphs are
    rewired with the rest. A Cast whose input type is unknown is left alone. Removed
    nodes are disconnected; call ``graph.cleanup()`` afterwards.

    Returns:
        ``same_type_casts`` and ``duplicate_casts`` removed (zero counts omitted).
    """
    removed: Counter[str] = Counter()
    first: dict[tuple[int, int], gs.Node] = {}
    graph_outputs = {id(t) for t in graph.outputs}
    for node in list(graph.nodes):
        if node.op != "Cast" or not node.inputs or not node.outputs:
            continue
        src, to = node.inputs[0], node.attrs.get("to")
        if _elem_type(src) == to:
            if bypass(graph, node):
                removed["same_type_casts"] += 1
            continue
        kept = first.setdefault((id(src), to), node)
        if kept is not node and id(node.outputs[0]) not in graph_outputs:
            dst = node.outputs[0]
            node.inputs.clear()
            node.outputs.clear()
            replace_input(dst, kept.outputs[0])
            removed["duplicate_casts"] += 1
    return removed


def _elem_type(tensor: gs.Tensor) -> int | None:
    value = constant_value(tensor)
    if value is not None:
        return dtype_to_onnx(value.dtype)
    return onnx_dtype(tensor)
