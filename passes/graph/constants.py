"""Helpers shared by the graph seasonings: constant values and inferred tensor types.

A weight reaches a node in one of two ways: as an initializer (a `gs.Constant` tensor)
or as the output of a ``Constant`` node. Exporters such as Paddle2ONNX write every weight
as a ``Constant`` node (the PP-OCR models have no initializers at all), so a seasoning
that needs a constant's value must accept both; `constant_value` does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import dtype_to_onnx

logger = logging.getLogger(__name__)

_CONSTANT_ATTR_DTYPES = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}
"""The scalar and list attributes of ``Constant`` and the ONNX dtype each one means
(ONNX operator spec, Constant-13: FLOAT and INT64)."""


def constant_node(tensor: gs.Tensor) -> gs.Node | None:
    """Return the ``Constant`` node (default domain) that produces `tensor`, or None."""
    if len(tensor.inputs) != 1:
        return None
    node = tensor.inputs[0]
    if node.op != "Constant" or node.domain not in ("", "ai.onnx", None):
        return None
    return node


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """Return the value of `tensor` when it is a constant, else None.

    Args:
        tensor: A `gs.Constant` (an initializer) or the output of a ``Constant`` node
            whose only attribute is ``value``, ``value_float(s)`` or ``value_int(s)``.

    Returns:
        The value as an array: float32 for ``value_float(s)`` and int64 for
        ``value_int(s)`` (never the float64 that ``np.array(2.0)`` would give); None for
        a variable, an empty optional input, or a ``Constant`` of another kind
        (``value_string``, ``sparse_value``, a function attribute reference).
    """
    if isinstance(tensor, gs.Constant):
        return tensor.values
    node = constant_node(tensor)
    if node is None or len(node.attrs) != 1:
        return None
    ((name, value),) = node.attrs.items()
    if name == "value" and isinstance(value, gs.Constant):
        return value.values
    if name in _CONSTANT_ATTR_DTYPES and not isinstance(value, gs.Node.AttributeRef):
        return np.array(value, dtype=_CONSTANT_ATTR_DTYPES[name])
    return None


def normalize_constant_node(node: gs.Node) -> bool:
    """Rewrite a ``Constant`` node's scalar or list attribute as a ``value`` tensor.

    ``Constant(value_float=2.0)`` becomes ``Constant(value=<float32 scalar>)``, and
    ``value_int(s)`` becomes an int64 tensor, so that anything reading the attribute
    with ``np.array`` gets the dtype ONNX specifies.

    Returns:
        Whether the node was rewritten.
    """
    if node.op != "Constant" or len(node.outputs) != 1 or len(node.attrs) != 1:
        return False
    if next(iter(node.attrs)) not in _CONSTANT_ATTR_DTYPES:
        return False
    value = constant_value(node.outputs[0])
    if value is None:
        return False
    node.attrs = {"value": gs.Constant(f"{node.outputs[0].name}_value", value)}
    return True


def onnx_dtype(tensor: gs.Tensor) -> int | None:
    """Return the ONNX element type (``onnx.TensorProto.FLOAT``, ...) of `tensor`, or None."""
    if tensor.dtype is None:
        return None
    return dtype_to_onnx(tensor.dtype)


def infer(graph: gs.Graph) -> gs.Graph | None:
    """Run ONNX shape inference on a copy of `graph` and import the result.

    `graph` itself is not changed. Tensors in the result carry the inferred dtype and
    shape under their original names.

    Returns:
        The inferred graph, or None when shape inference failed (logged at DEBUG); a
        seasoning then works with the types the graph already declares.
    """
    model = gs.export_onnx(graph, do_type_check=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as e:
        logger.debug("shape inference failed, using declared types only: %s", e)
        return None
    return gs.import_onnx(inferred)


@contextmanager
def inferred_types(graph: gs.Graph) -> Iterator[int]:
    """Give the graph's intermediate tensors their inferred dtypes and shapes for a while.

    Inside the block every `gs.Variable` that is neither a graph input nor a graph
    output carries the dtype and shape ONNX shape inference found for it. On exit, the
    tensors that are still variables get back what they declared before, so the block
    adds no ``value_info`` of its own to the exported model, except a dtype or shape
    that the block itself changed (``fp16`` making a tensor float16): that one stays.
    Graph inputs and outputs are never touched: they are the model's signature.

    Yields:
        The number of tensors whose type or shape changed.
    """
    inferred = infer(graph)
    inferred_tensors = inferred.tensors() if inferred is not None else {}
    io = {id(t) for t in graph.inputs + graph.outputs}
    saved: dict[int, tuple[gs.Variable, tuple[object, object], tuple[object, object]]] = {}
    for name, tensor in graph.tensors().items():
        source = inferred_tensors.get(name)
        if not isinstance(tensor, gs.Variable) or id(tensor) in io or source is None:
            continue
        dtype = source.dtype if source.dtype is not None else tensor.dtype
        shape = source.shape if source.shape is not None else tensor.shape
        if (dtype, shape) != (tensor.dtype, tensor.shape):
            saved[id(tensor)] = (tensor, (tensor.dtype, tensor.shape), (dtype, shape))
            tensor.dtype, tensor.shape = dtype, shape
    try:
        yield len(saved)
    finally:
        for tensor, (dtype, shape), (given_dtype, given_shape) in saved.values():
            if not isinstance(tensor, gs.Variable):  # folded tensors became gs.Constant
                continue
            # what the block itself set (a precision change) stays; what it lent goes back
            if tensor.dtype is given_dtype or tensor.dtype == given_dtype:
                tensor.dtype = dtype
            if tensor.shape == given_shape:
                tensor.shape = shape


def copy_graph(graph: gs.Graph) -> gs.Graph:
    """``graph.copy()``, with each variable's kind (sequence, optional) kept.

    onnx-graphsurgeon 0.6.1's ``Variable.copy`` drops ``type``, so a sequence output of
    the copy exports as a tensor and ONNX Runtime refuses the model ("does not match
    expected type (seq(tensor(float)))"; onnx node test ``test_split_to_sequence_2``).
    """
    copy = graph.copy()
    kinds = {name: t.type for g in (graph, *graph.subgraphs(recursive=True))
             for name, t in g.tensors().items()
             if isinstance(t, gs.Variable) and t.type != "tensor_type"}
    if kinds:
        for g in (copy, *copy.subgraphs(recursive=True)):
            for name, t in g.tensors().items():
                if name in kinds and isinstance(t, gs.Variable):
                    t.type = kinds[name]
    return copy


def taken_names(graph: gs.Graph) -> set[str]:
    """Every tensor and node name of `graph` and its subgraphs, for `unique_name`.

    A new node or tensor named after neither can clash with nothing, including the
    tools that confuse node names with tensor names.
    """
    names: set[str] = set()
    for g in (graph, *(g for node in graph.nodes for g in subgraphs(node))):
        names.update(g.tensors())
        names.update(n.name for n in g.nodes)
        if g is not graph:
            names.update(taken_names(g))
    return names


def subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The graphs held in `node`'s attributes (``If`` branches, ``Loop``/``Scan`` bodies)."""
    out: list[gs.Graph] = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, gs.Graph))
    return out


