"""Recognise scaled-dot-product attention blocks around each ``Softmax`` of a graph.

The patterns are those that today's exporters write for a multi-head attention block
(the same family ONNX Runtime's ``onnxruntime/python/tools/transformers/
fusion_attention.py`` recognises, extended to the dynamo exporter's SDPA decomposition):

    x_q (B, S, N·H) ─Reshape (B, S, N, H)─Transpose(0,2,1,3)─[Mul √c]─┐
    x_k (B, T, N·H) ─Reshape (B, T, N, H)─Transpose(0,2,3,1)─[Mul √c]─MatMul─[Mul|Div c]
        ─[Add bias | Where(mask, scores, −big)]─Softmax(−1)─[Dropout|Identity|Cast|NaN guard]
    x_v (B, T, N·Hv)─Reshape (B, T, N, Hv)─Transpose(0,2,1,3)──────────MatMul(probs, ·)
        ─Transpose(0,2,1,3)─Reshape (B, S, N·Hv)

K's transpose may also be Transpose(0,2,1,3) then Transpose(0,1,3,2), or the dynamo
exporter's Reshape (−1, T, H)─Transpose(0,2,1)─Reshape (B, N, H, T); a 4-D Reshape that
provably keeps its input's shape is skipped; the last Reshape may give another shape
(B·S, N·Hv), in which case it stays.

A decoder's block with a KV cache (Hugging Face's ``past_key_values`` signature) reads
its keys and values from the cache (`routetune.plugins.onnxruntime.attention_cache`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import constant_value
from routetune.plugins.onnxruntime.attention_cache import Cache, cache_heads, find_cache
from routetune.plugins.onnxruntime.attention_graph import (
    DEFAULT_DOMAINS,
    Layouts,
    NoMatch,
    Shapes,
    cast_to,
    compose,
    copies_dim,
    dims,
    enter_projection,
    heads,
    producer,
    rank,
    same_shape,
    scalar,
    swap_last_two,
    target,
    target_parts,
    unpermute,
)

__all__ = ["Block", "NoMatch", "Packed", "Shapes", "Source", "match_block"]

logger = logging.getLogger(__name__)

PASS_THROUGH = frozenset({"Dropout", "Identity"})
"""Operators between Softmax and the second MatMul that inference leaves as identities."""
MASK_FLOOR = -1e4
"""A ``Where`` fill value at or below this (HF's ``finfo.min``, ``-inf``, the classic
``-10000``) masks a position: adding it instead of writing it changes no probability
above float32's resolution."""


@dataclass(frozen=True)
class Packed:
    """Part `index` of `parts` equal parts of the last axis of a packed projection.

    timm's ``Attention`` (and others) project Q, K and V with one Linear to
    (B, S, 3·N·H), reshape to (B, S, 3, N, H), permute to (3, B, N, S, H) and unbind.
    The fused node reads Q, K and V as the three (B, S, N·H) thirds of `tensor`, which
    the rewrite splits off (`routetune.plugins.onnxruntime.attention_fusion`).

    Args:
        tensor: (B, S, parts·width) float: the packed projection.
        index: Which part (0 for Q, 1 for K, 2 for V in timm's order).
        parts: How many parts the projection packs (3).
        width: N·H, the size of each part.
    """

    tensor: gs.Tensor
    index: int
    parts: int
    width: int

    @property
    def name(self) -> str:
        """The packed projection's name."""
        return self.tensor.name


Source: TypeAlias = gs.Tensor | Packed
"""Where the fused node reads Q, K or V: a (B, S, N·H) tensor, or a part of one."""


@dataclass
class Block:
    """One matched attention block, ready to become a ``MultiHeadAttention``.

    Args:
        softmax: The block's Softmax node.
        query: (B, S, N·H) float: the tensor the Q heads are split from, or its part
            of a packed projection (`Packed`); with `caches`, the (B, N, S, H) Q heads.
        key: (B, T, N·H) float; with `caches`, the (B, N, S, H) new keys.
        value: (B, T, N·Hv) float; with `caches`, the (B, N, S, H) new values.
        merge: The Reshape that merges the heads of the (B, S, N, Hv) tensor.
        merged: Whether `merge`'s output provably is (B, S, N·Hv): then the new node
            writes it; else `merge` stays and reads the new node's output.
        num_heads: N.
        scale: The factor on Q·Kᵀ (all constant Mul and Div on the paths, multiplied).
        bias: Additive terms on the scaled scores, each with the factor that the scales
            applied after it multiply it by; each term broadcasts to (B, N, S, T).
        fills: ``Where(cond, fill, scores)`` masks (``Where(cond, scores, fill)`` too),
            each as (cond, fill, whether the fill is taken where cond is True, the factor
            of the scales applied after it); rewritten as an additive bias.
    """

    softmax: gs.Node
    query: Source
    key: Source
    value: Source
    merge: gs.Node
    merged: bool
    num_heads: int
    scale: float
    bias: list[tuple[gs.Tensor, float]] = field(default_factory=list)
    fills: list[tuple[gs.Tensor, gs.Tensor, bool, float]] = field(default_factory=list)
    caches: tuple[Cache, Cache] | None = None


