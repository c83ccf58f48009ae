"""``nncf-int8``: INT8 post-training quantization with NNCF, for the openvino backend.

NNCF (``nncf`` on PyPI, the ``[nncf]`` extra: 226 MB installed with scipy and
scikit-learn, measured in a fresh venv) quantizes the ONNX model itself
(``nncf.quantize`` on an ``onnx.ModelProto``): it inserts QuantizeLinear/
DequantizeLinear pairs where OpenVINO's CPU plugin runs INT8 kernels, calibrated on the
validation inputs, and corrects biases. The route's model stays ONNX, so the accuracy
check, the trial store and ``routetune build`` treat it as any other precision step.

NNCF sends usage telemetry (openvino-telemetry) unless told not to; routetune sends
nothing anywhere (SECURITY.md), so ``NNCF_CI`` is set before nncf is imported, the
switch NNCF's telemetry wrapper reads (``nncf/telemetry/wrapper.py``). nncf is imported
only when this step runs.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

import onnx
import onnx_graphsurgeon as gs

from routetune.install import pip_install
from routetune.model.loading import name_nodes
from routetune.passes.graph.constants import replace_graph
from routetune.plugins.onnxruntime.calibration import low_precision, quantized_ops
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

if TYPE_CHECKING:
    from routetune.backend import Backend

WEIGHTED_OPS = ("Conv", "MatMul", "Gemm", "ConvTranspose")
"""Ops whose inputs NNCF quantizes for OpenVINO's CPU (its default INT8 pattern set)."""


def nncf_missing() -> str | None:
    """Why nncf cannot run here (not installed, with the install line), or None."""
    if importlib.util.find_spec("nncf") is None:
        return f"NNCF is not installed: {pip_install('nncf')}"
    return None


def nncf_and_model(state: RouteState, ctx: RouteContext) -> tuple[Any, onnx.ModelProto]:
    """NNCF, imported with its telemetry off (module docstring), and the route's model.

    The model holds its weights: one over 2 GiB has its external data loaded, since NNCF
    reads one ``ModelProto``.
    """
    os.environ.setdefault("NNCF_CI", "1")
    import nncf

    model = gs.export_onnx(state.model_graph())
    if ctx.weights is not None:
        onnx.load_external_data_for_model(model, str(ctx.weights))
    return nncf, model


class NncfInt8(Seasoning):
    """INT8 with NNCF post-training quantization (``nncf.quantize``), for OpenVINO.

    Rules:

    1. Not applicable without nncf, on a model quantized already, on one without a
       `WEIGHTED_OPS` node, or on one whose weighted nodes compute in float16/bfloat16.
    2. ``nncf.quantize(model, nncf.Dataset(feeds), subset_size=len(feeds),
       preset=..., model_type=..., fast_bias_correction=..., ignored_scope=...)``: every
       validation input set calibrates (NNCF's default subset is 300). ``preset``
       ``performance`` quantizes weights and activations symmetrically, ``mixed``
       activations asymmetrically (for non-ReLU activations); ``model_type=transformer``
       applies NNCF's transformer rules (no quantized Add, Softmax, LayerNorm inputs);
       ``ignored_types`` and ``ignored_names`` stay FP32 (NNCF's ``IgnoredScope``).
    3. The quantized model's graph replaces the route's. ``quantized_nodes`` counts
       `WEIGHTED_OPS` nodes that read a DequantizeLinear output; with none, the graph is
       left alone (``modified=False``).
    """

    info = SeasoningInfo(
        name="nncf-int8", stage="precision", backends=frozenset({"openvino"}),
        conflicts=frozenset({"int8-qdq", "fp8-qdq"}),  # one quantizer per route
        summary="INT8 via NNCF post-training quantization (nncf.quantize), calibrated on "
                "the inputs",
        params=(
            Param("preset", ("performance", "mixed"), "performance",
                  "symmetric (performance) or asymmetric (mixed) activations",
                  finest="mixed"),
            Param("model_type", ("default",), "default",
                  "transformer: NNCF's rules for attention models", allowed=("transformer",)),
            Param("fast_bias_correction", (True,), True,
                  "NNCF's fast bias correction; false: the slower full one",
                  allowed=(False,)),
            Param("ignored_op_types", ((),), (), "op types NNCF keeps in FP32"),
            Param("ignored_names", ((),), (), "node names NNCF keeps in FP32"),
        ),
    )

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: another backend, no nncf, a quantized or float16 model, no weighted op."""
        reason = super().applicable(graph, backend) or nncf_missing()
        if reason:
            return reason
        found = quantized_ops(graph)
        if found:
            return f"the model is quantized already ({', '.join(found)})"
        if not any(n.op in WEIGHTED_OPS for n in graph.nodes):
            return f"no {'/'.join(WEIGHTED_OPS)} node to quantize"
        return low_precision(graph, WEIGHTED_OPS)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Quantize `state.graph` with NNCF and copy the result into it.

        Raises:
            ValueError: ``ctx.feeds`` is empty: there is nothing to calibrate on.
            Exception: Whatever NNCF raises (the search records ``build-failed``).
        """
        if not ctx.feeds:
            raise ValueError("nncf-int8 calibrates on the validation inputs; none given")
        nncf, model = nncf_and_model(state, ctx)
        p = self.params
        names, types = list(p["ignored_names"]), list(p["ignored_op_types"])
        scope = nncf.IgnoredScope(names=names, types=types, validate=False)
        quantized: Any = nncf.quantize(
            model, nncf.Dataset(list(ctx.feeds)), subset_size=len(ctx.feeds),
            preset=nncf.QuantizationPreset(p["preset"]),
            model_type=nncf.ModelType.TRANSFORMER if p["model_type"] == "transformer" else None,
            fast_bias_correction=bool(p["fast_bias_correction"]), ignored_scope=scope)
        name_nodes(quantized)
        dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear"
                       for o in n.output}
        count = sum(n.op_type in WEIGHTED_OPS and any(i in dequantized for i in n.input)
                    for n in quantized.graph.node)
        stats = {"quantized_nodes": count,
                 "quantize_linear": sum(n.op_type == "QuantizeLinear"
                                        for n in quantized.graph.node),
                 "dequantize_linear": sum(n.op_type == "DequantizeLinear"
                                          for n in quantized.graph.node)}
        if count == 0:
            return PassResult(False, stats, "NNCF quantized no node")
        new = gs.import_onnx(quantized)
        new.cleanup()
        replace_graph(state.graph, new)
        return PassResult(True, stats, f"NNCF {nncf.__version__}, preset {p['preset']}")
