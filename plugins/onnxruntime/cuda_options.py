"""ONNX Runtime CUDA provider seasonings: one provider option each.

Each sets ``onnxruntime.cuda.<option>`` of the ``onnxruntime-cuda`` backend (see
``routetune.plugins.onnxruntime.cuda``); none imports onnxruntime. An option that the
installed provider does not report is missing from the backend's options, and the
seasoning is then not applicable, with that reason. Option meanings: ONNX Runtime
documentation, "CUDA Execution Provider", configuration options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
    set_options,
)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from routetune.backend import Backend

CUDA_NS = "onnxruntime.cuda."
CUDA = frozenset({"onnxruntime-cuda"})


class _CudaOption(Seasoning):
    """Sets CUDA provider options; not applicable when the provider lacks one."""

    options: ClassVar[tuple[str, ...]]

    def values(self) -> dict[str, str]:
        """The option values this step sets, by option name."""
        raise NotImplementedError

    def supports(self, backend: Backend) -> str | None:
        """Why not: another backend, or an option the installed provider does not know."""
        reason = super().supports(backend)
        if reason:
            return reason
        known = backend.options()
        missing = [o for o in self.options if CUDA_NS + o not in known]
        if missing:
            return (f"the installed CUDA provider does not know {', '.join(missing)} "
                    "(onnxruntime-gpu too old?)")
        return None

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """`supports`, whatever the model."""
        return self.supports(backend)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the options."""
        return set_options(state, {CUDA_NS + k: v for k, v in self.values().items()})


class CudaNhwc(_CudaOption):
    """Run convolutions in NHWC (``prefer_nhwc=1``); tensor cores favour it."""

    info = SeasoningInfo(name="ort-cuda-nhwc", stage="build", backends=CUDA,
                         summary="CUDA provider: prefer the NHWC layout")
    options = ("prefer_nhwc",)

    def values(self) -> dict[str, str]:
        """``prefer_nhwc=1``."""
        return {"prefer_nhwc": "1"}


class CudaGraph(_CudaOption):
    """Capture the run as one CUDA graph and replay it (``enable_cuda_graph=1``).

    Kernel launches then cost one graph launch; the model must run wholly on the GPU
    with static shapes, or the build fails (recorded as such).
    """

    info = SeasoningInfo(name="ort-cuda-graph", stage="build", backends=CUDA,
                         summary="CUDA provider: replay the run as a CUDA graph")
    options = ("enable_cuda_graph",)

    def values(self) -> dict[str, str]:
        """``enable_cuda_graph=1``."""
        return {"enable_cuda_graph": "1"}


class CudaConvAlgo(_CudaOption):
    """How cuDNN picks convolution algorithms (``cudnn_conv_algo_search``).

    The provider's default, EXHAUSTIVE, benchmarks every algorithm at build time;
    HEURISTIC and DEFAULT build faster and may run slower.
    """

    info = SeasoningInfo(
        name="ort-cuda-conv-algo", stage="build", backends=CUDA,
        summary="CUDA provider: cuDNN convolution algorithm search",
        params=(Param("search", ("HEURISTIC", "DEFAULT"), "HEURISTIC",
                      "cudnn_conv_algo_search other than the default EXHAUSTIVE"),))
    options = ("cudnn_conv_algo_search",)

    def values(self) -> dict[str, str]:
        """``cudnn_conv_algo_search=<search>``."""
        return {"cudnn_conv_algo_search": str(self.params["search"])}


class CudaNoTf32(_CudaOption):
    """Turn TF32 tensor-core math off for FP32 MatMul/Conv (``use_tf32=0``).

    TF32 (the default) rounds FP32 inputs to 10 mantissa bits; off, FP32 is exact and
    about twice as slow (5.36 vs 11.94 ms, ResNet-50 on an H200).
    """

    info = SeasoningInfo(name="ort-cuda-no-tf32", stage="build", backends=CUDA,
                         summary="CUDA provider: full-precision FP32 math (no TF32)")
    options = ("use_tf32",)

    def values(self) -> dict[str, str]:
        """``use_tf32=0``."""
        return {"use_tf32": "0"}


class CudaSmallWorkspace(_CudaOption):
    """Limit cuDNN's workspace (``cudnn_conv_use_max_workspace=0``): less memory, maybe slower."""

    info = SeasoningInfo(name="ort-cuda-small-workspace", stage="build", backends=CUDA,
                         summary="CUDA provider: cuDNN without its largest workspace")
    options = ("cudnn_conv_use_max_workspace",)

    def values(self) -> dict[str, str]:
        """``cudnn_conv_use_max_workspace=0``."""
        return {"cudnn_conv_use_max_workspace": "0"}


class CudaTunableOp(_CudaOption):
    """Use TunableOp kernels (``tunable_op_enable=1``), tuned online or not."""

    info = SeasoningInfo(
        name="ort-cuda-tunable-op", stage="build", backends=CUDA,
        summary="CUDA provider: TunableOp kernels",
        params=(Param("tuning", (True, False), True,
                      "tunable_op_tuning_enable: tune kernels on the first runs"),))
    options = ("tunable_op_enable", "tunable_op_tuning_enable")

    def values(self) -> dict[str, str]:
        """``tunable_op_enable=1`` and ``tunable_op_tuning_enable`` from ``tuning``."""
        return {"tunable_op_enable": "1",
                "tunable_op_tuning_enable": "1" if self.params["tuning"] else "0"}


SEASONINGS = (CudaNhwc, CudaGraph, CudaConvAlgo, CudaNoTf32, CudaSmallWorkspace,
              CudaTunableOp)