def _split_heads(t: gs.Tensor, want: list[int], shapes: Shapes, what: str,
                 layout: tuple[str, ...], layouts: Layouts
                 ) -> tuple[Source, int, int, float]:
    """Walk back from a (B, N, ·, ·) operand of a MatMul to its (B, S, N·H) source.

    Every tensor on the way is entered in `layouts`, starting with `t` as `layout`.
    An unbind of a packed projection (`_unbind`) counts as a Transpose (0, 2, 1, 3) of
    its (B, S, N, H) part.

    Returns:
        (source, N, H, the product of the constant Mul/Div factors on the way).

    Raises:
        NoMatch: The path is not Reshape → Transpose(`want`) (with scalar scales).
    """
    perm, mult = [0, 1, 2, 3], 1.0
    axes: tuple[str | None, ...] = layout
    for _ in range(12):
        layouts[t.name] = axes
        node = producer(t)
        if node is None:
            raise NoMatch(f"{what} is not computed in the block (a graph input or constant)")
        if node.op == "Transpose":
            p = list(node.attrs.get("perm", [3, 2, 1, 0]))
            perm, axes = compose(perm, p), unpermute(axes, p)
            t = node.inputs[0]
        elif node.op in ("Mul", "Div"):
            c = scalar(node.inputs[1])
            if c is not None and c != 0:
                mult = mult * c if node.op == "Mul" else mult / c
                t = node.inputs[0]
            elif node.op == "Mul" and (c := scalar(node.inputs[0])) is not None:
                mult *= c
                t = node.inputs[1]
            else:
                raise NoMatch(f"{what} is scaled by a non-constant {node.op}")
        elif node.op == "Reshape":
            swapped = swap_last_two(node, shapes)
            if swapped is not None:
                perm, axes = compose(perm, [0, 1, 3, 2]), unpermute(axes, [0, 1, 3, 2])
                t = swapped
            elif same_shape(node, shapes, layouts):
                t = node.inputs[0]
            elif rank(node.inputs[0], shapes) == 3 and rank(node.outputs[0], shapes) == 4:
                if perm != want:
                    raise NoMatch(f"{what}'s heads are transposed by {perm}, not {want}")
                enter_projection(node.inputs[0], (axes[0], axes[1], None), layouts)
                if not all(copies_dim(node, i, shapes, layouts) for i in (0, 1)):
                    raise NoMatch(f"{what}'s head-splitting Reshape does not provably keep "
                                  "the batch and sequence axes")
                n, h = heads(node.inputs[0], node, shapes)
                return node.inputs[0], n, h, mult
            else:
                raise NoMatch(f"{what} comes from a Reshape that is not (B, S, N·H) → "
                              "(B, S, N, H)")
        elif node.op in ("Gather", "Squeeze"):
            reshape, index = _unbind(node, t, what)
            perm, axes = compose(perm, [0, 2, 1, 3]), unpermute(axes, [0, 2, 1, 3])
            if perm != want:
                raise NoMatch(f"{what}'s heads are transposed by {perm}, not {want}")
            enter_projection(reshape.inputs[0], (axes[0], axes[1], None), layouts)
            if not all(copies_dim(reshape, i, shapes, layouts) for i in (0, 1)):
                raise NoMatch(f"{what}'s head-splitting Reshape does not provably keep "
                              "the batch and sequence axes")
            parts, n, h = _packed_heads(reshape, shapes)
            return Packed(reshape.inputs[0], index, parts, n * h), n, h, mult
        elif node.op == "Add" and all(producer(x, {"Mul"}) for x in node.inputs):
            raise NoMatch(f"{what} has a rotary position embedding (x·cos + "
                          "rotate_half(x)·sin) between its projection and Q·Kᵀ, which "
                          "MultiHeadAttention does not compute")
        else:
            raise NoMatch(f"{what} comes from {node.op}, not from a head-splitting Reshape")
    raise NoMatch(f"{what}: no head-splitting Reshape within 12 nodes")


