"""ONNX Runtime CUDA provider options as seasonings, for every option that can change speed.

The installed provider reports its options and their defaults
(``InferenceSession.get_provider_options``; `routetune.plugins.onnxruntime.cuda`). Each
one is accounted for here:

- `SEARCHED`: the options routetune knows, with the values they take; a seasoning per
  option (or pair) sets them, declared as data (`option_seasoning`).
- `LEFT_OUT`: options that cannot make an engine faster, each with the reason.
- Any other option that the provider reports as a ``0``/``1`` flag (a newer provider's)
  is searched by ``ort-cuda-flag{option=NAME}``, which sets it to the other value: a
  new option is tried without a line of code. An option of another kind is left out,
  and ``routetune seasonings`` says so.

An option that the installed provider does not report is missing from the backend's
options, and its seasoning is then not applicable, with that reason. Nothing here
imports onnxruntime. Option meanings: ONNX Runtime documentation, "CUDA Execution
Provider", configuration options; ``sdpa_kernel``'s bits: ``AttentionBackend`` in
onnxruntime/contrib_ops/cpu/bert/attention_common.h.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from routetune.option_seasoning import FromParam, option_seasoning, set_options
from routetune.seasoning import (
    Param,
    ParamValue,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

if TYPE_CHECKING:
    from routetune.backend import Backend

CUDA_NS = "onnxruntime.cuda."
CUDA = frozenset({"onnxruntime-cuda"})

FLAG = ("0", "1")

SEARCHED: dict[str, tuple[tuple[str, ...], str]] = {
    "prefer_nhwc": (FLAG, "run convolutions in NHWC layout (tensor cores like it)"),
    "enable_cuda_graph": (FLAG, "capture the whole run as one CUDA graph and replay it"),
    "cudnn_conv_algo_search": (("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
                               "how cuDNN picks convolution algorithms"),
    "use_tf32": (FLAG, "allow TF32 tensor-core math for FP32 MatMul/Conv"),
    "cudnn_conv_use_max_workspace": (FLAG, "let cuDNN use its largest workspace"),
    "tunable_op_enable": (FLAG, "use TunableOp kernels"),
    "tunable_op_tuning_enable": (FLAG, "let TunableOp tune kernels online"),
    "fuse_conv_bias": (FLAG, "run Conv and its bias add as one cuDNN fused kernel"),
    "sdpa_kernel": (("0", "1", "2", "8", "16", "24"),
                    "attention kernels allowed (bits: 1 flash, 2 memory-efficient, 8 cuDNN "
                    "flash, 16 unfused; 0 the provider's choice)"),
    "cudnn_conv1d_pad_to_nc1d": (FLAG, "pad 1-D convolutions to NC1D rather than N1CD"),
    "use_ep_level_unified_stream": (FLAG, "one stream for the whole provider"),
    "enable_skip_layer_norm_strict_mode": (
        FLAG, "SkipLayerNormalization accumulates in float32 (more accurate, slower)"),
    "do_copy_in_default_stream": (FLAG, "copy inputs on the default stream (synchronous)"),
}
"""The CUDA provider options routetune searches, with the values each may take (its
seasonings below set them). Defaults come from the installed provider."""

LEFT_OUT: dict[str, str] = {
    "device_id": "the GPU is chosen by the search's worker (CUDA_VISIBLE_DEVICES)",
    "gpu_mem_limit": "a memory cap: it can only make the arena fail sooner",
    "arena_extend_strategy": "how the memory arena grows; steady-state runs allocate nothing",
    "has_user_compute_stream": "the backend sets the compute stream (a CuPy stream)",
    "user_compute_stream": "the backend sets the compute stream (a CuPy stream)",
    "gpu_external_alloc": "an allocator callback's address, not a setting",
    "gpu_external_free": "an allocator callback's address, not a setting",
    "gpu_external_empty_cache": "an allocator callback's address, not a setting",
    "tunable_op_max_tuning_duration_ms": "a tuning time budget, searched through "
                                         "ort-cuda-tunable-op's online tuning instead",
    "external_data_loader_reading_threads": "threads that read external weights when the "
                                            "session loads: load time, not run time",
    "enable_cudnn": "without cuDNN the provider has no Conv kernel: ResNet-50 fails to run "
                    "(NOT_IMPLEMENTED, onnxruntime-gpu 1.31.1 on an H200)",
}
"""CUDA provider options that cannot make an engine faster, with the reason."""


def flags_beyond_catalog(reported: Mapping[str, str]) -> dict[str, str]:
    """The reported options that are ``0``/``1`` flags routetune has no entry for.

    Args:
        reported: The installed provider's options and defaults (`provider_defaults`).

    Returns:
        Option name to its default, for ``ort-cuda-flag``.
    """
    return {k: v for k, v in sorted(reported.items())
            if k not in SEARCHED and k not in LEFT_OUT and v in FLAG}


def unaccounted(reported: Mapping[str, str]) -> list[str]:
    """Reported options that are neither searched, left out, nor 0/1 flags."""
    return sorted(k for k, v in reported.items()
                  if k not in SEARCHED and k not in LEFT_OUT and v not in FLAG)


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

CudaFuseConvBias = option_seasoning("CudaFuseConvBias", SeasoningInfo(
    name="ort-cuda-fuse-conv-bias", stage="build", backends=CUDA,
    summary="CUDA provider: Conv with its bias as one fused cuDNN kernel"),
    {CUDA_NS + "fuse_conv_bias": "1"},
    """Fuse each convolution with its bias add in cuDNN (``fuse_conv_bias=1``).

    On ResNet-50 (FP16, NHWC, CUDA graph) it took 4.18 ms to 3.50 ms on an H200
    (docs/benchmarks.md).
    """, ops=frozenset({"Conv"}))

CudaSdpaKernel = option_seasoning("CudaSdpaKernel", SeasoningInfo(
    name="ort-cuda-sdpa-kernel", stage="build", backends=CUDA,
    summary="CUDA provider: which fused attention kernels may run",
    params=(Param("kernels", ("flash", "efficient", "cudnn", "unfused"), "flash",
                  "the attention kernels allowed: flash (1), memory-efficient (2), cuDNN "
                  "flash with the unfused fallback (8|16), unfused only (16)"),)),
    {CUDA_NS + "sdpa_kernel": FromParam("kernels", lambda v: {
        "flash": "1", "efficient": "2", "cudnn": "24", "unfused": "16"}[str(v)])},
    """Restrict ONNX Runtime's attention operators to some kernels (``sdpa_kernel``).

    Applies to models with com.microsoft attention operators (what ``fuse-attention``
    and ONNX Runtime's transformer optimizer write); the unfused kernel stays as the
    fallback where a fused one cannot run.
    """, ops=frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention",
                        "PackedAttention", "PackedMultiHeadAttention"}))

CudaConv1dPad = option_seasoning("CudaConv1dPad", SeasoningInfo(
    name="ort-cuda-conv1d-nc1d", stage="build", backends=CUDA,
    summary="CUDA provider: 1-D convolutions padded to NC1D"),
    {CUDA_NS + "cudnn_conv1d_pad_to_nc1d": "1"},
    """Run a 1-D convolution as 2-D with the added axis last (``cudnn_conv1d_pad_to_nc1d``).
    """, ops=frozenset({"Conv"}))

CudaUnifiedStream = option_seasoning("CudaUnifiedStream", SeasoningInfo(
    name="ort-cuda-unified-stream", stage="build", backends=CUDA,
    summary="CUDA provider: one stream for the whole provider"),
    {CUDA_NS + "use_ep_level_unified_stream": "1"},
    """Use one CUDA stream for the provider (``use_ep_level_unified_stream=1``).""")

CudaSkipLayerNormStrict = option_seasoning("CudaSkipLayerNormStrict", SeasoningInfo(
    name="ort-cuda-skip-layernorm-strict", stage="build", backends=CUDA,
    summary="CUDA provider: SkipLayerNormalization in float32"),
    {CUDA_NS + "enable_skip_layer_norm_strict_mode": "1"},
    """Accumulate SkipLayerNormalization in float32 (``enable_skip_layer_norm_strict_mode``).

    More accurate and slower: for an FP16 route that fails the accuracy constraint only
    in its layer norms.
    """, ops=frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}))

CudaCopyInDefaultStream = option_seasoning("CudaCopyInDefaultStream", SeasoningInfo(
    name="ort-cuda-async-copy", stage="build", backends=CUDA,
    summary="CUDA provider: copies off the default stream"),
    {CUDA_NS + "do_copy_in_default_stream": "0"},
    """Copy inputs and outputs off the default stream (``do_copy_in_default_stream=0``).""")


class CudaFlag(Seasoning):
    """``ort-cuda-flag{option=NAME}``: flip a 0/1 provider option routetune has no entry for.

    Its choices are the installed provider's (`flags_beyond_catalog`), read when the
    seasoning is first used (`routetune.registry.Registry.add_lazy_seasoning`).
    """

    info = SeasoningInfo(name="ort-cuda-flag", stage="build", backends=CUDA,
                         summary="CUDA provider: flip a 0/1 option routetune has no entry "
                                 "for")
    defaults: dict[str, str] = {}

    def supports(self, backend: Backend) -> str | None:
        """Why not: another backend, or no such option in the installed provider."""
        return super().supports(backend) or (
            None if self.defaults else "the installed CUDA provider has no 0/1 option "
            "beyond routetune's catalog")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Set the option to the value that is not its default."""
        name = str(self.params["option"])
        return set_options(state, {CUDA_NS + name: "0" if self.defaults[name] == "1" else "1"})


def make_cuda_flag() -> type[Seasoning]:
    """``ort-cuda-flag`` for the installed CUDA provider (`cuda_flag_seasoning`)."""
    from routetune.plugins.onnxruntime.cuda_provider import provider_defaults

    return cuda_flag_seasoning(provider_defaults())


def cuda_flag_seasoning(reported: Mapping[str, str]) -> type[Seasoning]:
    """`CudaFlag` with the 0/1 options of `reported` beyond the catalog as its choices.

    Args:
        reported: A CUDA provider's options and their defaults (`provider_defaults`).
    """
    found = flags_beyond_catalog(reported)
    params = (Param("option", tuple(found), next(iter(found)),
                    "the provider option to flip"),) if found else ()
    info = SeasoningInfo(name=CudaFlag.info.name, stage="build", backends=CUDA,
                         summary=CudaFlag.info.summary, params=params)
    return type("CudaFlag", (CudaFlag,), {"info": info, "defaults": found,
                                          "__module__": __name__})


SEASONINGS = (CudaNhwc, CudaGraph, CudaConvAlgo, CudaNoTf32, CudaSmallWorkspace,
              CudaTunableOp, CudaFuseConvBias, CudaSdpaKernel, CudaConv1dPad,
              CudaUnifiedStream, CudaSkipLayerNormStrict, CudaCopyInDefaultStream)
