"""The graph rewrite of mixed precision (`_rewrite`).

The chosen nodes run in the low type; a Cast stands at every boundary between a low and
a high tensor, shared by every consumer of that tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import (
    constant_value,
    subgraphs,
    taken_names,
    unique_name,
)
from routetune.passes.precision.float_types import FLOAT32, KEEP_INPUTS, _is_f32


def _subgraph_reads(graph: gs.Graph) -> set[int]:
    """Ids of outer tensors read by nodes inside any subgraph (recursively)."""
    reads: set[int] = set()

    def visit(g: gs.Graph) -> None:
        local = {id(t) for t in g.inputs}
        for node in g.nodes:
            local.update(id(t) for t in node.outputs)
        for node in g.nodes:
            for t in node.inputs:
                if id(t) not in local:
                    reads.add(id(t))
            for sub in subgraphs(node):
                visit(sub)

    for node in graph.nodes:
        for sub in subgraphs(node):
            visit(sub)
    return reads


def _rewrite(graph: gs.Graph, low: set[int], dtype: np.dtype, onnx_low: int,
             keep_io: bool) -> int:
    """Apply rules 2–4 to the nodes whose ids are in `low`; return the Casts added."""
    taken = taken_names(graph)
    converted: set[int] = set()  # ids of tensors now of the low type
    low_of: dict[int, gs.Tensor] = {}  # FP32 tensor id -> its low-precision twin
    high_of: dict[int, gs.Tensor] = {}  # low tensor id -> its FP32 twin
    new_nodes: list[gs.Node] = []
    outputs = {id(t) for t in graph.outputs} if keep_io else set()
    if not keep_io:
        for t in graph.inputs:
            if _is_f32(t) and any(id(n) in low and _reads_as_data(n, t) for n in t.outputs):
                t.dtype = dtype
                converted.add(id(t))
    # rule 2: outputs of low nodes become low; graph outputs keep their FP32 tensor
    for node in [n for n in graph.nodes if id(n) in low]:
        if node.op == "Cast" and node.attrs.get("to") == onnx.TensorProto.FLOAT:
            node.attrs["to"] = onnx_low  # rule 4
        for i, t in enumerate(node.outputs):
            if not _is_f32(t):
                continue
            if id(t) in outputs:
                twin = gs.Variable(unique_name(f"{t.name}_{dtype.name}", taken), dtype, t.shape)
                node.outputs[i] = twin
                new_nodes.append(gs.Node("Cast", unique_name(f"{t.name}_to_fp32", taken),
                                         {"to": onnx.TensorProto.FLOAT}, [twin], [t]))
                high_of[id(twin)] = t
            else:
                t.dtype = dtype
                converted.add(id(t))
    casts = len(new_nodes)
    for node in list(graph.nodes):
        is_low = id(node) in low
        keep = KEEP_INPUTS.get(node.op, set()) if is_low else set()
        for i, t in enumerate(list(node.inputs)):
            if i in keep or t.name == "":
                continue
            if is_low and node.op != "Cast" and _is_f32(t):
                node.inputs[i] = _low_twin(t, low_of, dtype, taken, new_nodes)
            elif not is_low and id(t) in converted:
                node.inputs[i] = _high_twin(t, high_of, taken, new_nodes)
    graph.nodes.extend(new_nodes)
    return casts + sum(1 for n in new_nodes[casts:] if n.op == "Cast")


def _reads_as_data(node: gs.Node, t: gs.Tensor) -> bool:
    """Whether `node` reads `t` at an input that follows its precision."""
    keep = KEEP_INPUTS.get(node.op, set())
    return node.op != "Cast" and any(x is t and i not in keep for i, x in enumerate(node.inputs))


def _low_twin(t: gs.Tensor, low_of: dict[int, gs.Tensor], dtype: np.dtype, taken: set[str],
              new_nodes: list[gs.Node]) -> gs.Tensor:
    if id(t) in low_of:
        return low_of[id(t)]
    value = constant_value(t)
    if value is not None:
        twin: gs.Tensor = gs.Constant(unique_name(f"{t.name}_{dtype.name}", taken),
                                      _convert(value, dtype))
    else:
        twin = gs.Variable(unique_name(f"{t.name}_{dtype.name}", taken), dtype, t.shape)
        new_nodes.append(gs.Node("Cast", unique_name(f"{t.name}_to_{dtype.name}", taken),
                                 {"to": _onnx_type(dtype)}, [t], [twin]))
    low_of[id(t)] = twin
    return twin


def _high_twin(t: gs.Tensor, high_of: dict[int, gs.Tensor], taken: set[str],
               new_nodes: list[gs.Node]) -> gs.Tensor:
    if id(t) not in high_of:
        twin = gs.Variable(unique_name(f"{t.name}_fp32", taken), FLOAT32, t.shape)
        new_nodes.append(gs.Node("Cast", unique_name(f"{t.name}_to_fp32", taken),
                                 {"to": onnx.TensorProto.FLOAT}, [t], [twin]))
        high_of[id(t)] = twin
    return high_of[id(t)]


def _convert(value: np.ndarray, dtype: np.dtype) -> Any:
    return value.astype(dtype)


def _onnx_type(dtype: np.dtype) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(dtype)
