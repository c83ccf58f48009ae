"""What Q/DQ quantization needs around ONNX Runtime's quantizer.

The calibration data reader over the validation inputs, the checks that decide whether
a model can be quantized (`low_precision`, `range_mismatches`), and the counts recorded
afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
)

from routetune.model.loading import FLOAT_TYPES, with_intermediates
from routetune.plugins.onnxruntime.backend import reference_options

QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention",
    "MatMulNBits",
})
"""Ops that mean a model is quantized already (plus every ``QLinear*`` op)."""

MERGING_INPUTS: Mapping[str, tuple[int, ...] | None] = {"Concat": None, "Where": (1, 2)}
"""Ops whose output holds the values of several inputs unchanged (None: all inputs), so
one Q/DQ scale on that output, or on a consumer's input, covers all of their ranges.
Add and Mul are not here: their output's own range sets its scale. ONNX Runtime's QDQ
quantizer gives every other tensor its own scale."""


MAX_RANGE_RATIO = 10.0
"""Largest ratio of calibrated max |x| between inputs that may share one INT8 scale
(issue 3, "int8-qdq and fp8-qdq": "differ by more than a factor of about 10", e.g. box
pixels 0..640 concatenated with sigmoid scores 0..1)."""


class _Feeds(CalibrationDataReader):
    """The validation input sets, one by one, for ONNX Runtime's calibrators."""

    def __init__(self, feeds: Sequence[Mapping[str, Any]]) -> None:
        self._sets = iter([{k: np.asarray(v) for k, v in f.items()} for f in feeds])

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next input set, or None after the last."""
        return next(self._sets, None)


def quantized_ops(graph: gs.Graph) -> list[str]:
    """Return the sorted op types of `graph`'s top level that show it is quantized already."""
    return sorted({n.op for n in graph.nodes
                   if n.op in QUANTIZED_OPS or n.op.startswith("QLinear")})


def low_precision(graph: gs.Graph, op_types: Iterable[str]) -> str | None:
    """Why a graph whose quantizable nodes compute in float16 or bfloat16 is declined.

    ONNX Runtime's quantizer writes float32 scales, which a ``DequantizeLinear`` of
    float16 data cannot take (its scale must be of the output type), so the result is
    an invalid model. None when every such node computes in float32.
    """
    op_types = set(op_types)
    for node in graph.nodes:
        if node.op in op_types:
            for t in node.inputs:
                if t.dtype is not None and np.dtype(t.dtype) != np.float32 and (
                        np.dtype(t.dtype).kind == "f" or str(t.dtype) == "bfloat16"):
                    return (f"the model computes in {np.dtype(t.dtype).name} already "
                            f"({node.op} '{node.name}' reads '{t.name}'); Q/DQ "
                            "quantization takes an FP32 model: quantize that one instead")
    return None


def range_mismatches(
    model: onnx.ModelProto,
    feeds: Sequence[Mapping[str, Any]],
    op_types: Iterable[str],
    max_ratio: float = MAX_RANGE_RATIO,
    weights: Path | None = None,
) -> dict[str, str]:
    """Find the nodes whose one Q/DQ scale would cover inputs of very different ranges.

    For each `MERGING_INPUTS` node, the largest magnitude of each of its data inputs is
    taken from an FP32 run of `model` in ONNX Runtime (CPU, optimisations off) on
    `feeds`, with those tensors added as outputs (constants are read directly; inputs
    that are all zero are ignored, zero being exact in any scale). When the largest
    exceeds `max_ratio` times the smallest, the node (if its op type is quantized) and
    every consumer of its output whose op type is quantized are reported.

    Args:
        model: The FP32 model, top-level nodes named; not changed.
        feeds: Input sets, name to array.
        op_types: The op types that will be quantized.
        max_ratio: The largest ratio of magnitudes that may share a scale.
        weights: The folder of the model's external data, or None.

    Returns:
        Node name to a one-line reason, e.g. ``concat: inputs boxes 640, scores 1 (640x)``.
    """
    op_types = set(op_types)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    merges = []
    for node in model.graph.node:
        if node.op_type not in MERGING_INPUTS:
            continue
        picked = MERGING_INPUTS[node.op_type]
        inputs = [t for i, t in enumerate(node.input) if t and (picked is None or i in picked)]
        affected = [node] if node.op_type in op_types else []
        affected += [c for c in consumers.get(node.output[0], []) if c.op_type in op_types]
        if len(inputs) > 1 and affected:
            merges.append((node, inputs, affected))
    amax = _amax(model, {t for _, inputs, _ in merges for t in inputs}, feeds, weights)
    found: dict[str, str] = {}
    for node, inputs, affected in merges:
        peaks = {t: amax[t] for t in inputs if amax.get(t, 0.0) > 0.0}
        if len(peaks) < 2 or max(peaks.values()) <= max_ratio * min(peaks.values()):
            continue
        ratio = max(peaks.values()) / min(peaks.values())
        text = ", ".join(f"{t} {v:.3g}" for t, v in peaks.items())
        for target in affected:
            via = "" if target is node else f"reads {node.name} whose "
            found[target.name] = f"{target.name}: {via}inputs max |x| {text} ({ratio:.0f}x)"
    return found


def _amax(model: onnx.ModelProto, names: set[str], feeds: Sequence[Mapping[str, Any]],
          weights: Path | None = None) -> dict[str, float]:
    """The largest finite |x| of each float tensor in `names` over every input set."""
    if not names:
        return {}
    base = str(weights) if weights is not None else ""
    constants = {t.name: numpy_helper.to_array(t, base) for t in model.graph.initializer
                 if t.name in names}
    probe = with_intermediates(model, names - constants.keys())
    wanted = sorted(o.name for o in probe.graph.output if o.name in names
                    and o.type.tensor_type.elem_type in FLOAT_TYPES)
    amax = {n: _peak(v) for n, v in constants.items() if v.dtype.kind == "f"}
    if not wanted:  # run([]) would return every output
        return amax
    session = ort.InferenceSession(probe.SerializeToString(), reference_options(weights),
                                   providers=["CPUExecutionProvider"])
    for feed in feeds:
        values = session.run(wanted, {k: np.asarray(v) for k, v in feed.items()})
        for name, value in zip(wanted, values, strict=True):
            amax[name] = max(amax.get(name, 0.0), _peak(value))
    return amax


def _peak(array: np.ndarray) -> float:
    finite = np.abs(array[np.isfinite(array)])
    return float(finite.max()) if finite.size else 0.0


def _constants_to_initializers(model: onnx.ModelProto) -> int:
    """Make top-level ``Constant(value=tensor)`` nodes initializers, in place; return how many."""
    outputs = {o.name for o in model.graph.output}
    kept = []
    for node in model.graph.node:
        attrs = node.attribute
        if (node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(attrs) == 1
                and attrs[0].name == "value" and node.output[0] not in outputs):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attrs[0].t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
        else:
            kept.append(node)
    moved = len(model.graph.node) - len(kept)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return moved


def _opset(model: onnx.ModelProto) -> int:
    """The default domain's opset; 0 for a model that imports only other domains."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _count_quantized(model: onnx.ModelProto, op_types: Iterable[str]) -> int:
    """Nodes of `op_types` that read at least one DequantizeLinear output."""
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    op_types = set(op_types)
    return sum(1 for n in model.graph.node
               if n.op_type in op_types and dequantized.intersection(n.input))
