"""``int8-qdq`` and ``fp8-qdq``: explicit quantization with ONNX Runtime's own tooling.

The model is quantized by `onnxruntime.quantization.quantize_static` in
`QuantFormat.QDQ`: QuantizeLinear/DequantizeLinear pairs around the chosen op types, with
activation ranges calibrated by ONNX Runtime's calibrators (MinMax, Entropy, Percentile,
Distribution) on the route's validation inputs (``ctx.feeds``). routetune adds no
calibrator of its own; it prepares the model, decides which nodes to leave in FP32, and
copies the result back into the route's graph.

ONNX Runtime quantizer behaviour this module works around (onnxruntime 1.32):

- Weights held in ``Constant`` nodes (Paddle2ONNX writes every weight that way) are not
  seen as weights: they get calibrated per-tensor activation Q/DQ pairs and
  ``per_channel`` does nothing. They are turned into initializers first.
- Per-channel weights get a ``DequantizeLinear`` with ``axis``, which exists from opset
  13; the quantizer does not raise the opset, so an opset-11 model comes out invalid.
  Such models are converted to opset 13 first (``onnx.version_converter``).
- Entropy calibration through `quantize_static` equals MinMax (see `ENTROPY_BINS`), so
  its ranges come from ONNX Runtime's `create_calibrator` with more histogram bins and
  reach `quantize_static` through its calibration cache.
- Its histogram calibrators (Entropy, Percentile, Distribution) fail on input sets of
  different shapes; they are given one shape at a time (`_calibrate`).
- `quantize_static` given a ``ModelProto`` saves it with external data in place, so the
  caller's proto ends up pointing at a deleted temporary file; and
  `quant_pre_process` given a ``ModelProto`` fails in its optimizer step. Both are given
  file paths here.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnxruntime.quantization import (
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
from onnxruntime.quantization.shape_inference import quant_pre_process

from routetune.backend import Backend
from routetune.libraries import custom_ops
from routetune.model.loading import name_nodes
from routetune.passes.graph.casts import tidy_casts
from routetune.passes.graph.constants import copy_graph, inferred_types, replace_graph
from routetune.passes.precision.lowering import LOWERED, Lowering
from routetune.plugins.onnxruntime.calibration import (
    MAX_RANGE_RATIO,
    _constants_to_initializers,
    _count_quantized,
    _Feeds,
    _opset,
    low_precision,
    quantized_ops,
    range_mismatches,
)
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

__all__ = ["Fp8Qdq", "Int8Qdq", "quantized_ops", "range_mismatches"]

logger = logging.getLogger(__name__)

WEIGHTED_OPS = ("Conv", "MatMul", "Gemm")
"""The ops whose inputs TensorRT and ONNX Runtime's CPU kernels gain from quantizing."""
QDQ_CHAIN_OPS = WEIGHTED_OPS + (
    "Add", "Mul", "Concat", "Relu", "Clip", "MaxPool", "AveragePool", "GlobalAveragePool",
    "Resize", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
)
"""Weighted ops plus the ones ONNX Runtime's QDQ quantizer handles between them, so that
fewer QuantizeLinear/DequantizeLinear transitions remain."""

FP8_PROVIDERS = frozenset({"TensorrtExecutionProvider"})
"""Execution providers that run FP8 Q/DQ models with FP8 kernels."""

CALIBRATION = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
    "distribution": CalibrationMethod.Distribution,
}

ENTROPY_BINS = {"num_bins": 2048, "num_quantized_bins": 128}
"""Histogram and quantized bins of entropy (KL divergence) calibration, as in TensorRT
(S. Migacz, "8-bit Inference with TensorRT", GTC 2017, which ONNX Runtime's calibrator
cites). `quantize_static` does not pass bin counts on, and with its defaults (128 and
128) the KL search has one candidate, the full range: MinMax again. Coarser histograms
rarely clip either (512 bins kept the full range of a Gaussian input that 2048 clips at
75%). The cost is ONNX Runtime's pure-Python search: about 0.7 s per calibrated tensor
on a 2-core x86 CPU (80 s for ppocr-cls's 108 tensors)."""

