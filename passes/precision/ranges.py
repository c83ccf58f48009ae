"""Activation ranges: the largest magnitude of every tensor on the calibration inputs.

ONNX Runtime's CPU provider computes many FP16 ops in FP32 internally, so an FP16
candidate can look exact on the CPU and still overflow on a GPU. The precision
seasonings therefore decide from the FP32 model's own ranges, not from a low-precision
run: the model is run once on the calibration inputs with every intermediate float
tensor as an extra output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.judging.metrics import all_finite
from routetune.model.loading import with_intermediates
from routetune.passes.graph.constants import constant_value, copy_graph
from routetune.passes.precision.memo import ProcessMemo
from routetune.seasoning import RouteContext

REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2"}
"""Reductions whose partial sums are accumulated in the low-precision type."""


@dataclass(frozen=True)
class Ranges:
    """What one FP32 run on the calibration inputs showed.

    Args:
        amax: Per tensor name, the largest finite magnitude over every input set.
        partial_sums: Per reduction node name, the largest sum of input magnitudes along
            the reduced axes: the accumulator's magnitude (squared inputs for
            ``ReduceSumSquare`` and ``ReduceL2``).
        dtypes: Per tensor name, the dtype ONNX Runtime gave it, for each tensor whose
            type the graph does not declare (a custom operator's output, which ONNX
            shape inference cannot type).
    """

    amax: Mapping[str, float] = field(default_factory=dict)
    partial_sums: Mapping[str, float] = field(default_factory=dict)
    dtypes: Mapping[str, np.dtype] = field(default_factory=dict)


_kept: ProcessMemo[Ranges] = ProcessMemo(4)
"""Ranges a worker process keeps (`tensor_ranges`): every rung of a precision repair, and
each low-precision route of one graph, converts the same FP32 graph."""


def tensor_ranges(graph: gs.Graph, ctx: RouteContext) -> Ranges:
    """Run the FP32 graph with every float tensor as an output and record magnitudes.

    Once per graph and validation inputs in a worker process (`_kept`): the FP32
    runtime (``ctx.evaluate``) is the reference's, whatever the backend.

    Args:
        graph: The model to analyse; not changed.
        ctx: Supplies the calibration inputs (``ctx.feeds``) and the FP32 runtime
            (``ctx.evaluate``).

    Returns:
        The ranges, of tensors only (sequence outputs are left out: the pass never
        converts them); empty when ``ctx`` has no runtime or no inputs.
    """
    if ctx.evaluate is None or not ctx.feeds:
        return Ranges()
    model = gs.export_onnx(copy_graph(graph), do_type_check=False)
    return _kept.get([model], ctx, lambda: _measured(graph, model, ctx))


def _measured(graph: gs.Graph, model: onnx.ModelProto, ctx: RouteContext) -> Ranges:
    """`tensor_ranges` itself: `model` (`graph` exported) run with its intermediates."""
    assert ctx.evaluate is not None
    reductions = [(node, _axes(node), node.op in ("ReduceSumSquare", "ReduceL2"))
                  for node in graph.nodes if node.op in REDUCTIONS and node.inputs]
    amax: dict[str, float] = {}
    sums: dict[str, float] = {}
    untyped = {name for name, t in graph.tensors().items() if t.dtype is None}
    dtypes: dict[str, np.dtype] = {}
    # one input set's intermediates at a time (`RouteContext.evaluate`)
    for outputs in ctx.evaluate(with_intermediates(model)):
        for name, array in outputs.items():
            if name in untyped and isinstance(array, np.ndarray):
                dtypes[name] = array.dtype
            if isinstance(array, np.ndarray) and array.dtype.kind == "f" and array.size:
                amax[name] = max(amax.get(name, 0.0), _peak(array))
        for node, axes, squared in reductions:
            x = outputs.get(node.inputs[0].name)
            if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
                continue
            mag = np.abs(x.astype(np.float64))
            acc = np.sum(mag * mag if squared else mag, axis=axes)
            sums[node.name] = max(sums.get(node.name, 0.0), float(np.max(acc, initial=0.0)))
    return Ranges(amax, sums, dtypes)


def _peak(array: np.ndarray) -> float:
    """The largest finite magnitude of a float array (0 when none is finite)."""
    if all_finite(array):  # no mask, no copy
        return float(max(-array.min(), array.max()))
    finite = np.abs(array[np.isfinite(array)])
    return float(finite.max()) if finite.size else 0.0


def _axes(node: gs.Node) -> tuple[int, ...] | None:
    """The reduced axes from the attribute (opset < 18) or a constant input; None: all."""
    if "axes" in node.attrs:
        return tuple(int(a) for a in node.attrs["axes"])
    value = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if value is not None and value.size:
        return tuple(int(a) for a in np.ravel(value))
    return None