def unique_name(base: str, taken: set[str]) -> str:
    """Return `base`, or `base` with the first free ``_<n>`` suffix, and reserve it.

    Args:
        base: The preferred name.
        taken: Names already in use (start from `taken_names`); the returned
            name is added to it.
    """
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def remove_orphan_constant_nodes(graph: gs.Graph, tensors: list[gs.Tensor]) -> int:
    """Remove the ``Constant`` nodes among the producers of `tensors` that lost every use.

    A seasoning that rewires a node away leaves the ``Constant`` nodes that fed it
    behind; this removes exactly those, not every dead node of the graph (that is
    ``cleanup``'s job, in ``fold-constants``).

    Args:
        graph: The graph to remove the nodes from.
        tensors: The former inputs of the nodes that were rewired away.

    Returns:
        The number of nodes removed.
    """
    outputs = {id(t) for t in graph.outputs}
    orphans: dict[int, gs.Node] = {}
    for tensor in tensors:
        node = constant_node(tensor)
        if node is not None and not tensor.outputs and id(tensor) not in outputs:
            orphans[id(node)] = node
    if orphans:
        graph.nodes = [n for n in graph.nodes if id(n) not in orphans]
        for node in orphans.values():
            node.outputs.clear()
    return len(orphans)


def replace_graph(graph: gs.Graph, new: gs.Graph) -> None:
    """Make `graph` hold `new`'s nodes, inputs, outputs and opsets, in place.

    Seasonings must rewrite `RouteState.graph` in place; one that builds a new graph
    (through an external tool, or by redoing a conversion) moves the result in here.
    """
    graph.nodes, graph.inputs, graph.outputs = new.nodes, new.inputs, new.outputs
    graph.opset, graph.import_domains = new.opset, new.import_domains
    graph.ir_version = max(graph.ir_version or 0, new.ir_version or 0) or None
