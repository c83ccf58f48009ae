"""TensorRT builder seasonings: one ``IBuilderConfig`` knob each, and CUDA graph replay.

Each sets a ``tensorrt.*`` option of the ``tensorrt`` backend
(`routetune.plugins.tensorrt.backend`); none imports TensorRT. Meanings: TensorRT 11
Python API, ``IBuilderConfig`` (pyCoreDoc.h). Precision is not a builder option in
TensorRT 11 (strongly typed networks); it comes from the ONNX graph (``fp16``,
``int8-qdq`` …).
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

NS = "tensorrt."
TENSORRT = frozenset({"tensorrt"})


class _TrtOption(Seasoning):
    """Sets one backend option from one parameter; applies whatever the model."""

    option: ClassVar[str]
    param: ClassVar[str]

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """`supports`, whatever the model."""
        return self.supports(backend)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the option to the parameter's value."""
        return set_options(state, {NS + self.option: self.params[self.param]})


class TrtOptLevel(_TrtOption):
    """``builder_optimization_level`` (TensorRT's default 3).

    0 takes the first tactic that works and ignores the timing cache; 3 decides
    heuristically whether to compile a kernel; 4 always compiles one; 5 compiles one and
    compares it with the static kernels (pyCoreDoc.h). Higher levels build slower.
    """

    info = SeasoningInfo(
        name="trt-opt-level", stage="build", backends=TENSORRT,
        summary="TensorRT builder optimisation level (TensorRT's default is 3; the bare "
                "step means 5)",
        params=(Param("level", (5, 4, 2, 1, 0), 5,
                      "builder_optimization_level other than the default 3",
                      allowed=(0, 1, 2, 3, 4, 5)),))
    option, param = "builder_optimization_level", "level"


class TrtTiling(_TrtOption):
    """``tiling_optimization_level``: how hard the builder searches tilings (default none)."""

    info = SeasoningInfo(
        name="trt-tiling", stage="build", backends=TENSORRT,
        summary="TensorRT tiling optimisation level (default none; the bare step: fast)",
        params=(Param("level", ("fast", "moderate", "full"), "fast",
                      "TilingOptimizationLevel other than the default NONE",
                      allowed=("none", "fast", "moderate", "full")),))
    option, param = "tiling_optimization_level", "level"


class TrtAuxStreams(_TrtOption):
    """``max_aux_streams``: auxiliary streams for parallel layers (default -1: TensorRT picks)."""

    info = SeasoningInfo(
        name="trt-aux-streams", stage="build", backends=TENSORRT,
        summary="TensorRT auxiliary streams (default: TensorRT picks; the bare step: 0)",
        params=(Param("count", (0, 1, 2, 4), 0,
                      "max_aux_streams; 0 runs every layer on the main stream",
                      allowed=tuple(range(-1, 17))),))
    option, param = "max_aux_streams", "count"


class TrtTf32(_TrtOption):
    """The TF32 builder flag: TF32 tensor-core math for FP32 Conv/MatMul (on by default).

    Off, FP32 layers compute in full FP32: slower, and exact to FP32.
    """

    info = SeasoningInfo(
        name="trt-tf32", stage="build", backends=TENSORRT,
        summary="TensorRT TF32 flag: the bare step turns TF32 off (on by default)",
        params=(Param("enabled", (False,), False, "BuilderFlag.TF32",
                      allowed=(False, True)),))
    option, param = "tf32", "enabled"


class TrtCudaGraph(_TrtOption):
    """Capture the engine's enqueue (``execute_async_v3``) in a CUDA graph and replay it.

    A runtime option, not a builder one: the engine is the same, and each run costs one
    graph launch instead of one launch per kernel.
    """

    info = SeasoningInfo(
        name="trt-cuda-graph", stage="build", backends=TENSORRT,
        summary="TensorRT: replay the enqueue as a CUDA graph",
        params=(Param("enabled", (True,), True, "capture execute_async_v3 in a CUDA graph",
                      allowed=(True, False)),))
    option, param = "cuda_graph", "enabled"


SEASONINGS = (TrtOptLevel, TrtTiling, TrtAuxStreams, TrtTf32, TrtCudaGraph)
