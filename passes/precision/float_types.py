"""Float32 data in a graph, for precision rewrites.

Which tensors are float32 data, and which node attributes and inputs hold types that a
precision rewrite must keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import (
    constant_value,
)

TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype", "output_datatype"})
"""Attributes that fix a node's output type, whether given or left to their default
(BitCast's ``to``, EyeLike's and RandomNormalLike's ``dtype``, QuantizeLinear's
``output_dtype``, the window functions' ``output_datatype``): converting such a node's
float inputs would change a type the attribute fixes (BitCast's bit width), and its
float outputs keep the attribute's type. Cast is handled by rule 4 instead."""


KEEP_INPUTS = {"Resize": {1, 2}, "Upsample": {1}, "Dropout": {1}}
"""Inputs that keep their type whatever the node's precision: Resize's roi and scales,
Upsample's scales, Dropout's ratio (ONNX operator spec)."""


FLOAT32 = np.dtype(np.float32)


def _data_tensors(node: gs.Node) -> list[gs.Tensor]:
    """The node's float32 inputs and outputs that follow its precision."""
    keep = KEEP_INPUTS.get(node.op, set())
    ins = [t for i, t in enumerate(node.inputs) if i not in keep and _is_f32(t)]
    if node.op == "Cast":
        ins = []  # Cast reads any type; its output type comes from 'to'
    return ins + [t for t in node.outputs if _is_f32(t)]


def _float_outputs(node: gs.Node) -> list[gs.Tensor]:
    return [t for t in node.outputs if _is_f32(t)]


def _is_f32(tensor: gs.Tensor) -> bool:
    """Whether `tensor` is a float32 tensor (not a sequence, optional or map of them)."""
    if tensor.name == "" or tensor.dtype is None:
        return False
    if _not_tensor(tensor):
        return False
    value = constant_value(tensor)
    return (value.dtype if value is not None else numpy_dtype(tensor.dtype)) == FLOAT32


def _type_attrs(node: gs.Node, opset: int) -> list[str]:
    """The node's `TYPE_ATTRS`, given or left to their default by its schema.

    HannWindow's ``output_datatype`` defaults to FLOAT: absent, it still fixes the
    output type (onnx node test ``test_hannwindow``).
    """
    try:
        declared = set(onnx.defs.get_schema(node.op, opset, node.domain or "").attributes)
    except onnx.defs.SchemaError:
        declared = set()
    return sorted(TYPE_ATTRS & (declared | set(node.attrs)))


def _not_tensor(tensor: gs.Tensor) -> bool:
    """Whether `tensor` is a sequence, optional or map (their element types stay)."""
    return isinstance(tensor, gs.Variable) and getattr(tensor, "type",
                                                       "tensor_type") != "tensor_type"


def numpy_dtype(dtype: Any) -> np.dtype | None:
    """onnx-graphsurgeon's dtype as NumPy's; None where NumPy lacks it.

    onnx-graphsurgeon keeps such types (float8, int4) as the ONNX enum value, and
    ``np.dtype(17)`` raises ``TypeError`` (onnx node test ``test_cast_FLOAT_to_FLOAT8E4M3FN``).
    """
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def _schema_admits(node: gs.Node, opset: int, onnx_low: int,
                   schemas: Mapping[tuple[str, str], Any]) -> bool:
    """Whether the node's schema lets the float data it reads and writes be of the low type.

    Only the formal parameters bound to that data (`_data_tensors`) count:
    LayerNormalization's ``U`` (float, for its optional Mean and InvStdDev outputs) does
    not stop a node without those outputs. A node outside ONNX's domains is judged by
    the backend's schema of it (`routetune.backend.Backend.operator_schemas`, given as
    `schemas`); with no schema, it is kept.
    """
    domain = node.domain or ""
    try:
        schema = (onnx.defs.get_schema(node.op, opset, domain)
                  if domain in ("", "ai.onnx", "ai.onnx.ml") else schemas[(domain, node.op)])
    except (onnx.defs.SchemaError, KeyError):
        return False
    low_name = f"tensor({onnx.helper.tensor_dtype_to_string(onnx_low).split('.')[-1].lower()})"
    allowed = {tc.type_param_str: set(tc.allowed_type_strs) for tc in schema.type_constraints}
    data = {id(t) for t in _data_tensors(node)}
    bound = _bound(schema.inputs, node.inputs) + _bound(schema.outputs, node.outputs)
    return all(low_name in allowed.get(param, {param}) for param, t in bound if id(t) in data)


def _bound(formal: Sequence[Any], tensors: Sequence[gs.Tensor]) -> list[tuple[str, gs.Tensor]]:
    """(type string, tensor) of each tensor given, by the formal parameter it binds to.

    The last formal parameter repeats when it is variadic; missing optional tensors
    (empty names) are left out.
    """
    out = []
    for i, tensor in enumerate(tensors):
        if not formal or (i >= len(formal) and formal[-1].option.name != "Variadic"):
            break
        param = formal[min(i, len(formal) - 1)]
        if tensor.name:
            out.append((getattr(param, "type_str", None) or param.typeStr, tensor))
    return out