PACKED_PERM = [2, 0, 3, 1, 4]
"""The Transpose from (B, S, 3, N, H) to (3, B, N, S, H) before a packed unbind."""


def _unbind(node: gs.Node, t: gs.Tensor, what: str) -> tuple[gs.Node, int]:
    """The head-splitting 5-D Reshape and the part index of an unbind that writes `t`.

    ``qkv.unbind(0)`` is exported as ``Gather(axis=0)`` with a scalar index, as
    ``Split(axis=0)`` then ``Squeeze(axes=[0])``, or as a one-element ``Slice`` on axis 0
    then that Squeeze (the dynamo exporter), of Transpose(`PACKED_PERM`) of Reshape
    (B, S, 3, N, H) of the packed projection.

    Raises:
        NoMatch: `node` is not such an unbind; the message says why.
    """
    if node.op == "Gather":
        index = constant_value(node.inputs[1])
        if int(node.attrs.get("axis", 0)) != 0 or index is None or index.ndim != 0:
            raise NoMatch(f"{what} comes from a Gather that is not an unbind (axis 0, one "
                          "index)")
        data, part = node.inputs[0], int(index)
    else:
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            value = constant_value(node.inputs[1])
            axes = None if value is None else [int(a) for a in value.reshape(-1)]
        split = producer(node.inputs[0], {"Split", "Slice"})
        one = None if split is None or split.op == "Split" else _one_slice(split)
        if list(axes or ()) != [0] or split is None or (
                split.op == "Split" and int(split.attrs.get("axis", 0)) != 0) or (
                split.op == "Slice" and one is None):
            raise NoMatch(f"{what} comes from a Squeeze that is not an unbind (of a Split, "
                          "or a Slice of one, on axis 0)")
        data = split.inputs[0]
        part = split.outputs.index(node.inputs[0]) if one is None else one
    transpose = producer(data, {"Transpose"})
    if transpose is None or list(transpose.attrs.get("perm", ())) != PACKED_PERM:
        raise NoMatch(f"{what} is unbound from a tensor not transposed by {PACKED_PERM} "
                      "from (B, S, 3, N, H)")
    reshape = producer(transpose.inputs[0], {"Reshape"})
    if reshape is None:
        raise NoMatch(f"{what} is unbound from a tensor not reshaped from a packed "
                      "projection")
    return reshape, part


def _one_slice(node: gs.Node) -> int | None:
    """The index a ``Slice`` of one element on axis 0 takes, else None.

    The dynamo exporter writes an unbind as ``Slice(x, [i], [i + 1], [0])`` then Squeeze.
    """
    values = [constant_value(t) for t in node.inputs[1:4]]
    if len(values) != 3 or any(v is None or v.size != 1 for v in values):
        return None
    start, end, axis = (int(np.asarray(v).reshape(())) for v in values)
    if axis != 0 or start < 0 or end != start + 1 or len(node.inputs) > 4 and (
            (step := constant_value(node.inputs[4])) is None or int(step.reshape(())) != 1):
        return None
    return start


def _packed_heads(reshape: gs.Node, shapes: Shapes) -> tuple[int, int, int]:
    """(parts, N, H) of a (B, S, parts·N·H) → (B, S, parts, N, H) Reshape.

    Raises:
        NoMatch: The sizes are not constant, or do not multiply to the input's width.
    """
    entries = target(reshape) or [None] * 5
    out = dims(reshape.outputs[0], shapes) or (None,) * 5
    src = dims(reshape.inputs[0], shapes)
    if len(entries) != 5 or len(out) != 5 or src is None or len(src) != 3:
        raise NoMatch("the packed projection is not reshaped from (B, S, ·) to "
                      "(B, S, parts, N, H)")
    sizes = [e if isinstance(e, int) and e > 0 else o for e, o in zip(entries[2:], out[2:],
                                                                       strict=True)]
    width = src[2] if isinstance(src[2], int) else None
    known = [x for x in sizes if isinstance(x, int) and x > 0]
    if len(known) == 2 and width is not None and width % (known[0] * known[1]) == 0:
        rest = width // (known[0] * known[1])  # one -1 in the target (timm's Swin)
        sizes = [x if isinstance(x, int) and x > 0 else rest for x in sizes]
    if not all(isinstance(x, int) and x > 0 for x in sizes):
        raise NoMatch("the packed projection's parts, heads or head size are not known")
    parts, n, h = (int(x) for x in sizes)
    if isinstance(src[2], int) and src[2] != parts * n * h:
        raise NoMatch(f"the packed projection is {src[2]} wide, not {parts}×{n}×{h}")
    return parts, n, h


