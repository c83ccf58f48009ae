"""``fuse-attention``: exported attention blocks as ONNX Runtime's ``MultiHeadAttention``.

ONNX Runtime's transformer optimizer (``ort-transformer-fusion``) fuses no attention
block of today's PyTorch exports; this seasoning recognises them itself
(`routetune.plugins.onnxruntime.attention_match`) and writes one ``com.microsoft``
``MultiHeadAttention`` per block, so that ONNX Runtime's fused kernels (flash and
memory-efficient attention on CUDA, its blocked kernel on the CPU) run. The operator's
contract is ONNX Runtime's ``docs/ContribOperators.md``, ``com.microsoft.MultiHeadAttention``
(version 1): inputs ``query`` (B, S, N·H), ``key`` (B, T, N·H), ``value`` (B, T, N·Hv),
``bias``, ``key_padding_mask``, ``attention_bias`` (B or 1, N or 1, S, T); attributes
``num_heads`` and ``scale``; output (B, S, N·Hv). It is a contrib operator, so the
seasoning is offered on the ``onnxruntime`` and ``onnxruntime-cuda`` backends only.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import constant_value, infer, taken_names, unique_name
from routetune.plugins.onnxruntime.attention_match import (
    Block,
    NoMatch,
    Packed,
    Shapes,
    Source,
    match_block,
)
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo

if TYPE_CHECKING:
    from routetune.backend import Backend

__all__ = ["AttentionFusion"]

logger = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"


class AttentionFusion(Seasoning):
    """Rewrite each scaled-dot-product attention block to ``MultiHeadAttention``.

    The recognised patterns are those of ONNX Runtime's
    ``onnxruntime/python/tools/transformers/fusion_attention.py`` as today's exporters
    write them: torch's TorchScript exporter and its dynamo exporter (SDPA decomposed by
    onnxscript's torchlib), for Hugging Face ``eager`` and ``sdpa`` attention (BERT,
    ViT, GPT-2 with its causal mask) and hand-written encoders (`attention_match` draws
    them). All tensors are float32 or float16, in the exporter's (B, S, N·H) layout
    around the block. Shapes come from ONNX shape inference (with data propagation);
    where a dimension is symbolic, the match proves it from the graph (a reshape target
    read from ``Shape`` of a tensor whose axes it has identified), and gives up otherwise.

    Rewrite rules, for each ``Softmax`` over the last axis of (B, N, S, T) scores:

    1. Q, K and V each come from a (B, S, N·H) tensor through Reshape (B, S, N, H) and
       Transpose (0, 2, 1, 3) ((0, 2, 3, 1) for K, or its two-step and dynamo forms),
       the Reshape provably keeping B and S. Those (B, S, N·H) tensors become the
       ``query``, ``key`` and ``value`` inputs, so any projection (separate, or one
       fused QKV MatMul or Conv1D split in three) stays as it is. timm's packed form,
       one (B, S, 3·N·H) projection reshaped to (B, S, 3, N, H), transposed to
       (3, B, N, S, H) and unbound (``Gather`` or ``Split`` and ``Squeeze`` on axis 0),
       becomes one ``Split`` of the projection's last axis into the three inputs.
    2. Every constant Mul or Div on Q, on K and on the scores multiplies into ``scale``
       (the dynamo exporter's √scale on Q and on K included).
    3. Each Add on the scores (the Hugging Face extended mask, ``(1 - mask) · finfo.min``
       through Where, Cast or Expand; the dynamo exporter's constant zero bias) is kept:
       the tensor the graph computes becomes ``attention_bias``, multiplied by any scale
       applied after it, summed with any other, and expanded to (·, ·, S, T) with
       ``Expand``. ``Where(mask, scores, c)`` with ``c <= -1e4`` becomes the additive
       ``Where(mask, 0, c)``. A constant all-zero bias is dropped.
    4. Softmax's output reaches MatMul(probs, V) directly or through Dropout, Identity,
       a Cast to its own type, or the dynamo exporter's ``Where(IsNaN(p), 0, p)``
       (which only rewrites rows whose every position is masked with −inf).
    5. MatMul(probs, V) → Transpose (0, 2, 1, 3) → Reshape (B, S, N·Hv): that Reshape's
       output tensor is written by the new node (name, shape and dtype stay). A Reshape
       to another shape (GPT-2's dynamo export: (B·S, N·Hv)) stays and reads the new
       node's (B, S, N·Hv) output, which holds the same elements in the same order.
       The block's other nodes are removed with ``graph.cleanup()``.
    6. A decoder's block with a KV cache (Hugging Face's ``past_key_values.{i}.key``
       signature: Kᵀ and V read ``Concat(past, new)`` on axis 2 of (B, N, ·, H), past a
       graph input): the node takes ``past_key`` and ``past_value`` (its inputs 7 and
       8) and writes the Concat outputs (``present.{i}.key``, ``.value``) as its outputs
       2 and 3, so the cache is appended inside the node. Q and the new keys and values
       are taken in (B, N, S, H) whatever computed them, a rotary embedding included,
       and reach the node through Transpose (0, 2, 1, 3) and Reshape (B, S, N·H); the
       mask's T is P + S.

    A block that does not match is left as it is; its reason is counted in the stats
    (``left: <reason>``) and named in the note. Not fused, by these rules: grouped-query
    attention (K/V with fewer heads than Q), rotary embeddings without a KV cache (x·cos
    + rotate_half(x)·sin between the head split and Q·Kᵀ, named so in the reason),
    attention probabilities that are a graph output (``output_attentions``). The rotary
    embedding of a cached block stays as the exporter wrote it (ONNX Runtime's
    ``GroupQueryAttention`` would compute it too, but reads the mask as sequence
    lengths, which is not the same for a left-padded mask).
    """

    info: ClassVar[SeasoningInfo] = SeasoningInfo(
        name="fuse-attention", stage="graph",
        backends=frozenset({"onnxruntime", "onnxruntime-cuda"}),
        summary="exported attention blocks as com.microsoft MultiHeadAttention",
        after=frozenset({"fold-constants"}),
        # ONNX Runtime's optimizer then fuses LayerNorm and GELU around the fused blocks
        before=frozenset({"ort-transformer-fusion"}))

    def applicable(self, graph: gs.Graph, backend: Backend) -> str | None:
        """Why not: no Softmax, or none reads scores of two activations (Q·Kᵀ).

        A classifier's final Softmax reads a MatMul or Gemm with a weight: no attention
        block, and no trial to spend on a route that would change nothing.
        """
        softmaxes = [node for node in graph.nodes if node.op == "Softmax"]
        if not softmaxes:
            return "no Softmax in the model: no attention block"
        if not any(_reads_scores(node) for node in softmaxes):
            return (f"no Softmax reads a MatMul of two activations (Q·Kᵀ); the model's "
                    f"{len(softmaxes)} Softmax read weights or other operators: no "
                    "attention block")
        return None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Fuse every matching block of `state.graph` in place.

        Returns:
            ``stats``: ``MultiHeadAttention`` (blocks fused), ``blocks_seen`` (Softmax
            nodes), ``blocks_left`` and one ``left: <reason>`` count per reason.

        Raises:
            Nothing for a block that does not match (it is counted); onnx-graphsurgeon's
            errors for a malformed graph.
        """
        graph = state.model_graph()
        shapes, dtypes = _inferred(graph)
        taken = taken_names(graph)
        softmaxes = [n for n in graph.nodes if n.op == "Softmax"]
        outputs = frozenset(t.name for t in graph.outputs)
        fused, left, where = 0, Counter[str](), []
        for softmax in softmaxes:
            try:
                block = match_block(softmax, shapes, outputs, dtypes)
                _rewrite(graph, block, shapes, dtypes, taken)
            except NoMatch as e:
                left[str(e)] += 1
                where.append(f"{softmax.name}: {e}")
                logger.debug("fuse-attention: %s not fused: %s", softmax.name, e)
                continue
            fused += 1
        if fused:
            graph.cleanup().toposort()
        stats = {"MultiHeadAttention": fused, "blocks_seen": len(softmaxes),
                 "blocks_left": len(softmaxes) - fused}
        stats.update({f"left: {reason}": n for reason, n in sorted(left.items())})
        note = f"{fused} of {len(softmaxes)} attention blocks fused"
        if where:
            note += "; left: " + "; ".join(where[:8]) + (" …" if len(where) > 8 else "")
        return PassResult(fused > 0, stats, note)


def _inferred(graph: gs.Graph) -> tuple[Shapes, dict[str, np.dtype]]:
    """Shapes and dtypes by tensor name, from ONNX shape inference with data propagation."""
    shapes: Shapes = {}
    dtypes: dict[str, np.dtype] = {}
    for g in (graph, infer(graph)):
        if g is None:
            continue
        for name, t in g.tensors().items():
            if t.shape is not None:
                shapes[name] = tuple(d if isinstance(d, (int, str)) and d != -1 else None
                                     for d in t.shape)
            if t.dtype is not None:
                dtypes[name] = np.dtype(t.dtype)
    return shapes, dtypes


def _rewrite(graph: gs.Graph, block: Block, shapes: Shapes, dtypes: dict[str, np.dtype],
             taken: set[str]) -> None:
    """Replace `block` by one ``MultiHeadAttention`` node (rules 3 and 5 of the class).

    The node reads `block.query`, `block.key` and `block.value` ((B, S, N·H) float32 or
    float16; a `Packed` part is split off its projection first) and, with a mask, an
    ``attention_bias`` broadcast to (B or 1, N or 1, S, T) in their dtype; it writes
    `block.merge`'s output, or a new (B, S, N·Hv) tensor that `block.merge` then reads.

    Raises:
        NoMatch: Another dtype, or a bias of rank > 4 (checked before any change).
    """
    dtype = dtypes.get(block.query.name, np.dtype(np.float32))
    if dtype not in (np.float32, np.float16):
        raise NoMatch(f"the block computes in {dtype}, not float32 or float16")
    base = unique_name(f"{block.softmax.name or 'attention'}_mha", taken)
    new_nodes: list[gs.Node] = []

    def node(op: str, inputs: list[gs.Tensor], suffix: str, **attrs: object) -> gs.Variable:
        out = gs.Variable(unique_name(f"{base}/{suffix}", taken), dtype=None)
        new_nodes.append(gs.Node(op, unique_name(f"{base}/{op}", taken), dict(attrs),
                                 inputs, [out]))
        return out

    def const(value: np.ndarray, suffix: str) -> gs.Constant:
        return gs.Constant(unique_name(f"{base}/{suffix}", taken), value)

    split: dict[str, list[gs.Variable]] = {}

    def unpacked(source: Source) -> gs.Tensor:
        """A packed projection's part, split off its last axis (one Split per tensor)."""
        if not isinstance(source, Packed):
            return source
        if source.name not in split:
            outs = [gs.Variable(unique_name(f"{base}/{'qkv'[i] if source.parts == 3 else i}",
                                            taken), dtype=dtype)
                    for i in range(source.parts)]
            sizes = np.full(source.parts, source.width, np.int64)
            split_inputs: list[gs.Tensor] = [source.tensor]
            attrs: dict[str, object] = {"axis": -1}
            if graph.opset >= 13:  # `split` became an input in opset 13
                split_inputs.append(const(sizes, "split_sizes"))
            else:
                attrs["split"] = [int(x) for x in sizes]
            new_nodes.append(gs.Node("Split", unique_name(f"{base}/Split", taken), attrs,
                                     split_inputs, list(outs)))
            split[source.name] = outs
        return split[source.name][source.index]

    terms: list[tuple[gs.Tensor, float]] = []
    for tensor, factor in block.bias:
        value = constant_value(tensor)
        if value is not None and not np.any(value):
            continue  # a constant zero bias (the dynamo exporter's, without a mask)
        if len(shapes.get(tensor.name) or ()) > 4:
            raise NoMatch("the attention bias has more than 4 dimensions")
        terms.append((tensor, factor))
    for cond, fill, on_true, factor in block.fills:
        fill_value = np.asarray(constant_value(fill)).astype(np.float64) * factor
        clipped = np.maximum(fill_value, np.finfo(dtype).min).astype(dtype)
        zero = const(np.zeros((), dtype), "zero")
        fill_c = const(clipped.reshape(()), "fill")
        pair = [fill_c, zero] if on_true else [zero, fill_c]
        terms.append((node("Where", [cond, *pair], "mask_bias"), 1.0))
    bias: gs.Tensor | None = None
    for tensor, factor in terms:
        if dtypes.get(tensor.name, dtype) != dtype:
            tensor = node("Cast", [tensor], "bias_cast", to=_onnx_type(dtype))
        if factor != 1.0:
            tensor = node("Mul", [tensor, const(np.array(factor, dtype), "factor")], "bias")
        bias = tensor if bias is None else node("Add", [bias, tensor], "bias_sum")
    def rows(heads: gs.Tensor, suffix: str) -> gs.Tensor:
        """(B, N, S, H) → (B, S, N·H), the layout the node reads Q and new K, V in."""
        width = _heads_width(heads, block, shapes)
        bsnh = node("Transpose", [heads], f"{suffix}_bsnh", perm=[0, 2, 1, 3])
        return node("Reshape", [bsnh, const(np.array([0, 0, width], np.int64), "rows")],
                    suffix)

    inputs: list[gs.Tensor]
    if block.caches is None:
        inputs = [unpacked(block.query), unpacked(block.key), unpacked(block.value)]
    else:
        inputs = [rows(block.query, "query"), rows(block.key, "key"),
                  rows(block.value, "value")]
    if bias is not None and not _complete(bias, block, shapes):
        one = const(np.ones(2, np.int64), "ones")
        index = const(np.array([1], np.int64), "seq_axis")
        s = node("Gather", [node("Shape", [inputs[0]], "q_shape"), index], "s", axis=0)
        t = node("Gather", [node("Shape", [inputs[1]], "k_shape"), index], "t", axis=0)
        if block.caches is not None:  # T = P + S: the past's length and this call's
            past = node("Shape", [block.caches[0].past], "past_len", start=2, end=3)
            t = node("Add", [past, t], "total_len")
        target = node("Concat", [one, s, t], "bias_shape", axis=0)
        bias = node("Expand", [bias, target], "attention_bias")
    if bias is not None or block.caches is not None:
        inputs += [gs.Variable.empty(), gs.Variable.empty(),
                   gs.Variable.empty() if bias is None else bias]
    outputs = [block.merge.outputs[0] if block.merged else
               gs.Variable(unique_name(f"{base}/output", taken), dtype=dtype)]
    if block.merged:
        block.merge.outputs.clear()
    else:
        block.merge.inputs[0] = outputs[0]
    if block.caches is not None:  # the node appends this call's keys and values itself
        inputs += [cache.past for cache in block.caches]
        outputs += [cache.present for cache in block.caches]
        for cache in block.caches:
            cache.concat.outputs.clear()
    new_nodes.append(gs.Node("MultiHeadAttention", base, {
        "num_heads": block.num_heads, "scale": float(block.scale)}, inputs, outputs,
        domain=MS_DOMAIN))
    graph.nodes.extend(new_nodes)


def _heads_width(heads: gs.Tensor, block: Block, shapes: Shapes) -> int:
    """N·H of a (B, N, S, H) tensor of `block`: from its inferred shape, else the cache's.

    Raises:
        NoMatch: Neither gives the head size.
    """
    for t in (heads, *(c.past for c in block.caches or ())):
        shape = shapes.get(t.name)
        if shape is not None and len(shape) == 4 and isinstance(shape[3], int):
            return block.num_heads * shape[3]
    raise NoMatch(f"the head size of {heads.name} is not known")


def _complete(bias: gs.Tensor, block: Block, shapes: Shapes) -> bool:
    """Whether `bias` is known to be (·, ·, S, T) already (T = P + S with a cache)."""
    if block.caches is not None:
        b, q, k = (shapes.get(t.name) for t in (bias, block.query, block.caches[0].present))
        s_axis, t_axis = 2, 2
    else:
        b, q, k = (shapes.get(t.name) for t in (bias, block.query, block.key))
        s_axis, t_axis = 1, 1
    if b is None or q is None or k is None or len(b) != 4:
        return False
    return b[2] is not None and b[2] == q[s_axis] and b[3] is not None and b[3] == k[t_axis]


def _onnx_type(dtype: np.dtype) -> int:
    from onnx.helper import np_dtype_to_tensor_dtype

    return int(np_dtype_to_tensor_dtype(dtype))


SCORE_STEPS = frozenset({"Add", "Sub", "Div", "Mul", "Where", "Cast"})
"""Operators between attention's Q·Kᵀ MatMul and its Softmax: the scale, the mask."""


def _reads_scores(softmax: gs.Node, depth: int = 6) -> bool:
    """Whether `softmax` reads, through `SCORE_STEPS`, a MatMul of two activations."""
    frontier = [t for t in softmax.inputs[:1] if not _constant(t)]
    for _ in range(depth):
        found: list[gs.Tensor] = []
        for tensor in frontier:
            for producer in tensor.inputs:
                if producer.op == "MatMul" and not any(map(_constant, producer.inputs)):
                    return True
                if producer.op in SCORE_STEPS:
                    found += [t for t in producer.inputs if not _constant(t)]
        frontier = found
    return False


def _constant(tensor: gs.Tensor) -> bool:
    """An initializer or a ``Constant`` node's output."""
    return isinstance(tensor, gs.Constant) or any(p.op == "Constant" for p in tensor.inputs)
