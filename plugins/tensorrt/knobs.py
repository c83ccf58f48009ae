"""TensorRT builder seasonings: one ``IBuilderConfig`` knob each, and CUDA graph replay.

Each sets a ``tensorrt.*`` option of the ``tensorrt`` backend
(`routetune.plugins.tensorrt.backend`), declared as data (`option_seasoning`); none
imports TensorRT. Meanings: TensorRT 11 Python API, ``IBuilderConfig`` (pyCoreDoc.h).
Precision is not a builder option in TensorRT 11 (strongly typed networks); it comes
from the ONNX graph (``fp16``, ``int8-qdq`` …).
"""

from __future__ import annotations

from routetune.option_seasoning import FromParam, option_seasoning
from routetune.seasoning import Param, SeasoningInfo

NS = "tensorrt."
TENSORRT = frozenset({"tensorrt"})

TrtOptLevel = option_seasoning("TrtOptLevel", SeasoningInfo(
    name="trt-opt-level", stage="build", backends=TENSORRT,
    summary="TensorRT builder optimisation level (TensorRT's default is 3; the bare "
            "step means 5)",
    params=(Param("level", (5, 4, 2, 1, 0), 5,
                  "builder_optimization_level other than the default 3",
                  allowed=(0, 1, 2, 3, 4, 5)),)),
    {NS + "builder_optimization_level": FromParam("level")},
    """``builder_optimization_level`` (TensorRT's default 3).

    0 takes the first tactic that works and ignores the timing cache; 3 decides
    heuristically whether to compile a kernel; 4 always compiles one; 5 compiles one and
    compares it with the static kernels (pyCoreDoc.h). Higher levels build slower.
    """)

TrtTiling = option_seasoning("TrtTiling", SeasoningInfo(
    name="trt-tiling", stage="build", backends=TENSORRT,
    summary="TensorRT tiling optimisation level (default none; the bare step: fast)",
    params=(Param("level", ("fast", "moderate", "full"), "fast",
                  "TilingOptimizationLevel other than the default NONE",
                  allowed=("none", "fast", "moderate", "full")),)),
    {NS + "tiling_optimization_level": FromParam("level")},
    """``tiling_optimization_level``: how hard the builder searches tilings (default none).""")

TrtAuxStreams = option_seasoning("TrtAuxStreams", SeasoningInfo(
    name="trt-aux-streams", stage="build", backends=TENSORRT,
    summary="TensorRT auxiliary streams (default: TensorRT picks; the bare step: 0)",
    params=(Param("count", (0, 1, 2, 4), 0,
                  "max_aux_streams; 0 runs every layer on the main stream",
                  allowed=tuple(range(-1, 17))),)),
    {NS + "max_aux_streams": FromParam("count")},
    """``max_aux_streams``: auxiliary streams for parallel layers (default -1: TensorRT picks).""")

TrtTf32 = option_seasoning("TrtTf32", SeasoningInfo(
    name="trt-tf32", stage="build", backends=TENSORRT,
    summary="TensorRT TF32 flag: the bare step turns TF32 off (on by default)",
    params=(Param("enabled", (False,), False, "BuilderFlag.TF32",
                  allowed=(False, True)),)),
    {NS + "tf32": FromParam("enabled")},
    """The TF32 builder flag: TF32 tensor-core math for FP32 Conv/MatMul (on by default).

    Off, FP32 layers compute in full FP32: slower, and exact to FP32.
    """)

TrtCudaGraph = option_seasoning("TrtCudaGraph", SeasoningInfo(
    name="trt-cuda-graph", stage="build", backends=TENSORRT,
    summary="TensorRT: replay the enqueue as a CUDA graph",
    params=(Param("enabled", (True,), True, "capture execute_async_v3 in a CUDA graph",
                  allowed=(True, False)),)),
    {NS + "cuda_graph": FromParam("enabled")},
    """Capture the engine's enqueue (``execute_async_v3``) in a CUDA graph and replay it.

    A runtime option, not a builder one: the engine is the same, and each run costs one
    graph launch instead of one launch per kernel.
    """)

SEASONINGS = (TrtOptLevel, TrtTiling, TrtAuxStreams, TrtTf32, TrtCudaGraph)