def _scores(t: gs.Tensor, block_mult: float, bias: list[tuple[gs.Tensor, float]],
            fills: list[tuple[gs.Tensor, gs.Tensor, bool, float]]) -> tuple[gs.Node, float]:
    """Walk back from the Softmax input to Q·Kᵀ, collecting scales and masks.

    Returns:
        (the Q·Kᵀ MatMul, the product of the scales applied after it).
    """
    for _ in range(12):
        node = producer(t)
        if node is None:
            raise NoMatch("the Softmax input is not computed from a MatMul")
        if len(t.outputs) != 1:
            raise NoMatch(f"the scores ({node.op} output) are used outside the block")
        if node.op == "MatMul":
            return node, block_mult
        if node.op in ("Mul", "Div"):
            c = scalar(node.inputs[1])
            if c is not None and c != 0:
                block_mult = block_mult * c if node.op == "Mul" else block_mult / c
                t = node.inputs[0]
            elif node.op == "Mul" and (c := scalar(node.inputs[0])) is not None:
                block_mult *= c
                t = node.inputs[1]
            else:
                raise NoMatch(f"the scores are scaled by a non-constant {node.op}")
        elif node.op == "Add":
            side = 0 if _leads_to_matmul(node.inputs[0]) else 1
            if not _leads_to_matmul(node.inputs[side]):
                raise NoMatch("neither side of the Add before Softmax comes from Q·Kᵀ")
            bias.append((node.inputs[1 - side], block_mult))
            t = node.inputs[side]
        elif node.op == "Where":
            cond, a, b = node.inputs
            for scores, fill, on_true in ((b, a, True), (a, b, False)):
                value = scalar(fill)
                if _leads_to_matmul(scores) and value is not None and value <= MASK_FLOOR:
                    fills.append((cond, fill, on_true, block_mult))
                    t = scores
                    break
            else:
                raise NoMatch("a Where before Softmax that does not fill masked scores "
                              f"with a large negative constant (<= {MASK_FLOOR:g})")
        else:
            raise NoMatch(f"{node.op} between Q·Kᵀ and Softmax")
    raise NoMatch("no Q·Kᵀ MatMul within 12 nodes before Softmax")


def _leads_to_matmul(t: gs.Tensor, depth: int = 12) -> bool:
    """Whether `t` is Q·Kᵀ, possibly behind scalar Mul/Div, Add and Where nodes."""
    node = producer(t, {"MatMul", "Mul", "Div", "Add", "Where"})
    if node is None or depth == 0:
        return False
    if node.op == "MatMul":
        return True
    if node.op == "Where":
        return any(_leads_to_matmul(x, depth - 1) for x in node.inputs[1:])
    if node.op in ("Mul", "Div") and all(scalar(x) is None for x in node.inputs):
        return False
    return any(_leads_to_matmul(x, depth - 1) for x in node.inputs)


def _last_is(reshape: gs.Node, width: int | None, shapes: Shapes) -> bool:
    """Whether a 3-D Reshape's last dimension is `width` (N·Hv), or -1 after B and S."""
    out = dims(reshape.outputs[0], shapes)
    if width is not None and out is not None and isinstance(out[2], int):
        return out[2] == width
    parts = target_parts(reshape)
    return parts is not None and len(parts) == 3 and parts[2] in (-1, width)


