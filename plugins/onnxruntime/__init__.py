"""ONNX Runtime integration: the CPU and CUDA backends, and their seasonings.

Session and CUDA provider options as build seasonings (`session_options`,
`cuda_options`), the Q/DQ seasonings (`quantize`), int4 and int8 weight-only
quantization (`weight_only`), and the fusions into ONNX Runtime's
contrib operators (`transformer_fusion`, `attention_fusion`).
"""

from __future__ import annotations

from routetune import hookimpl
from routetune.plugins.onnxruntime import cuda_options, session_options
from routetune.plugins.onnxruntime.attention_fusion import AttentionFusion
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.onnxruntime.cuda import OnnxRuntimeCudaBackend
from routetune.plugins.onnxruntime.quantize import Fp8Qdq, Int8Qdq
from routetune.plugins.onnxruntime.transformer_fusion import TransformerFusion
from routetune.plugins.onnxruntime.weight_only import Int4Weights, Int8Weights
from routetune.registry import Registry


@hookimpl
def routetune_register_backends(registry: Registry) -> None:
    """Register the ONNX Runtime backends: CPU (the FP32 reference) and CUDA."""
    registry.add_backend(OnnxRuntimeBackend, reference=True)
    registry.add_backend(OnnxRuntimeCudaBackend)


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the session and CUDA provider options, Q/DQ and transformer fusion.

    The Q/DQ seasonings are ``int8-qdq`` and ``fp8-qdq``; ``int4-weights`` and
    ``int8-weights`` write weight-only ``MatMulNBits``; ``ort-transformer-fusion``
    runs ONNX Runtime's transformer optimizer; ``fuse-attention`` writes exported
    attention blocks as ``MultiHeadAttention``.

    ``ort-cuda-flag`` is registered lazily: its choices come from the installed CUDA
    provider, which a run on another backend never starts.
    """
    for cls in session_options.SEASONINGS + cuda_options.SEASONINGS:
        registry.add_seasoning(cls)
    registry.add_lazy_seasoning("ort-cuda-flag", cuda_options.CUDA, cuda_options.make_cuda_flag)
    registry.add_seasoning(Int8Qdq)
    registry.add_seasoning(Fp8Qdq)
    registry.add_seasoning(Int4Weights)
    registry.add_seasoning(Int8Weights)
    registry.add_seasoning(TransformerFusion)
    registry.add_seasoning(AttentionFusion)
