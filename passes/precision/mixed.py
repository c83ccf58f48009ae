"""FP16 and BF16 mixed precision: run what is safe in the low type, keep the rest in FP32.

TensorRT 11 networks are strongly typed, so precision is decided in the ONNX graph: the
nodes that run in FP16 (or BF16) read and write tensors of that type, and Casts sit on
the edges between the two precisions. The decision follows ModelOpt AutoCast
(modelopt/onnx/autocast, guide ``8_autocast.rst``): a node stays in FP32 when any of its
float inputs or outputs exceeds ``data_max`` on the calibration inputs, when one of its
constant inputs would overflow the low type, when the user excludes it, or when the
operator cannot run in the low type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.backend import Backend
from routetune.passes.graph.casts import tidy_casts
from routetune.passes.graph.constants import (
    constant_value,
    copy_graph,
    inferred_types,
    replace_graph,
)
from routetune.passes.precision.casting import _rewrite, _subgraph_reads
from routetune.passes.precision.float_types import (
    FLOAT32,
    _data_tensors,
    _float_outputs,
    _not_tensor,
    _schema_admits,
    _type_attrs,
    numpy_dtype,
)
from routetune.passes.precision.lowering import LOWERED, Lowering
from routetune.passes.precision.ranges import Ranges, tensor_ranges
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

FP16_MAX = 65504.0
"""Largest finite float16 (IEEE 754 binary16)."""
FP16_TINY = 2.0**-24
"""Smallest positive float16 subnormal; smaller magnitudes become zero."""
BF16_MAX = float(np.finfo(np.float32).max)
"""bfloat16 keeps FP32's exponent range: its largest finite value is about FP32's."""

ALWAYS_FP32 = frozenset({
    "If", "Loop", "Scan", "Range", "NonMaxSuppression", "ConstantOfShape", "RandomNormal",
    "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
})
"""Operators that always stay FP32: control flow (whose subgraphs are left alone), ops
whose float inputs the ONNX spec or good practice keeps FP32 (Range bounds,
NonMaxSuppression thresholds), generators, and quantization ops."""


QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul",
})


class MixedPrecision(Seasoning):
    """Base of ``fp16`` and ``bf16``; subclasses set the target type.

    Rules, applied to the top-level graph:

    1. A node runs in the low type unless it is in `ALWAYS_FP32`, the user's
       ``op_types_to_exclude`` or ``nodes_to_exclude`` (added to that block list, never
       replacing it), its operator schema does not admit the low type, it reads or
       writes a sequence or optional, an attribute fixes its types (`TYPE_ATTRS`), one
       of its float
       inputs or outputs exceeds ``data_max`` in magnitude on the calibration inputs (or
       the type's largest value), a reduction's partial sums exceed the type's largest
       value, or a constant input holds values that overflow the type (``init_max``) or
       more than 1% of its non-zero values would flush to zero. Each reason is counted.
    2. A tensor produced by a low node becomes low; its FP32 consumers read it through
       one Cast back to FP32, and a graph output keeps its name and FP32 type through a
       final Cast (``keep_io_types``, the default). With ``keep_io_types=false`` such
       outputs, and FP32 graph inputs that a low node reads, take the low type; FP32
       readers of such an input read it through a Cast.
    3. A low node reads FP32 variables through one Cast per tensor, and constants
       (initializers and ``Constant`` nodes alike) as converted copies.
    4. A ``Cast(to=FLOAT)`` that runs low is changed to cast to the low type.
    5. Outer tensors that ``If``/``Loop``/``Scan`` subgraphs read stay FP32 (their
       producers are kept FP32), so subgraphs keep their types.
    6. No Cast that narrows to the low type feeds a Cast that widens back.
    7. No Cast casts a tensor to the type it already has, and no tensor is cast to one
       type twice (`tidy_casts`): a model already partly in the low type, whose
       ``Cast(to=FLOAT)`` rule 4 turns into a low-to-low Cast, comes out clean.
    8. The converted model is run once by the backend (`Backend.kernel_gaps`, on the
       first input set); a low node it has no kernel for is kept in FP32 and the
       conversion is redone, until it runs. ONNX Runtime's CPU provider has no float16
       ScatterND or ScatterElements with a reduction, though the schema admits it
       (onnx node test ``test_scatternd_max``).
    """

    low: ClassVar[np.dtype]
    onnx_low: ClassVar[int]
    type_max: ClassVar[float]
    type_tiny: ClassVar[float]

    def supports(self, backend: Backend) -> str | None:
        """A reason when the backend has no kernels of the low type."""
        return super().supports(backend) or backend.dtype_support(self.low.name)

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """A reason when the backend lacks the type, or the model is already low or quantized."""
        reason = self.supports(backend)
        if reason:
            return reason
        quantized = sorted({n.op for n in graph.nodes if n.op in QUANTIZED_OPS})
        if quantized:
            return f"the model is already quantized ({', '.join(quantized)})"
        floats = Counter(numpy_dtype(t.dtype) for t in graph.tensors().values()
                         if t.dtype is not None and getattr(numpy_dtype(t.dtype), "kind", "")
                         == "f")
        lowish = floats[np.dtype(np.float16)] + floats.get(self.low, 0)
        if lowish and lowish >= floats[FLOAT32]:
            return "the model is already in low precision (mostly float16 tensors)"
        if not floats[FLOAT32] and not any(_float_outputs(n) for n in graph.nodes):
            return "the model has no float32 tensors"
        return None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Decide each node's precision, then rewrite the graph (rules 1–8)."""
        graph = state.model_graph()
        before = copy_graph(graph)
        ranges = tensor_ranges(graph, ctx)
        no_kernel: dict[str, str] = {}
        while True:
            with inferred_types(graph):
                for name, tensor in graph.tensors().items():  # custom ops' outputs
                    if tensor.dtype is None and name in ranges.dtypes:
                        tensor.dtype = ranges.dtypes[name]
                decisions, counts = self._decide(graph, ranges, no_kernel,
                                                 ctx.backend.operator_schemas())
                low = {id(n) for n in graph.nodes if decisions[n.name] is None}
                kept = {name: why for name, why in decisions.items() if why}
                casts = _rewrite(graph, low, self.low, self.onnx_low,
                                 bool(self.params["keep_io_types"]))
                tidied = tidy_casts(graph)  # rule 7
            graph.cleanup().toposort()
            gaps = self._kernel_gaps(graph, ctx, {n for n, why in decisions.items()
                                                  if why is None})
            if not gaps:
                break
            no_kernel.update(gaps)  # rule 8: convert again, those nodes kept in FP32
            replace_graph(graph, copy_graph(before))
        state.stash[LOWERED] = Lowering(self, before)
        stats = {"low_nodes": len(low), "fp32_nodes": len(kept), "casts": casts, **counts,
                 **tidied}
        note = "; ".join(f"{n}: {why}" for n, why in list(kept.items())[:20])
        if len(kept) > 20:
            note += f"; … {len(kept) - 20} more"
        return PassResult(modified=bool(low), stats=stats, note=note)

    def _kernel_gaps(self, graph: gs.Graph, ctx: RouteContext, low: set[str]
                     ) -> dict[str, str]:
        """Low nodes the backend has no kernel for (`Backend.kernel_gaps`), on one set.

        Not asked for a model with external data (over 2 GiB, say): that would build
        one more session over the weights; the build reports such a node instead.
        """
        if ctx.weights is not None or not ctx.feeds:
            return {}
        model = gs.export_onnx(copy_graph(graph), do_type_check=False)
        gaps = ctx.backend.kernel_gaps(model, ctx.feeds[:1])
        return {name: why for name, why in gaps.items() if name in low}

    def _decide(self, graph: gs.Graph, ranges: Ranges, no_kernel: Mapping[str, str],
                schemas: Mapping[tuple[str, str], Any]
                ) -> tuple[dict[str, str | None], Counter]:
        data_max = min(float(self.params["data_max"]), self.type_max)
        init_max = min(float(self.params["init_max"]), self.type_max)
        excluded_ops = set(self.params["op_types_to_exclude"])
        excluded_nodes = set(self.params["nodes_to_exclude"])
        outer = _subgraph_reads(graph)
        opset = graph.opset
        decisions: dict[str, str | None] = {}
        counts: Counter = Counter()

        def keep(node: gs.Node, key: str, why: str) -> None:
            decisions[node.name] = why
            counts[key] += 1

        for node in graph.nodes:
            data = _data_tensors(node)
            if not data or node.op == "Constant":  # constants are converted as values
                decisions[node.name] = ""
                continue
            if node.op in ALWAYS_FP32:
                keep(node, "kept_blocked", f"{node.op} always runs in FP32")
            elif node.op in excluded_ops or node.name in excluded_nodes:
                keep(node, "kept_excluded", "in op_types_to_exclude or nodes_to_exclude")
            elif not _schema_admits(node, opset, self.onnx_low, schemas):
                keep(node, "kept_blocked", f"{node.op} has no {self.low.name} kernel in the spec")
            elif node.name in no_kernel:
                keep(node, "kept_no_kernel", f"the backend has no {self.low.name} kernel: "
                     f"{no_kernel[node.name]}")
            elif any(_not_tensor(t) for t in (*node.inputs, *node.outputs)):
                keep(node, "kept_typed", f"{node.op} reads or writes a sequence or optional")
            elif node.op != "Cast" and (fixed := _type_attrs(node, opset)):
                keep(node, "kept_typed", f"{node.op}'s '{fixed[0]}' attribute fixes its types")
            elif any(id(t) in outer for t in node.outputs):
                keep(node, "kept_subgraph", "its output is read inside a subgraph")
            else:
                why = _range_reason(node, data, ranges, data_max, init_max, self)
                if why:
                    keep(node, why[0], why[1])
                else:
                    decisions[node.name] = None
        # report constants whose values the low type cannot hold, whatever the decision
        for node in graph.nodes:
            for t in _data_tensors(node):
                value = constant_value(t)
                if value is not None and value.dtype == FLOAT32:
                    counts["init_overflow_values"] += int(np.sum(np.abs(value) > self.type_max))
        return decisions, counts


def _range_reason(node: gs.Node, data: list[gs.Tensor], ranges: Ranges, data_max: float,
                  init_max: float, seasoning: MixedPrecision) -> tuple[str, str] | None:
    for t in data:
        value = constant_value(t)
        if value is not None:
            if value.dtype != FLOAT32 or not value.size:
                continue
            mag = np.abs(value)
            over = int(np.sum(mag > init_max))
            if over:
                return "kept_init_range", (f"constant '{t.name}' has {over} values above "
                                           f"{init_max:g} (largest {mag.max():.3g})")
            nonzero = mag[mag > 0]
            under = int(np.sum(nonzero < seasoning.type_tiny))
            if nonzero.size and under > 0.01 * nonzero.size:
                return "kept_init_range", (f"constant '{t.name}': {under} of {nonzero.size} "
                                           f"non-zero values would flush to zero")
        elif ranges.amax.get(t.name, 0.0) > data_max:
            return "kept_data_max", (f"'{t.name}' reaches {ranges.amax[t.name]:.4g} "
                                     f"> data_max {data_max:g}")
    partial = ranges.partial_sums.get(node.name, 0.0)
    if partial > seasoning.type_max:
        return "kept_partial_sums", (f"partial sums reach {partial:.4g} "
                                     f"> {seasoning.type_max:g}")
    return None


def _params(data_max: float, init_max: float) -> tuple[Param, ...]:
    return (
        Param("keep_io_types", (True,), True,
              "keep FP32 graph inputs and outputs (false: the model takes and gives the "
              "low type where low nodes read or write them)", allowed=(False,)),
        Param("data_max", (float(data_max),), float(data_max),
              "keep a node FP32 when a float input or output exceeds this magnitude"),
        Param("init_max", (float(init_max),), float(init_max),
              "keep a node FP32 when a constant input exceeds this magnitude"),
        Param("op_types_to_exclude", ((),), (), "op types kept FP32, added to the block list"),
        Param("nodes_to_exclude", ((),), (), "node names kept FP32"),
    )


AFTER = frozenset({"int8-qdq", "fp8-qdq"})
"""Q/DQ first, then FP16/BF16 for what stays unquantized (TensorRT's usual INT8 + FP16
mix); ONNX Runtime's quantizer cannot quantize a graph already in float16."""


class Fp16(MixedPrecision):
    """FP16 mixed precision (see `MixedPrecision` for the rules)."""

    low = np.dtype(np.float16)
    onnx_low = onnx.TensorProto.FLOAT16
    type_max = FP16_MAX
    type_tiny = FP16_TINY
    info = SeasoningInfo(
        name="fp16", stage="precision", summary="FP16 mixed precision, range-aware",
        params=_params(512.0, FP16_MAX), conflicts=frozenset({"bf16"}), after=AFTER,
    )


class Bf16(MixedPrecision):
    """BF16 mixed precision (see `MixedPrecision` for the rules)."""

    low = np.dtype(ml_dtypes.bfloat16)
    onnx_low = onnx.TensorProto.BFLOAT16
    type_max = BF16_MAX
    type_tiny = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    info = SeasoningInfo(
        name="bf16", stage="precision", summary="BF16 mixed precision, range-aware",
        params=_params(BF16_MAX, BF16_MAX), conflicts=frozenset({"fp16"}), after=AFTER,
    )