def _merge_heads(matmul: gs.Node, shapes: Shapes, layouts: Layouts, width: int | None
                 ) -> tuple[gs.Node, bool]:
    """Walk forward from MatMul(probs, V) to the Reshape that merges the heads.

    ``Shape`` nodes reading the block's tensors (TorchScript's reshape targets) are
    left alone: once the block is gone they are dead, or they keep what they need.

    Returns:
        (the Reshape of the (B, S, N, Hv) tensor, whether its output provably is
        (B, S, N·Hv)). When not (GPT-2's dynamo export merges to (B·S, N·Hv)), the
        Reshape stays and reads the fused (B, S, N·Hv) output instead: the same elements
        in the same order.
    """
    t, perm = matmul.outputs[0], [0, 1, 2, 3]
    for _ in range(8):
        users = [n for n in t.outputs if n.op != "Shape"]
        if len(users) != 1:
            raise NoMatch("the attention output is used outside the block before its heads "
                          "are merged")
        node = users[0]
        if node.domain not in DEFAULT_DOMAINS:
            raise NoMatch(f"the attention output goes to {node.op} ({node.domain})")
        if node.op == "Transpose":
            p = list(node.attrs.get("perm", [3, 2, 1, 0]))
            perm = [perm[i] for i in p]
            layouts[node.outputs[0].name] = tuple(layouts[t.name][i] for i in p)
        elif node.op == "Reshape" and same_shape(node, shapes, layouts):
            layouts[node.outputs[0].name] = layouts[t.name]
        elif node.op == "Reshape":
            if perm != [0, 2, 1, 3]:
                raise NoMatch(f"the heads are merged after Transpose {perm}, not (0, 2, 1, 3)")
            proven = rank(node.outputs[0], shapes) == 3 and _last_is(node, width, shapes) \
                and all(copies_dim(node, i, shapes, layouts) for i in (0, 1))
            if not proven and not _copies_no_inner_dim(node):
                raise NoMatch("the head-merging Reshape's target may copy (0) an axis "
                              "after the sequence axis")
            return node, proven
        else:
            raise NoMatch(f"the attention output goes to {node.op}, not to a head-merging "
                          "Transpose and Reshape")
        t = node.outputs[0]
    raise NoMatch("no head-merging Reshape within 8 nodes after the attention MatMul")


def _copies_no_inner_dim(reshape: gs.Node) -> bool:
    """Whether a Reshape gives the same result on (B, S, N, Hv) and (B, S, N·Hv).

    It does unless a 0 in its target copies an input axis after the first two.
    """
    if reshape.attrs.get("allowzero", 0):
        return True
    parts = target_parts(reshape)
    return parts is not None and all(p != 0 for p in parts[2:])


def _probs_consumer(softmax: gs.Node, dtypes: Mapping[str, np.dtype]) -> gs.Node:
    """The MatMul(probs, V) after a Softmax, through what inference leaves as identities.

    Those are Dropout, Identity, a Cast to the type it has (GPT-2's eager
    ``.type(value.dtype)``) and the dynamo exporter's NaN guard.
    """
    t = softmax.outputs[0]
    for _ in range(4):
        users = [n for n in t.outputs if n.op != "IsNaN"]
        guards = [n for n in t.outputs if n.op == "IsNaN"]
        if len(users) != 1 or len(guards) > 1:
            raise NoMatch("the attention probabilities are used outside the block")
        node = users[0]
        if node.op == "MatMul" and node.inputs[0] is t and not guards:
            return node
        if node.op in PASS_THROUGH and not guards or node.op == "Cast" and not guards \
                and t.name in dtypes and dtypes[t.name] == cast_to(node):
            t = node.outputs[0]
        elif node.op == "Where" and guards and node.inputs[0] is guards[0].outputs[0] \
                and scalar(node.inputs[1]) == 0.0 and node.inputs[2] is t:
            t = node.outputs[0]  # Where(IsNaN(p), 0, p): the dynamo exporter's NaN guard
        else:
            raise NoMatch(f"the Softmax output goes to {node.op}, not to MatMul(probs, V)")
    raise NoMatch("no MatMul(probs, V) within 4 nodes after Softmax")