HISTOGRAM_CALIBRATION = {"entropy": ENTROPY_BINS, "percentile": {}, "distribution": {}}
"""The calibration methods that build histograms, with the options routetune gives
ONNX Runtime's calibrator (`_calibrate`); the others are `quantize_static`'s own.
Percentile and Distribution take `quantize_static`'s defaults (2048 bins; 99.999th
percentile)."""

_PER_CHANNEL_OPSET = 13
"""First opset whose DequantizeLinear has ``axis`` (ONNX operator spec)."""


def _unproduced_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs that are graph inputs passed through: no node computes them.

    Legal ONNX, but ONNX Runtime's quantizer (1.32, ``onnx_model.topological_sort``)
    raises ``AssertionError: Graph is not a DAG`` on them; the quantizer is given the
    model without them. (An initializer as a graph output is left in: the quantizer
    keeps it, and may quantize a copy for the nodes that read it.)
    """
    inputs = {i.name for i in model.graph.input}
    return {o.name for o in model.graph.output if o.name in inputs}

def _calibrate(model: Path, op_types: tuple[str, ...], method: str,
               feeds: Sequence[Mapping[str, Any]], external: bool, cache: Path) -> int:
    """Calibrate `model` by a histogram method; its ranges written to `cache`.

    ONNX Runtime's histogram collector stacks one tensor's values from every input set
    into one array, which fails on sets whose shapes differ (validation inputs of
    several sequence lengths: "setting an array element with a sequence … inhomogeneous
    shape"). Input sets are therefore given to it in groups of one shape each, in the
    order they come; its collector merges each group's histograms into those before
    (`HistogramCollector.collect`). Sets of one shape make one group: the ranges are
    those `quantize_static` computes.

    Returns:
        The number of groups.
    """
    groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[Mapping[str, Any]]] = {}
    for feed in feeds:
        key = tuple((k, tuple(np.shape(v))) for k, v in sorted(feed.items()))
        groups.setdefault(key, []).append(feed)
    calibrator = create_calibrator(
        model, list(op_types), str(cache.with_name("augmented.onnx")), CALIBRATION[method],
        extra_options=HISTOGRAM_CALIBRATION[method], use_external_data_format=external)
    for group in groups.values():
        calibrator.collect_data(_Feeds(group))
    save_tensors_data(calibrator.compute_data(), cache)
    return len(groups)


class _QdqSeasoning(Seasoning):
    """Shared by ``int8-qdq`` and ``fp8-qdq``; subclasses choose the quantized types."""

    max_range_ratio: ClassVar[float | None] = None

    def quant_types(self) -> tuple[QuantType, QuantType, dict[str, Any]]:
        """The activation type, weight type and extra ``quantize_static`` options."""
        raise NotImplementedError

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Say why not: another backend, a quantized model, a custom op, no op to quantize.

        A custom operator (`routetune.libraries.custom_ops`) declines the route: ONNX
        Runtime's calibrator could not run the model.

        A model is quantized already when its top level holds any of `QUANTIZED_OPS` or a
        ``QLinear*`` op; there is nothing to quantize when no node has an ``op_types`` type.
        """
        reason = super().applicable(graph, backend)
        if reason:
            return reason
        found = quantized_ops(graph)
        if found:
            return (f"the model is quantized already ({', '.join(found)}); "
                    "quantizing it again would stack Q/DQ on quantized tensors")
        custom = custom_ops(graph.nodes)
        if custom:  # calibrate.py: onnxruntime.SessionOptions() with nothing registered
            return (f"the model has custom operators ({', '.join(custom)}), and ONNX "
                    "Runtime's calibrator runs the model in a session of its own that "
                    "registers no custom-op library")
        op_types = self.params["op_types"]
        if not any(n.op in op_types for n in graph.nodes):
            return f"no {'/'.join(op_types)} node to quantize"
        inputs = {t.name for t in graph.inputs}
        if all(t.name in inputs for t in graph.outputs):
            return "every graph output is a graph input: no output is computed"
        return low_precision(graph, op_types)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Quantize `state.graph` with `quantize_static` and copy the result into it.

        Raises:
            ValueError: ``ctx.feeds`` is empty: there is nothing to calibrate on.
            Exception: Whatever ONNX Runtime's quantizer or ``onnx.version_converter``
                raise (the search records it as ``build-failed``).
        """
        if not ctx.feeds:
            raise ValueError(f"{self.info.name} calibrates on the validation inputs; none given")
        p = self.params
        op_types = tuple(p["op_types"])
        low = low_precision(state.graph, op_types)  # after fp16 in a route, say
        if low:
            raise ValueError(low)
        before = copy_graph(state.graph)
        model = gs.export_onnx(state.graph)
        moved = _constants_to_initializers(model)
        outputs = list(model.graph.output)  # the signature, in order
        unproduced = _unproduced_outputs(model)
        if unproduced:  # ONNX Runtime's quantizer asserts "Graph is not a DAG" on them
            if len(unproduced) == len(outputs):
                raise ValueError("every graph output is a graph input: no output is "
                                 "computed, so there is nothing to quantize")
            del model.graph.output[:]
            model.graph.output.extend(o for o in outputs if o.name not in unproduced)
        mismatched: dict[str, str] = {}
        if self.max_range_ratio is not None and p.get("range_check", False):
            found = range_mismatches(model, ctx.feeds, op_types, self.max_range_ratio,
                                     ctx.weights)
            mismatched = {k: v for k, v in found.items() if k not in p["nodes_to_exclude"]}
        notes = [f"{moved} Constant nodes became initializers"] if moved else []
        if p["per_channel"] and _opset(model) < _PER_CHANNEL_OPSET:
            notes.append(f"opset {_opset(model)} -> {_PER_CHANNEL_OPSET} for per-channel axis")
            model = onnx.version_converter.convert_version(model, _PER_CHANNEL_OPSET)
        activation_type, weight_type, extra = self.quant_types()
        if ctx.backend.name == "tensorrt":
            # TensorRT's DequantizeLinear takes FP8/FP4/INT4/INT8 only; ORT would write
            # INT32 biases (its default QuantizeBias=True), which the parser refuses.
            extra = {**extra, "QuantizeBias": False}
            notes.append("biases kept in FP32 (TensorRT dequantizes no INT32)")
        with tempfile.TemporaryDirectory(prefix="routetune-qdq-") as tmp:
            src, pre, out = (str(Path(tmp) / f) for f in ("in.onnx", "pre.onnx", "q.onnx"))
            external = ctx.weights is not None  # over 2 GiB, say: files stay files
            if external:  # onnx refuses links to data files: a copy, next to src
                onnx.load_external_data_for_model(model, str(ctx.weights))
            onnx.save(model, src, save_as_external_data=external,
                      all_tensors_to_one_file=True, location="in.onnx.data")
            # ONNX shape inference only: the optimizer step is routetune's graph stage
            # (fold-constants, fuse-bn-into-conv), and symbolic shape inference needs sympy.
            quant_pre_process(src, pre, skip_optimization=True, skip_symbolic_shape=True,
                              save_as_external_data=external,
                              all_tensors_to_one_file=external)
            cache = Path(tmp) / "ranges.json"
            with contextlib.redirect_stdout(io.StringIO()):  # histogram calibrators print
                if p["calibration"] in HISTOGRAM_CALIBRATION:
                    groups = _calibrate(Path(pre), op_types, p["calibration"], ctx.feeds,
                                        external, cache)
                    if groups > 1:
                        notes.append(f"{p['calibration']} histograms collected over "
                                     f"{groups} groups of input sets of one shape each")
                quantize_static(
                    pre, out, _Feeds(ctx.feeds), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(op_types), per_channel=p["per_channel"],
                    activation_type=activation_type, weight_type=weight_type,
                    nodes_to_exclude=sorted(set(p["nodes_to_exclude"]) | mismatched.keys()),
                    calibrate_method=CALIBRATION[p["calibration"]], extra_options=extra,
                    calibration_cache_path=cache if cache.exists() else None,
                    use_external_data_format=external,
                )
            quantized = onnx.load(out)
        if unproduced:  # back in their places: they pass through, unquantized
            computed = {o.name: o for o in quantized.graph.output}
            del quantized.graph.output[:]
            quantized.graph.output.extend(computed.get(o.name, o) for o in outputs)
            notes.append(f"{len(unproduced)} graph output(s) that pass a graph input "
                         f"through ({', '.join(sorted(unproduced))}) left out of the "
                         "quantizer and kept as they are")
        name_nodes(quantized)  # the quantizer leaves some of its nodes unnamed
        count = _count_quantized(quantized, op_types)
        stats = {
            "quantized_nodes": count,
            "excluded_range_mismatch": len(mismatched),
            "quantize_linear": sum(n.op_type == "QuantizeLinear" for n in quantized.graph.node),
            "dequantize_linear": sum(n.op_type == "DequantizeLinear" for n in quantized.graph.node),
        }
        if mismatched:
            notes.append("excluded for range mismatch: " + "; ".join(mismatched.values()))
        if count == 0:
            return PassResult(False, stats, "; ".join(notes + ["no node was quantized"]))
        new = gs.import_onnx(quantized)
        with inferred_types(new):  # a Cast whose input a DequantizeLinear now feeds
            stats.update(tidy_casts(new))  # may cast to the type it already has
        new.cleanup()
        replace_graph(state.graph, new)
        state.stash[LOWERED] = Lowering(self, before)
        return PassResult(True, stats, "; ".join(notes))


_COMMON_PARAMS = (
    Param("per_channel", (True, False), True, "per-output-channel weight scales",
          finest=True),
    Param("op_types", (WEIGHTED_OPS,), WEIGHTED_OPS,
          "op types to quantize; pin the QDQ chain ops too with "
          "op_types=[" + ",".join(QDQ_CHAIN_OPS) + "]"),
    Param("nodes_to_exclude", ((),), (), "node names to keep in FP32"),
)


class Int8Qdq(_QdqSeasoning):
    """INT8 Q/DQ with weights symmetric signed per channel or per tensor.

    Rules:

    1. Top-level ``Constant(value=...)`` nodes become initializers, so that ONNX Runtime's
       quantizer treats them as weights (it calibrates ``Constant`` outputs as
       activations). With ``per_channel`` a model below opset 13 is converted to 13.
    2. With ``range_check`` (default; a route can pin ``range_check=false``), a
       ``Concat`` or ``Where`` whose data inputs' calibrated max |x| differ by more than
       `MAX_RANGE_RATIO` (10x, from issue 3) is left in FP32 if its op type is quantized,
       and so is every quantized consumer of its output: one INT8 scale for 0..640 has a
       step of about 5, and sigmoid scores in 0..1 would all become 0. Ranges come from
       an FP32 ONNX Runtime run on ``ctx.feeds`` (`range_mismatches`). The excluded
       names go into the note, their count into ``excluded_range_mismatch``.
    3. `quantize_static` (``QuantFormat.QDQ``) quantizes the ``op_types`` nodes not in
       ``nodes_to_exclude`` or rule 2, calibrated on ``ctx.feeds`` with ``calibration``:
       MinMax, Entropy (with `ENTROPY_BINS`) or Percentile (99.999%, ORT's default).
       Weights are ``QInt8`` symmetric. Activations are ``QInt8`` with
       ``ActivationSymmetric=True`` when ``symmetric_activations`` (TensorRT accepts only
       symmetric signed INT8), else ``QUInt8`` asymmetric (the u8s8 form that ONNX
       Runtime's x86 CPU kernels prefer). Weights keep all 8 bits (no ``reduce_range``):
       on x86 CPUs without VNNI, ONNX Runtime's fused per-channel kernels then saturate
       and lose accuracy that the unfused Q/DQ model keeps; the accuracy check sees it.
       For the ``tensorrt`` backend, biases stay FP32 (``QuantizeBias=False``): TensorRT's
       DequantizeLinear takes no INT32 input, and ``symmetric_activations=false`` fails
       the step at once.
    4. The quantized model's nodes, inputs, outputs, opset and domains replace the
       graph's, in place. ``quantized_nodes`` counts ``op_types`` nodes that read a
       DequantizeLinear output; when it is 0 the graph is left alone (``modified=False``).
    """

    info = SeasoningInfo(
        name="int8-qdq", stage="precision",
        backends=frozenset({"onnxruntime", "tensorrt", "openvino"}),
        summary="INT8 Q/DQ via onnxruntime.quantization.quantize_static, calibrated on the inputs",
        params=(
            _COMMON_PARAMS[0],
            Param("calibration", ("minmax",), "minmax",
                  "ONNX Runtime calibration method; entropy (slow: ~1 s per tensor) and "
                  "percentile can be pinned in a route",
                  allowed=("entropy", "percentile")),
            Param("symmetric_activations", (True, False), True,
                  "QInt8 symmetric activations (TensorRT) or QUInt8 asymmetric (CPU)",
                  finest=False),
            *_COMMON_PARAMS[1:],
            Param("range_check", (True,), True,
                  "keep Concat/Where with inputs >10x apart in range in FP32"),
        ),
    )
    max_range_ratio: ClassVar[float | None] = MAX_RANGE_RATIO

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """As `_QdqSeasoning.apply`; refuses asymmetric activations for TensorRT.

        Raises:
            ValueError: ``symmetric_activations=false`` on the ``tensorrt`` backend, whose
                INT8 Q/DQ takes zero points of 0 only.
        """
        if ctx.backend.name == "tensorrt" and not self.params["symmetric_activations"]:
            raise ValueError("TensorRT takes only symmetric INT8 (zero point 0); "
                             "use symmetric_activations=true")
        return super().apply(state, ctx)

    def quant_types(self) -> tuple[QuantType, QuantType, dict[str, Any]]:
        """QInt8 weights; QInt8 symmetric or QUInt8 asymmetric activations."""
        symmetric = bool(self.params["symmetric_activations"])
        activation = QuantType.QInt8 if symmetric else QuantType.QUInt8
        return activation, QuantType.QInt8, {"ActivationSymmetric": symmetric,
                                             "WeightSymmetric": True}


class Fp8Qdq(_QdqSeasoning):
    """FP8 (float8e4m3fn) Q/DQ, for backends with FP8 kernels.

    Rules:

    1. As `Int8Qdq` rule 1, except that ONNX Runtime's quantizer itself raises the opset
       to 19 (the first with float8 QuantizeLinear). No range check: FP8 keeps a
       per-value exponent, so 0..640 and 0..1 share a scale and the scores keep FP8's
       3-bit mantissa instead of becoming 0.
    2. `quantize_static` with ``QuantType.QFLOAT8E4M3FN`` for weights and activations and
       ``CalibrationMethod.Distribution``, the only method it accepts for float types.
    3. Not applicable unless the backend's execution provider is in `FP8_PROVIDERS`.
       ONNX Runtime's CPU provider runs the result (its QuantizeLinear/DequantizeLinear
       have float8 kernels) but keeps Conv/MatMul in FP32 between them: the FP8 error
       is emulated and the engine can only be slower.
    """

    info = SeasoningInfo(
        name="fp8-qdq", stage="precision", backends=frozenset({"onnxruntime", "tensorrt"}),
        summary="FP8 (e4m3fn) Q/DQ via onnxruntime.quantization; needs FP8 kernels "
                "(TensorRT on compute capability 8.9+, or ORT's TensorRT provider)",
        params=(
            _COMMON_PARAMS[0],
            Param("calibration", ("distribution",), "distribution",
                  "ONNX Runtime accepts only Distribution calibration for FP8"),
            *_COMMON_PARAMS[1:],
        ),
    )

    def quant_types(self) -> tuple[QuantType, QuantType, dict[str, Any]]:
        """float8e4m3fn for both, symmetric (FP8 Q/DQ has zero point 0)."""
        return QuantType.QFLOAT8E4M3FN, QuantType.QFLOAT8E4M3FN, {"ActivationSymmetric": True}

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """A reason unless the backend runs on an FP8-capable provider (rule 3)."""
        if backend.name == "onnxruntime":  # for other backends the base class says why
            provider = backend.full_settings({})["onnxruntime.execution_provider"]
            if provider not in FP8_PROVIDERS:
                return (f"ONNX Runtime's {provider} has no FP8 (float8e4m3fn) kernels for "
                        "Conv/MatMul: an FP8 Q/DQ model runs there only as FP32 compute "
                        "between float8 Quantize/DequantizeLinear, never faster; FP8 Q/DQ "
                        "needs TensorRT on a GPU with FP8 support (compute capability 8.9+)")
        return super().applicable(graph, backend)
