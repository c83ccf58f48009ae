"""``ort-transformer-fusion``: ONNX Runtime's transformer optimizer as a graph seasoning.

`onnxruntime.transformers.optimizer.optimize_model` rewrites the patterns that exporters
write for transformer blocks into ONNX Runtime's fused ``com.microsoft`` operators:
LayerNormalization and SkipLayerNormalization, Gelu and BiasGelu, Attention and
MultiHeadAttention, EmbedLayerNormalization. Those run as single kernels on the CPU and
CUDA providers (not on TensorRT, which has no such operators). Only the fusions run
(``opt_level=0``): ONNX Runtime's own graph optimisations are the session's
(``ort-opt-level``). The fused-operator counts go into the trial's pass record.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter

import onnx_graphsurgeon as gs

from routetune.backend import Backend
from routetune.errors import describe
from routetune.passes.graph.constants import replace_graph
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

MODEL_TYPES = ("auto", "bert", "vit", "gpt2", "bart", "t5", "clip", "swin")
"""The optimizer's model types offered (``auto``: `detect_model_type`); the full list is
``onnxruntime.transformers.optimizer.MODEL_TYPES``."""

MARKERS = frozenset({"Softmax", "LayerNormalization", "Erf", "ReduceMean"})
"""Operators of which a transformer block holds at least one (attention's Softmax, a
LayerNorm, decomposed or not, GELU's Erf): without any, nothing can be fused."""


def detect_model_type(graph: gs.Graph) -> str:
    """The optimizer's model type for `graph`: ``vit`` or ``bert``.

    ``vit`` for an image model (a rank-4 input and a Conv, the patch embedding), else
    ``bert`` (ONNX Runtime's choice for encoders, the most common export).
    """
    images = any(len(t.shape or ()) == 4 for t in graph.inputs)
    return "vit" if images and any(n.op == "Conv" for n in graph.nodes) else "bert"


class TransformerFusion(Seasoning):
    """Fuse transformer blocks into ONNX Runtime's ``com.microsoft`` operators."""

    info = SeasoningInfo(
        name="ort-transformer-fusion", stage="graph",
        backends=frozenset({"onnxruntime", "onnxruntime-cuda"}),
        summary="ONNX Runtime's transformer optimizer: fused attention, LayerNorm, GELU",
        params=(Param("model_type", MODEL_TYPES, "auto",
                      "the optimizer's model type; auto: vit for an image input with a "
                      "Conv, else bert"),))

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: no operator of a transformer block in the model."""
        if not any(node.op in MARKERS for node in graph.nodes):
            return f"no {', '.join(sorted(MARKERS))} in the model: no transformer block"
        return None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Run the optimizer's fusions on the graph and count what they fused.

        Raises:
            ValueError: A model with external data (the optimizer reads one file), or
                the optimizer failed on the model (its own assertion or error, with
                where it was raised: ``build-failed``, the pass declined).
        """
        from onnxruntime.transformers.optimizer import optimize_model

        if ctx.weights is not None:
            raise ValueError("ort-transformer-fusion takes models in one file (this one "
                             "keeps its weights as external data)")
        graph = state.model_graph()
        model_type = str(self.params["model_type"])
        if model_type == "auto":
            model_type = detect_model_type(graph)
        quiet = logging.getLogger("onnxruntime.transformers")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it logs every fusion it tries at INFO
        model = gs.export_onnx(graph)
        had = Counter(node.op_type for node in model.graph.node)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                optimized = optimize_model(model, model_type=model_type, opt_level=0,
                                           use_gpu=ctx.backend.name == "onnxruntime-cuda")
        except Exception as e:  # its own assertions on a legal model: declined, with why
            raise ValueError(f"ONNX Runtime's transformer optimizer (model type "
                             f"{model_type}) failed on this model: {describe(e, where=True)}"
                             ) from e
        finally:
            quiet.setLevel(level)
        # the optimizer counts the operators its fusions write wherever they are, those
        # the export had already included (opset 17's LayerNormalization, 20's Gelu)
        counted = optimized.get_fused_operator_statistics()
        stats = {k: int(v) - had[k] for k, v in counted.items() if int(v) > had[k]}
        if not stats:
            already = ", ".join(f"{k} {had[k]}" for k in sorted(counted) if had[k])
            return PassResult(False, {}, f"nothing fused (model type {model_type})"
                              + (f"; the export has {already} already" if already else ""))
        replace_graph(graph, gs.import_onnx(optimized.model))
        return PassResult(True, stats, f"model type {model_type}")