def _match_cached(softmax: gs.Node, qk: gs.Node, pv: gs.Node, mult: float,
                  bias: list[tuple[gs.Tensor, float]],
                  fills: list[tuple[gs.Tensor, gs.Tensor, bool, float]], shapes: Shapes,
                  outputs: frozenset[str], keys: tuple[Cache, float]) -> Block:
    """The block around `softmax` of a decoder whose Kᵀ reads the key cache `keys`.

    Raises:
        NoMatch: V does not read a cache, the two caches' heads differ from each other
            or from Q's, Q is not (B, N, S, H), or V is scaled.
    """
    key, k_mult = keys
    values = find_cache(pv.inputs[1], [0, 1, 2, 3], "V")
    if values is None:
        raise NoMatch("Kᵀ reads a KV cache but V does not")
    value, v_mult = values
    if v_mult != 1.0:
        raise NoMatch("V is scaled inside the block")
    n, h = cache_heads(key, shapes)
    if cache_heads(value, shapes) != (n, h):
        raise NoMatch(f"the key cache has {n}×{h} heads, the value cache "
                      f"{cache_heads(value, shapes)}: not one multi-head layout")
    query, q_mult = qk.inputs[0], 1.0
    while (node := producer(query, {"Mul", "Div"})) is not None and \
            (c := scalar(node.inputs[1])) is not None and c:
        q_mult = q_mult * c if node.op == "Mul" else q_mult / c
        query = node.inputs[0]
    q_shape = dims(query, shapes)
    if q_shape is None or len(q_shape) != 4 or any(
            isinstance(d, int) and d != want for d, want in ((q_shape[1], n), (q_shape[3], h))):
        raise NoMatch(f"Q is {q_shape}, not (B, {n}, S, {h}) heads as the cache's")
    if {softmax.outputs[0].name, pv.inputs[0].name, softmax.inputs[0].name,
            qk.outputs[0].name, pv.outputs[0].name} & outputs:
        raise NoMatch("the attention scores or probabilities are a graph output")
    layouts = Layouts(shapes)
    layouts[query.name] = ("B", "N", "S", "H")
    layouts[pv.outputs[0].name] = ("B", "N", "S", "Hv")
    merge, merged = _merge_heads(pv, shapes, layouts, n * h)
    return Block(softmax, query, key.new, value.new, merge, merged, n,
                 mult * q_mult * k_mult, bias, fills, (key, value))


def match_block(softmax: gs.Node, shapes: Shapes, outputs: frozenset[str] = frozenset(),
                dtypes: Mapping[str, np.dtype] | None = None) -> Block:
    """Match the attention block around `softmax`.

    Args:
        softmax: A ``Softmax`` node.
        shapes: Inferred shapes by tensor name (``onnx.shape_inference`` with data
            propagation); ranks and head counts are read from them where the graph's
            constants do not say.
        outputs: The graph's output names: a block whose scores or probabilities are
            one (``output_attentions``) is not fused.
        dtypes: Inferred element types by tensor name (a Cast to the same type is an
            identity).

    Returns:
        The block.

    Raises:
        NoMatch: The block is not one of the recognised patterns; the message says where.
    """
    x = softmax.inputs[0]
    x_rank = rank(x, shapes)
    axis = int(softmax.attrs.get("axis", -1))
    if x_rank != 4 or axis not in (-1, 3):
        raise NoMatch(f"Softmax over axis {axis} of a rank-{x_rank} tensor, not the last "
                      "axis of (B, N, S, T) scores")
    bias: list[tuple[gs.Tensor, float]] = []
    fills: list[tuple[gs.Tensor, gs.Tensor, bool, float]] = []
    qk, mult = _scores(x, 1.0, bias, fills)
    keys = find_cache(qk.inputs[1], [0, 1, 3, 2], "Kᵀ")
    if keys is not None:
        return _match_cached(softmax, qk, _probs_consumer(softmax, dtypes or {}), mult,
                             bias, fills, shapes, outputs, keys)
    layouts = Layouts(shapes)
    query, n, h, q_mult = _split_heads(qk.inputs[0], [0, 2, 1, 3], shapes, "Q",
                                       ("B", "N", "S", "H"), layouts)
    key, n_k, h_k, k_mult = _split_heads(qk.inputs[1], [0, 2, 3, 1], shapes, "Kᵀ",
                                         ("B", "N", "H", "T"), layouts)
    pv = _probs_consumer(softmax, dtypes or {})
    value, n_v, h_v, v_mult = _split_heads(pv.inputs[1], [0, 2, 1, 3], shapes, "V",
                                         ("B", "N", "T", "Hv"), layouts)
    layouts[pv.inputs[0].name] = ("B", "N", "S", "T")
    layouts[pv.outputs[0].name] = ("B", "N", "S", "Hv")
    if (n, h) != (n_k, h_k) or n_v != n:
        raise NoMatch(f"Q has {n}×{h} heads, K {n_k}×{h_k}, V {n_v} heads: not one "
                      "multi-head layout (grouped-query attention is not fused)")
    if v_mult != 1.0:
        raise NoMatch("V is scaled inside the block")
    if {softmax.outputs[0].name, pv.inputs[0].name} & outputs:
        raise NoMatch("the attention probabilities are used outside the block")
    if {x.name, qk.outputs[0].name, pv.outputs[0].name} & outputs:
        raise NoMatch("the attention scores are a graph output")
    merge, merged = _merge_heads(pv, shapes, layouts, n * h_v)
    return Block(softmax, query, key, value, merge, merged, n, mult * q_mult * k_mult, bias,
                 fills)
