"""``int4-weights``, ``int8-weights``: weight-only MatMul weights in ``MatMulNBits``.

ONNX Runtime's `MatMulNBitsQuantizer` (``onnxruntime.quantization.matmul_nbits_quantizer``,
which needs the ``onnx-ir`` package: ``pip install 'routetune[int4]'``) replaces each
``MatMul`` whose second input is a constant 2-D weight ``[K, N]`` with the contrib op
``com.microsoft:MatMulNBits``: the weight stored as 4-bit (``int4-weights``) or 8-bit
(``int8-weights``) integers in blocks of ``block_size`` values along K, each block with
its own float scale (and, asymmetric, a zero point); activations stay in the model's
float type. This is the first thing an LLM user tries: a decode step reads every weight
once per token, so a quarter of the weight bytes is a quarter of the memory traffic.
ONNX Runtime's CPU and CUDA providers have kernels for both widths (8 bits since ONNX
Runtime 1.22: microsoft/onnxruntime pull requests 24384 and 24509); no other backend runs
the op.

Eight bits is the accuracy-safe width: ONNX Runtime added it because 4-bit weights
changed Phi-4's answers and ">= 6 bits can fix the issue" (pull request 24384), as
llama.cpp's Q8_0 is its users' near-lossless choice.

Algorithms (``algorithm``, ``int4-weights`` only):

- ``rtn``: round to nearest with each block's own min/max (ONNX Runtime's ``DEFAULT``
  weight-only config, its C++ ``quantize_matmul_4bits``/``_8bits``); symmetric or
  asymmetric.
- ``hqq``: Half-Quadratic Quantization (H. Badri and A. Shaji, "Half-Quadratic
  Quantization of Large Machine Learning Models", 2023), which optimises each block's
  scale and zero point for the weight error without calibration data; asymmetric only.
  ONNX Runtime implements it with torch, so it is offered only where torch imports
  (``pip install 'routetune[int4-hqq]'``).

``accuracy_level`` is MatMulNBits' attribute (ONNX Runtime's contrib-op docs): the
compute type of the product, 0 unset (the input type), 1 fp32, 2 fp16, 3 bf16, 4 int8
(activations quantized per block on the fly; ONNX Runtime's fast path on x86 CPUs with
AVX2/AVX512-VNNI). The CUDA provider ignores it. On this repository's 2-vCPU machine
an 8-bit decode step of ``benchmarks/decoder.py``'s decoder took 10.1 ms at level 0
and 1.53 ms at level 4 (FP32: 2.10 ms), so ``int8-weights`` searches level 4 only.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from routetune.backend import Backend
from routetune.install import pip_install
from routetune.model.loading import name_nodes
from routetune.passes.graph.constants import copy_graph, replace_graph
from routetune.passes.precision.lowering import LOWERED, Lowering
from routetune.plugins.onnxruntime.calibration import _constants_to_initializers, quantized_ops
from routetune.seasoning import (
    Param,
    PassResult,
    RouteContext,
    RouteState,
    Seasoning,
    SeasoningInfo,
)

logger = logging.getLogger(__name__)

MIN_SHARE = 0.5
"""The share of the model's weight bytes that constant MatMul weights must hold for
``int4-weights`` to be offered: weight-only quantization pays where those weights
dominate what each run reads (the linear layers of decoders and encoders); where
convolutions hold most of them (PP-OCR's recognizer: 38%), it only adds trials."""

HQQ = importlib.util.find_spec("torch") is not None
"""Whether ONNX Runtime's HQQ quantizer can run here (it imports torch)."""


def constant_values(tensor: gs.Tensor) -> Any | None:
    """A tensor's constant values (an initializer's, or a ``Constant`` node's), else None.

    Returns numpy arrays or onnx-graphsurgeon's lazy values (both have ``shape`` and
    ``nbytes``).
    """
    if isinstance(tensor, gs.Constant):
        return tensor.values
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        return value.values if isinstance(value, gs.Constant) else None
    return None


def matmul_weights(graph: gs.Graph) -> list[tuple[gs.Node, Any]]:
    """The top-level MatMuls whose second input is constant, of rank 2 or more, with it."""
    found = []
    for node in graph.nodes:
        if node.op == "MatMul" and len(node.inputs) == 2:
            values = constant_values(node.inputs[1])
            if values is not None and len(values.shape) >= 2:
                found.append((node, values))
    return found


PASS_THROUGH = frozenset({"Add", "Reshape", "Cast", "Transpose", "Identity", "Squeeze",
                          "Unsqueeze"})
"""Operators between an output projection and the graph output it writes (a bias, a
reshape to ``[batch, seq, vocab]``, a cast)."""


def output_projections(graph: gs.Graph) -> list[str]:
    """The names of the MatMuls with a constant weight whose result is a graph output.

    A language model's head (``lm_head``: hidden states to the vocabulary's logits),
    directly or through `PASS_THROUGH` operators.
    """
    outputs = {t.name for t in graph.outputs}
    found = []
    for node, _ in matmul_weights(graph):
        tensor, seen = node.outputs[0], 0
        while tensor.name not in outputs and seen < 4 and len(tensor.outputs) == 1 \
                and tensor.outputs[0].op in PASS_THROUGH:
            tensor, seen = tensor.outputs[0].outputs[0], seen + 1
        if tensor.name in outputs:
            found.append(node.name)
    return found


def _weight_bytes(graph: gs.Graph) -> int:
    """Bytes of every top-level constant tensor (initializers and ``Constant`` nodes)."""
    total = 0
    for tensor in graph.tensors().values():
        values = constant_values(tensor)
        total += 0 if values is None else int(values.nbytes)
    return total


def _inferred_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    """Every tensor's type as ONNX shape inference knows it, by name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: v.type.tensor_type for v in (*inferred.graph.value_info,
                                                 *inferred.graph.output)}


def _keep_types(graph: gs.Graph, types: dict[str, onnx.TypeProto.Tensor]) -> None:
    """Give each ``MatMulNBits`` output the type and shape its MatMul's had, in place.

    ONNX shape inference does not know the contrib op, so without them nothing after it
    has a type either, and a layer-wise comparison (``precision-repair``'s ranking)
    would not see those tensors.
    """
    for node in graph.nodes:
        if node.op != "MatMulNBits":
            continue
        out = node.outputs[0]
        found = types.get(out.name)
        if out.dtype is None and found is not None and found.elem_type:
            out.dtype = onnx.helper.tensor_dtype_to_np_dtype(found.elem_type)
            out.shape = [d.dim_param if d.HasField("dim_param") else
                         d.dim_value if d.HasField("dim_value") else None
                         for d in found.shape.dim] if found.HasField("shape") else None


def quantizer_missing() -> str | None:
    """Why ONNX Runtime's MatMulNBits quantizer cannot import here (``onnx-ir``), or None."""
    if importlib.util.find_spec("onnx_ir") is None:
        return ("ONNX Runtime's MatMulNBits quantizer needs onnx-ir, which is not "
                f"installed: {pip_install('int4')}")
    return None


def weight_only_declined(graph: gs.Graph) -> str | None:
    """Why weight-only quantization is not offered for `graph`, or None (`MIN_SHARE`).

    A model quantized already, one without a constant MatMul weight, or one whose
    constant MatMul weights hold less than `MIN_SHARE` of its weight bytes. Shared by
    ``int4-weights``, ``int8-weights`` and OpenVINO's ``nncf-int4``.
    """
    found = quantized_ops(graph)
    if found:
        return f"the model is quantized already ({', '.join(found)})"
    weights = matmul_weights(graph)
    if not weights:
        return "no MatMul with a constant weight"
    share = sum(int(w.nbytes) for _, w in weights) / max(_weight_bytes(graph), 1)
    if share < MIN_SHARE:
        return (f"constant MatMul weights are {share:.0%} of the model's weight bytes "
                f"(below {MIN_SHARE:.0%}): weight-only quantization pays where they "
                "dominate")
    return None


BACKENDS = frozenset({"onnxruntime", "onnxruntime-cuda"})
"""The backends that run ``MatMulNBits`` of 4 and 8 bits."""

BLOCK_SIZE = Param("block_size", (32,), 32, "weights per quantization block along K",
                   allowed=(16, 64, 128, 256))
NODES_TO_EXCLUDE = Param("nodes_to_exclude", ((),), (), "MatMul node names to keep as they are")


def keep_head(default: bool) -> Param:
    """The ``keep_head`` parameter, searched at `default` only (the other value pinnable)."""
    return Param("keep_head", (default,), default,
                 "keep the output projection (the MatMul whose result is a graph output: a "
                 "language model's lm_head) as it is", allowed=(not default,))


class WeightOnly(Seasoning):
    """Weight-only quantization of constant MatMul weights into `MatMulNBits` of `bits`.

    Rules:

    1. Offered on ONNX Runtime's CPU and CUDA backends (both run ``MatMulNBits`` of 4
       and 8 bits; ``accuracy_level`` chooses a kernel on the CPU only), where its
       quantizer imports (``onnx-ir``: the ``int4`` extra), for a model not
       quantized already, whose constant MatMul weights hold at least `MIN_SHARE` of its
       weight bytes.
    2. Top-level ``Constant`` nodes become initializers (the quantizer sees only
       initializers as weights). Every MatMul with a constant weight of rank 2 (or
       leading dims of 1) not in ``nodes_to_exclude`` becomes ``MatMulNBits`` with
       ``block_size`` values per block along K, quantized by ``algorithm``; each gets
       ``accuracy_level`` when it is not 0, except on the CUDA provider, which ignores
       it (so a level's route is level 0's model there, and shares its trial). With
       ``keep_head`` the output projection stays as it is (`output_projections`: a
       language model's lm_head), as int4 recipes keep it: llama.cpp's k-quants store
       ``output.weight`` as Q6_K, NNCF's ``compress_weights`` keeps the last layer in 8
       bits (``all_layers=False``).
       On ``benchmarks/decoder.py``'s trained decoder it decides the greedy text: 64 of
       64 next bytes kept with the head in FP32, 62 of 64 without (docs/benchmarks.md).
    3. Each ``MatMulNBits`` keeps its MatMul's name, and the route's `Lowering` is
       recorded, so that ``precision-repair`` can rank the MatMuls by the error each
       adds and keep the worst in FP32 (``nodes_to_exclude``).
    4. The pass record counts ``quantized_nodes`` (MatMulNBits written) and gives the
       MatMul weights' bytes before and after in its note. When nothing was quantized
       the graph is left alone (``modified=False``).

    Raises:
        ValueError: ``algorithm=hqq`` with ``symmetric=true`` (HQQ writes zero points),
            or ``hqq`` where torch does not import.
        ImportError: ONNX Runtime's quantizer cannot import (``onnx-ir`` missing), with
            the extra to install.
    """

    bits: ClassVar[int]
    """The weight width written (``MatMulNBits``' ``bits`` attribute)."""

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: another backend, no quantizer, a quantized model, few weights (rule 1)."""
        reason = super().applicable(graph, backend) or quantizer_missing()
        if reason:
            return reason
        return weight_only_declined(graph)

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Quantize the MatMul weights with ONNX Runtime and copy the result in (rules 2-4)."""
        p = self.params
        algorithm, bits, name = str(p.get("algorithm", "rtn")), self.bits, self.info.name
        if algorithm == "hqq" and p["symmetric"]:
            raise ValueError(f"{name}: hqq writes a zero point per block; use "
                             "symmetric=false, or algorithm=rtn for symmetric blocks")
        if algorithm == "hqq" and not HQQ:
            raise ValueError("int4-weights{algorithm=hqq} needs torch (ONNX Runtime's HQQ "
                             f"quantizer uses it): {pip_install('int4-hqq')}")
        try:
            from onnxruntime.quantization import matmul_nbits_quantizer as nbits
            from onnxruntime.quantization.quant_utils import QuantFormat
        except ImportError as e:
            raise ImportError(f"{name} needs ONNX Runtime's MatMulNBits quantizer, "
                              f"which failed to import ({e}): {pip_install('int4')}") from e
        graph = state.model_graph()
        head = output_projections(graph) if p["keep_head"] else []
        excluded = [*p["nodes_to_exclude"], *head]
        before = sum(int(w.nbytes) for n, w in matmul_weights(graph) if n.name not in excluded)
        fp32 = copy_graph(graph)
        model = gs.export_onnx(graph)
        _constants_to_initializers(model)
        types = _inferred_types(model)  # before the quantizer rewrites `model` in place
        block = int(p["block_size"])
        config: nbits.WeightOnlyQuantConfig
        if algorithm == "hqq":
            config = nbits.HQQWeightOnlyQuantConfig(block_size=block, bits=bits,
                                                    op_types_to_quantize=("MatMul",))
        else:
            config = nbits.DefaultWeightOnlyQuantConfig(
                block_size=block, is_symmetric=bool(p["symmetric"]),
                quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",), bits=bits)
        quantizer = nbits.MatMulNBitsQuantizer(
            model, bits=bits, block_size=block, is_symmetric=bool(p["symmetric"]),
            nodes_to_exclude=excluded, algo_config=config)
        quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # it logs every node at INFO
        try:
            quantizer.process()
        finally:
            quiet.setLevel(level)
        quantized: onnx.ModelProto = quantizer.model.model
        written = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
        # the CUDA provider ignores the attribute: left out there, a level's route is the
        # same model as level 0's, and shares its trial (one engine, measured once)
        level_attr = 0 if ctx.backend.name == "onnxruntime-cuda" else int(p["accuracy_level"])
        for node in written:
            node.name = node.name.removesuffix(f"_Q{bits}")  # the MatMul's own: repair excludes it
            attrs = {a.name for a in node.attribute}
            if level_attr and "accuracy_level" not in attrs:  # HQQ writes none
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", level_attr))
        stats = {"quantized_nodes": len(written), "kept_head": len(head)}
        if not written:
            return PassResult(False, stats, "no MatMul weight was quantized")
        names = {i for n in written for i in n.input[1:]}
        after = sum(numpy_helper.to_array(t).nbytes for t in quantized.graph.initializer
                    if t.name in names)
        name_nodes(quantized)
        new = gs.import_onnx(quantized)
        _keep_types(new, types)
        replace_graph(graph, new)
        graph.cleanup()
        state.stash[LOWERED] = Lowering(self, fp32)  # precision-repair redoes it
        stats.update(weight_bytes_before=int(before), weight_bytes_after=int(after))
        note = (f"{algorithm}, {bits} bits, block {block}, "
                f"{'symmetric' if p['symmetric'] else 'asymmetric'}"
                f"{f', accuracy_level {level_attr}' if level_attr else ''}: "
                f"{len(written)} MatMul weights, {before / 2**20:.2f} MiB -> "
                f"{after / 2**20:.2f} MiB with scales and zero points "
                f"({np.float64(before) / max(after, 1):.1f}x smaller)"
                + (f"; kept the output projection {', '.join(head)} as it was" if head else ""))
        return PassResult(True, stats, note)


class Int4Weights(WeightOnly):
    """int4 weight-only quantization (`WeightOnly`): RTN or HQQ, the head kept by default."""

    bits = 4
    info = SeasoningInfo(
        name="int4-weights", stage="precision",
        backends=BACKENDS,
        summary="int4 weight-only MatMul weights (ONNX Runtime's MatMulNBits: RTN or HQQ)",
        params=(
            Param("algorithm", ("rtn", "hqq") if HQQ else ("rtn",), "rtn",
                  "rtn (blockwise min/max, round to nearest) or hqq (half-quadratic; needs "
                  "torch)", allowed=("rtn", "hqq")),
            BLOCK_SIZE,
            Param("symmetric", (False,), False,
                  "symmetric blocks (no zero point); rtn only", allowed=(True,)),
            Param("accuracy_level", (0, 4), 0,
                  "MatMulNBits compute type: 0 the input's, 4 int8 (fast on x86 CPUs)",
                  allowed=(1, 2, 3)),
            keep_head(True),
            NODES_TO_EXCLUDE,
        ),
        conflicts=frozenset({"int8-qdq", "fp8-qdq", "int8-weights"}),
        after=frozenset({"fp16", "bf16"}),
    )


class Int8Weights(WeightOnly):
    """int8 weight-only quantization (`WeightOnly`): RTN, every MatMul by default.

    ``keep_head`` is off by default: eight bits is near-lossless for the output
    projection too (llama.cpp's Q8_0 quantizes ``output.weight`` to Q8_0 as well), and
    an LLM's head is among its largest weights. ``accuracy_level`` 4 only is searched
    (the module's note: level 0's 8-bit CPU kernel was 4.8x slower than FP32 here).
    """

    bits = 8
    info = SeasoningInfo(
        name="int8-weights", stage="precision",
        backends=BACKENDS,
        summary="int8 weight-only MatMul weights (ONNX Runtime's MatMulNBits, 8 bits: RTN)",
        params=(
            BLOCK_SIZE,
            Param("symmetric", (False,), False, "symmetric blocks (no zero point)",
                  allowed=(True,)),
            Param("accuracy_level", (4,), 4,
                  "MatMulNBits compute type: 4 int8 (fast on x86 CPUs), 0 the input's",
                  allowed=(0, 1, 2, 3)),
            keep_head(False),
            NODES_TO_EXCLUDE,
        ),
        conflicts=frozenset({"int4-weights", "int8-qdq", "fp8-qdq"}),
        after=frozenset({"fp16", "bf16"}),
    )
