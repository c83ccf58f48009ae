"""ONNX Runtime CUDA provider seasonings: one provider option each.

Each sets ``onnxruntime.cuda.<option>`` of the ``onnxruntime-cuda`` backend (see
``routetune.plugins.onnxruntime.cuda``), declared as data (`option_seasoning`); none
imports onnxruntime. An option that the installed provider does not report is missing
from the backend's options, and the seasoning is then not applicable, with that reason.
Option meanings: ONNX Runtime documentation, "CUDA Execution Provider", configuration
options.
"""

from __future__ import annotations

from routetune.option_seasoning import FromParam, option_seasoning
from routetune.seasoning import Param, ParamValue, SeasoningInfo

CUDA_NS = "onnxruntime.cuda."
CUDA = frozenset({"onnxruntime-cuda"})


def _flag(value: ParamValue) -> str:
    """A provider option's boolean as the provider writes it: ``"1"`` or ``"0"``."""
    return "1" if value else "0"


CudaNhwc = option_seasoning("CudaNhwc", SeasoningInfo(
    name="ort-cuda-nhwc", stage="build", backends=CUDA,
    summary="CUDA provider: prefer the NHWC layout"),
    {CUDA_NS + "prefer_nhwc": "1"},
    """Run convolutions in NHWC (``prefer_nhwc=1``); tensor cores favour it.""")

CudaGraph = option_seasoning("CudaGraph", SeasoningInfo(
    name="ort-cuda-graph", stage="build", backends=CUDA,
    summary="CUDA provider: replay the run as a CUDA graph"),
    {CUDA_NS + "enable_cuda_graph": "1"},
    """Capture the run as one CUDA graph and replay it (``enable_cuda_graph=1``).

    Kernel launches then cost one graph launch; the model must run wholly on the GPU
    with static shapes, or the build fails (recorded as such).
    """)

CudaConvAlgo = option_seasoning("CudaConvAlgo", SeasoningInfo(
    name="ort-cuda-conv-algo", stage="build", backends=CUDA,
    summary="CUDA provider: cuDNN convolution algorithm search",
    params=(Param("search", ("HEURISTIC", "DEFAULT"), "HEURISTIC",
                  "cudnn_conv_algo_search other than the default EXHAUSTIVE"),)),
    {CUDA_NS + "cudnn_conv_algo_search": FromParam("search", str)},
    """How cuDNN picks convolution algorithms (``cudnn_conv_algo_search``).

    The provider's default, EXHAUSTIVE, benchmarks every algorithm at build time;
    HEURISTIC and DEFAULT build faster and may run slower.
    """)

CudaNoTf32 = option_seasoning("CudaNoTf32", SeasoningInfo(
    name="ort-cuda-no-tf32", stage="build", backends=CUDA,
    summary="CUDA provider: full-precision FP32 math (no TF32)"),
    {CUDA_NS + "use_tf32": "0"},
    """Turn TF32 tensor-core math off for FP32 MatMul/Conv (``use_tf32=0``).

    TF32 (the default) rounds FP32 inputs to 10 mantissa bits; off, FP32 is exact and
    about twice as slow (5.36 vs 11.94 ms, ResNet-50 on an H200).
    """)

CudaSmallWorkspace = option_seasoning("CudaSmallWorkspace", SeasoningInfo(
    name="ort-cuda-small-workspace", stage="build", backends=CUDA,
    summary="CUDA provider: cuDNN without its largest workspace"),
    {CUDA_NS + "cudnn_conv_use_max_workspace": "0"},
    """Limit cuDNN's workspace (``cudnn_conv_use_max_workspace=0``): less memory, maybe slower.""")

CudaTunableOp = option_seasoning("CudaTunableOp", SeasoningInfo(
    name="ort-cuda-tunable-op", stage="build", backends=CUDA,
    summary="CUDA provider: TunableOp kernels",
    params=(Param("tuning", (True, False), True,
                  "tunable_op_tuning_enable: tune kernels on the first runs"),)),
    {CUDA_NS + "tunable_op_enable": "1",
     CUDA_NS + "tunable_op_tuning_enable": FromParam("tuning", _flag)},
    """Use TunableOp kernels (``tunable_op_enable=1``), tuned online or not.""")

SEASONINGS = (CudaNhwc, CudaGraph, CudaConvAlgo, CudaNoTf32, CudaSmallWorkspace,
              CudaTunableOp)
