"""Find a decoder's KV cache behind the keys and values of an attention block.

A decoder's block with a KV cache (Hugging Face's ``past_key_values`` signature, as
torch.onnx writes it) reads its keys and values from the cache, not from projections:

    past_k (B, N, P, H) graph input ─┐
    k_new  (B, N, S, H) ─────────────Concat(axis 2)─ present_k ─Transpose(0,1,3,2)─[Mul √c]
    q      (B, N, S, H) ─[Mul √c]────────────────────────────────────────────────────MatMul ...
    past_v, v_new ───────────────────Concat(axis 2)─ present_v ──────── MatMul(probs, ·)

Q and the new keys and values are taken as they are, whatever computes them (a rotary
position embedding included): the match needs only their (B, N, S, H) layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from routetune.plugins.onnxruntime.attention_graph import (
    NoMatch,
    Shapes,
    compose,
    dims,
    producer,
    scalar,
)

__all__ = ["Cache", "cache_heads", "find_cache"]


@dataclass(frozen=True)
class Cache:
    """One layer's key or value cache: ``Concat(past, new)`` on the sequence axis.

    Args:
        past: (B, N, P, H) float: the graph input holding the earlier tokens' keys or
            values (``past_key_values.{i}.key`` or ``.value``).
        new: (B, N, S, H) float: this call's keys or values, heads split.
        concat: The Concat node; its output (B, N, P + S, H) is the present cache
            (``present.{i}.key``), which the fused node writes instead.
    """

    past: gs.Tensor
    new: gs.Tensor
    concat: gs.Node

    @property
    def present(self) -> gs.Tensor:
        """The (B, N, P + S, H) cache after this call."""
        return self.concat.outputs[0]


def find_cache(t: gs.Tensor, want: list[int], what: str) -> tuple[Cache, float] | None:
    """The KV cache that Kᵀ or V (`t`) reads, through Transposes and scalar Mul/Div.

    Returns:
        (the cache, the product of the constant factors on the way), or None when `t`
        does not come from a Concat of a graph input.

    Raises:
        NoMatch: It does, but the cache reaches the MatMul transposed other than by
            `want`, or scaled by a non-constant.
    """
    perm, mult = [0, 1, 2, 3], 1.0
    for _ in range(6):
        node = producer(t)
        if node is None:
            return None
        if node.op == "Concat":
            break
        if node.op == "Transpose":
            perm = compose(perm, list(node.attrs.get("perm", [3, 2, 1, 0])))
            t = node.inputs[0]
        elif node.op in ("Mul", "Div") and (c := scalar(node.inputs[1])) is not None and c:
            mult = mult * c if node.op == "Mul" else mult / c
            t = node.inputs[0]
        else:
            return None
    else:
        return None
    past = node.inputs[0] if len(node.inputs) == 2 else None
    if past is None or int(node.attrs.get("axis", 0)) not in (2, -2) or past.inputs or \
            isinstance(past, gs.Constant):
        return None
    if perm != want:
        raise NoMatch(f"{what}'s cache reaches Q·Kᵀ transposed by {perm}, not {want}")
    return Cache(past, node.inputs[1], node), mult


def cache_heads(cache: Cache, shapes: Shapes) -> tuple[int, int]:
    """(N, H) of a (B, N, P, H) cache, from its past's or its new part's inferred shape.

    Raises:
        NoMatch: Neither says both as numbers.
    """
    for t in (cache.past, cache.new):
        shape = dims(t, shapes)
        if shape is not None and len(shape) == 4 and all(
                isinstance(d, int) and d > 0 for d in (shape[1], shape[3])):
            return int(shape[1]), int(shape[3])
    raise NoMatch(f"the head count and head size of the cache {cache.past.name} are not "
                  "known")
