"""``nncf-int4``: int4 weight-only compression with NNCF, for the openvino backend.

``nncf.compress_weights`` on the route's ONNX model (NNCF's ONNX backend; the ``[nncf]``
extra): each constant MatMul weight becomes 4-bit integers in groups of ``group_size``
along K with a scale per group (and a zero point, asymmetric), written as ONNX Runtime's
``com.microsoft:MatMulNBits``, which OpenVINO's ONNX frontend reads and runs with its own
int4 kernels. Data-free: NNCF's default, no calibration. With ``ratio`` below 1 the
least sensitive share of the weights (by NNCF's weight-based criterion) gets int4 and
the rest its INT8 backup; NNCF also keeps the embedding and the last MatMul in INT8
unless every layer is asked for (its ``all_layers=False`` default, kept here).
The model stays ONNX, so the accuracy check, the trial store and ``routetune build``
treat it as any other precision step. NNCF sends no telemetry (`nncf_quantize`).
"""

from __future__ import annotations

from typing import Any

import onnx_graphsurgeon as gs

from routetune.backend import Backend
from routetune.model.loading import name_nodes
from routetune.passes.graph.constants import replace_graph
from routetune.plugins.onnxruntime.weight_only import weight_only_declined
from routetune.plugins.openvino.nncf_quantize import nncf_and_model, nncf_missing
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

MIN_OPSET = 13
"""NNCF's ONNX weight compression refuses models below opset 13 (per-channel axes)."""


class NncfInt4(Seasoning):
    """int4 weight-only compression with ``nncf.compress_weights``, for OpenVINO.

    Rules:

    1. Offered on the ``openvino`` backend where nncf imports, for a model of opset 13
       or more whose constant MatMul weights hold at least half of its weight bytes
       (`routetune.plugins.onnxruntime.weight_only.weight_only_declined`).
    2. ``nncf.compress_weights(model, mode=INT4_SYM, group_size=..., ratio=...)``,
       data-free. ``mode=int4_asym`` can be pinned but is not searched: NNCF 3.4 writes
       its zero points one per byte (``[N, groups]`` uint8) where ``MatMulNBits`` packs
       two a byte (``[N, ceil(groups / 2)]``), so ONNX Runtime refuses the model and
       OpenVINO computes wrong values (rel-L2 1.29 on a 2-layer test MLP).
    3. The pass record counts ``quantized_nodes`` (MatMulNBits written); with none, the
       graph is left alone (``modified=False``).
    """

    info = SeasoningInfo(
        name="nncf-int4", stage="precision", backends=frozenset({"openvino"}),
        conflicts=frozenset({"int8-qdq", "fp8-qdq", "nncf-int8"}),  # one quantizer a route
        summary="int4 weight-only MatMul weights via NNCF (nncf.compress_weights), data-free",
        params=(
            Param("mode", ("int4_sym",), "int4_sym",
                  "symmetric groups; int4_asym (a zero point per group) only pinned: "
                  "NNCF 3.4 writes its zero points unpacked", allowed=("int4_asym",)),
            Param("group_size", (32,), 32, "weights per group along K",
                  allowed=(64, 128)),
            Param("ratio", (1.0,), 1.0,
                  "share of the weights in int4; the rest in INT8", allowed=(0.8, 0.9)),
        ),
        after=frozenset({"fp16", "bf16"}),
    )

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: another backend, no nncf, an old opset, too few MatMul weights."""
        reason = super().applicable(graph, backend) or nncf_missing()
        if reason:
            return reason
        opset = graph.opset or 0
        if opset < MIN_OPSET:
            return (f"opset {opset}: NNCF compresses ONNX weights from opset {MIN_OPSET}; "
                    "convert the model first (onnx.version_converter)")
        return weight_only_declined(graph)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Compress the MatMul weights with NNCF and copy the result into the graph.

        Raises:
            Exception: Whatever NNCF raises (the search records ``build-failed``).
        """
        nncf, model = nncf_and_model(state, ctx)
        p = self.params
        mode = {"int4_asym": nncf.CompressWeightsMode.INT4_ASYM,
                "int4_sym": nncf.CompressWeightsMode.INT4_SYM}[str(p["mode"])]
        compressed: Any = nncf.compress_weights(model, mode=mode,
                                                group_size=int(p["group_size"]),
                                                ratio=float(p["ratio"]))
        name_nodes(compressed)
        count = sum(n.op_type == "MatMulNBits" for n in compressed.graph.node)
        stats = {"quantized_nodes": count,
                 "int8_backup": sum(n.op_type == "DequantizeLinear"
                                    for n in compressed.graph.node)}
        if count == 0:
            return PassResult(False, stats, "NNCF compressed no MatMul weight")
        new = gs.import_onnx(compressed)
        new.cleanup()
        replace_graph(state.model_graph(), new)
        return PassResult(True, stats, f"NNCF {nncf.__version__}, {p['mode']}, group "
                          f"{p['group_size']}, ratio {p['ratio']}: {count} MatMuls in int4")
