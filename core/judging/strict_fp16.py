"""Strict-FP16 reference: recompute the ops that overflow in float16, in float16.

ONNX Runtime's CPU provider widens float16 to float32 inside Pow, the reductions, Exp
and Softmax, and rounds only the result. A ReduceMean over 4096 values of 300 returns
300 there, while a device that accumulates in float16 reaches 65504 after 219 values and
returns inf. When the measuring device emulates float16 (`Backend.emulates`), the search
runs the candidate once with every tensor as an output, recomputes each of those ops
from its float16 inputs with numpy in float16 (sums as trees of float16 additions, as
GPU reductions combine values), and fails the candidate where the float16 result
overflows and the same op in float32 arithmetic does not. The ops are those whose
intermediates can exceed float16's range while their inputs and outputs fit, the ones
ModelOpt AutoCast (``modelopt/onnx/autocast``) treats with care.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from routetune.model.loading import with_intermediates

STRICT_OPS = frozenset({"Pow", "ReduceMean", "ReduceSum", "ReduceSumSquare", "Exp", "Softmax"})
"""Ops recomputed in float16."""

F16 = np.dtype(np.float16)


def mentions_float16(model: onnx.ModelProto) -> bool:
    """Whether any top-level tensor of `model` can be float16 (a Cast to it, or a constant)."""
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer):
        return True
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == onnx.TensorProto.FLOAT16:
                return True
            if node.op_type == "Constant" and attr.name == "value" and (
                    attr.t.data_type == onnx.TensorProto.FLOAT16):
                return True
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
               for v in model.graph.input)


def strict_fp16_overflows(
    model: onnx.ModelProto,
    evaluate: Callable[[onnx.ModelProto], Iterable[dict[str, np.ndarray]]],
    limit: int = 5,
) -> dict[str, str]:
    """Find the `STRICT_OPS` nodes that overflow when computed in float16.

    Args:
        model: A candidate with float16 tensors (top-level graph).
        evaluate: Runs a model on every validation input set and returns all outputs
            by name (`Backend.evaluate` of the reference backend).
        limit: Report at most this many nodes.

    Returns:
        Per node name, one line for each node whose recomputation from its finite
        float16 inputs gives inf or NaN in float16 arithmetic but not in float32, e.g.
        ``ReduceMean 'var': 4 of 4 values overflow in float16 (up to 4.1e+04 in float32
        arithmetic)``; empty when none does. The run's own intermediate values are not
        compared: ONNX Runtime may keep a float16 tensor in float32 between two of its
        inserted Casts, so they need not show what a float16 device computes.

    Raises:
        Exception: Whatever `evaluate` raises for a model it cannot run.
    """
    nodes = [n for n in model.graph.node if n.op_type in STRICT_OPS]
    if not nodes:
        return {}
    constants = _constants(model)
    found: dict[str, str] = {}
    for run in evaluate(with_intermediates(model)):
        values = {**constants, **run}
        for node in nodes:
            x = values.get(node.input[0])
            if node.name in found or x is None or x.dtype != F16 or not np.isfinite(x).all():
                continue
            with np.errstate(all="ignore"):
                strict = _recompute(node, x, values)
                wide = _recompute(node, x.astype(np.float32), values)
            bad = ~np.isfinite(strict) & np.isfinite(wide)
            if bad.any():
                peak = float(np.max(np.abs(wide[bad])))
                found[node.name] = (
                    f"{node.op_type} '{node.name}': {int(bad.sum())} of {bad.size} values "
                    f"overflow in float16 (up to {peak:.3g} in float32 arithmetic)")
        if len(found) >= limit:
            break
    return dict(list(found.items())[:limit])


def _recompute(node: onnx.NodeProto, x: np.ndarray, values: Mapping[str, np.ndarray]
               ) -> np.ndarray:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    if op == "Exp":
        return np.exp(x)
    if op == "Pow":
        return np.power(x, np.asarray(values[node.input[1]]).astype(x.dtype))
    if op == "Softmax":
        axis = int(attrs.get("axis", -1))
        shifted = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return shifted / _tree_sum(shifted, (axis % x.ndim,), keepdims=True)
    axes = _axes(node, attrs, values, x.ndim)
    keep = bool(attrs.get("keepdims", 1))
    terms = x * x if op == "ReduceSumSquare" else x
    total = _tree_sum(terms, axes, keep)
    if op == "ReduceMean":
        count = np.prod([x.shape[a] for a in (axes or range(x.ndim))])
        return total / x.dtype.type(count)
    return total


def _tree_sum(x: np.ndarray, axes: tuple[int, ...] | None, keepdims: bool) -> np.ndarray:
    """Sum over `axes` by pairwise halving, every addition rounded to ``x.dtype``.

    numpy's own float16 sums accumulate in float32 and round once, which is what the
    check must not do; a tree of float16 additions is how GPU reductions combine values.
    """
    axes = tuple(range(x.ndim)) if axes is None else axes
    rest = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, rest + list(axes))
    flat = moved.reshape(*moved.shape[:len(rest)], -1)
    n = flat.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    flat = np.concatenate([flat, np.zeros((*flat.shape[:-1], width - n), x.dtype)], axis=-1)
    while flat.shape[-1] > 1:
        flat = flat[..., 0::2] + flat[..., 1::2]
    total = flat[..., 0]
    if keepdims:
        for a in sorted(axes):
            total = np.expand_dims(total, a)
    return total


def _axes(node: onnx.NodeProto, attrs: Mapping[str, Any], values: Mapping[str, np.ndarray],
          ndim: int) -> tuple[int, ...] | None:
    """Reduced axes: the attribute (opset < 18) or the second input; None for all."""
    if "axes" in attrs:
        raw = list(attrs["axes"])
    elif len(node.input) > 1 and node.input[1] in values:
        raw = np.ravel(values[node.input[1]]).tolist()
    else:
        raw = []
    if not raw:
        return None if not attrs.get("noop_with_empty_axes", 0) else ()
    return tuple(int(a) % ndim for a in raw)


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and ``Constant(value=…)`` outputs of the top-level graph, by name."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            value = helper.get_attribute_value(node.attribute[0])
            values[node.output[0]] = (numpy_helper.to_array(value)
                                      if isinstance(value, onnx.TensorProto) else np.array(value))
    return values
