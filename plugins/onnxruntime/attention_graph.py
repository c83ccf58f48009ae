"""The graph facts that `attention_match` reads: producers, constants, ranks, head counts.

A (B, S, N·H) tensor is split into heads by ``Reshape`` to (B, S, N, H); exporters write
the target as a constant or as ``Concat`` of ``Unsqueeze(Gather(Shape(x), i))`` and
constants (TorchScript with dynamic axes). These helpers read such targets, and prove
that a 4-D Reshape keeps its input's shape or swaps its last two axes (the dynamo
exporter's Kᵀ), from ONNX shape inference or from the axes the match has identified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.passes.graph.constants import constant_value

__all__ = ["DEFAULT_DOMAINS", "Layouts", "NoMatch", "Shapes", "cast_to", "compose",
           "copies_dim", "dims", "enter_projection", "heads", "producer", "rank",
           "same_shape", "scalar", "swap_last_two", "target", "target_parts",
           "through_identity", "unpermute"]

DEFAULT_DOMAINS = ("", "ai.onnx", None)
Shapes = dict[str, tuple[Any, ...]]
"""Inferred shapes by tensor name: ints, symbolic names (str) or None per dimension."""


class Layouts:
    """What each axis of a block's tensors is, by tensor name, as the match found it.

    Axes are named ``B``, ``N``, ``S``, ``T``, ``H``, ``Hv``, or None (N·H, unknown).
    Entering a tensor a second time with other names records that those names are one
    size (self-attention reaches the hidden states from Q and from K: ``S`` = ``T``);
    lookups give each name's representative (union-find). Where inference gives an
    entered tensor an int dimension, that is the size of the axis's name.

    Args:
        shapes: Inferred shapes by tensor name.
    """

    def __init__(self, shapes: Shapes) -> None:
        self._shapes = shapes
        self._axes: dict[str, tuple[str | None, ...]] = {}
        self._parent: dict[str, str] = {}
        self._sizes: dict[str, int] = {}

    def size(self, axis: str) -> int | None:
        """The size of `axis` when some entered tensor's inferred shape gives it."""
        return self._sizes.get(self._find(axis))

    def _find(self, name: str) -> str:
        while self._parent.get(name, name) != name:
            name = self._parent[name]
        return name

    def __setitem__(self, tensor: str, axes: tuple[str | None, ...]) -> None:
        old = self._axes.get(tensor)
        if old is None or len(old) != len(axes):
            self._axes[tensor] = axes
        else:
            for a, b in zip(old, axes, strict=True):
                if a is not None and b is not None and self._find(a) != self._find(b):
                    size = self._sizes.pop(self._find(b), None)
                    self._parent[self._find(b)] = self._find(a)
                    if size is not None:
                        self._sizes.setdefault(self._find(a), size)
            self._axes[tensor] = tuple(b if a is None else a
                                       for a, b in zip(old, axes, strict=True))
        inferred = self._shapes.get(tensor)
        if inferred is not None and len(inferred) == len(axes):
            for axis, d in zip(axes, inferred, strict=True):
                if axis is not None and isinstance(d, int):
                    self._sizes.setdefault(self._find(axis), d)

    def get(self, tensor: str) -> tuple[str | None, ...] | None:
        """`tensor`'s axes (representatives), or None when it was never entered."""
        axes = self._axes.get(tensor)
        return None if axes is None else tuple(None if a is None else self._find(a)
                                               for a in axes)

    def __getitem__(self, tensor: str) -> tuple[str | None, ...]:
        axes = self.get(tensor)
        if axes is None:
            raise KeyError(tensor)
        return axes


class NoMatch(Exception):
    """A Softmax whose block does not match; the message is the recorded reason."""


def producer(t: gs.Tensor, ops: frozenset[str] | set[str] | None = None) -> gs.Node | None:
    """The default-domain node that writes `t` (one of `ops` when given), or None."""
    if isinstance(t, gs.Constant) or len(t.inputs) != 1:
        return None
    node = t.inputs[0]
    if node.domain not in DEFAULT_DOMAINS or (ops is not None and node.op not in ops):
        return None
    return node


def scalar(t: gs.Tensor) -> float | None:
    """The value of a one-element float constant, else None."""
    value = constant_value(t)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.floating):
        return None
    return float(value.reshape(()))


def rank(t: gs.Tensor, shapes: Shapes) -> int | None:
    """`t`'s rank: inferred, or the length of the target of the Reshape that writes it."""
    shape = shapes.get(t.name)
    if shape is not None:
        return len(shape)
    node = producer(t, {"Reshape"})
    entries = None if node is None else target(node)
    return None if entries is None else len(entries)


def target(reshape: gs.Node) -> list[int | None] | None:
    """A Reshape's target, entry by entry (None where not constant), or None."""
    value = constant_value(reshape.inputs[1])
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    concat = producer(reshape.inputs[1], {"Concat"})
    if concat is None:
        return None
    parts: list[int | None] = []
    for t in concat.inputs:
        part = constant_value(t)
        if part is None:  # Unsqueeze(Gather(Shape)): one dimension, not constant
            parts.append(None)
        else:
            parts.extend(int(v) for v in part.reshape(-1))
    return parts


def dims(t: gs.Tensor, shapes: Shapes) -> tuple[Any, ...] | None:
    """`t`'s inferred shape, or None."""
    return shapes.get(t.name)


def compose(perm: list[int], p: list[int]) -> list[int]:
    """The total perm after meeting Transpose(p) walking back from a composed `perm`."""
    return [p[i] for i in perm]


def unpermute(axes: tuple[str | None, ...], p: list[int]) -> tuple[str | None, ...]:
    """The axes of x, given the axes of ``Transpose(x, p)``."""
    out: list[str | None] = [None] * len(p)
    for i, j in enumerate(p):
        out[j] = axes[i]
    return tuple(out)


def heads(source: gs.Tensor, reshape: gs.Node, shapes: Shapes) -> tuple[int, int]:
    """(N, H) of a (B, S, N·H) → (B, S, N, H) Reshape."""
    entries = target(reshape) or [None] * 4
    out = dims(reshape.outputs[0], shapes) or (None,) * 4
    n = entries[2] if entries[2] is not None and entries[2] > 0 else out[2]
    h = entries[3] if entries[3] is not None and entries[3] > 0 else out[3]
    src = dims(source, shapes)
    hidden = src[2] if src is not None and isinstance(src[2], int) else None
    if not isinstance(n, int) and isinstance(h, int) and hidden is not None:
        n = hidden // h
    if not isinstance(h, int) and isinstance(n, int) and hidden is not None:
        h = hidden // n
    if not isinstance(n, int) or not isinstance(h, int) or n <= 0 or h <= 0:
        raise NoMatch("the number of heads is not known (no constant head count or "
                      "head size in the head-splitting Reshape)")
    if hidden is not None and hidden != n * h:
        raise NoMatch(f"the head-splitting Reshape's input is {hidden} wide, not {n}×{h}")
    return n, h


def copies_dim(reshape: gs.Node, i: int, shapes: Shapes, layouts: Layouts) -> bool:
    """Whether entry `i` of a Reshape's target provably is its input's dimension `i`.

    It is when the entry is 0 (without ``allowzero``), ``Gather(Shape(y), j)`` of the
    input itself at ``j == i`` or of a tensor whose axis ``j`` is the same axis of the
    block (`layouts`), a constant equal to the inferred dimension or to the size known
    for that axis, or when inference gives the output and the input the same (int or
    symbolic) dimension `i`.
    """
    x = reshape.inputs[0]
    x_dims, out_dims = dims(x, shapes), dims(reshape.outputs[0], shapes)
    if x_dims is not None and out_dims is not None and len(x_dims) > i \
            and len(out_dims) > i and x_dims[i] is not None and x_dims[i] == out_dims[i]:
        return True
    parts = target_parts(reshape)
    if parts is None or len(parts) <= i:
        return False
    part = parts[i]
    axis = (layouts.get(x.name) or (None,) * (i + 1))[i]
    if isinstance(part, int):
        if part == 0:
            return not reshape.attrs.get("allowzero", 0)
        if x_dims is not None and len(x_dims) > i and x_dims[i] == part:
            return True
        return axis is not None and layouts.size(axis) == part
    y, j = part
    if y is x:
        return j == i
    other = layouts.get(y.name)
    return axis is not None and other is not None and j < len(other) and other[j] == axis


def same_shape(node: gs.Node, shapes: Shapes, layouts: Layouts) -> bool:
    """Whether a Reshape provably keeps its 4-D input's shape.

    Either both shapes are inferred and equal, or each entry of the target is the input's
    dimension: a constant equal to it or to the size known for its axis (`layouts`: a
    TorchScript export's (1, −1, 16, 8) where inference lost the batch),
    ``Gather(Shape(y), j)`` of a tensor ``y`` whose axis ``j`` is the same axis of the
    block, or the one ``-1``.
    """
    a, b = dims(node.inputs[0], shapes), dims(node.outputs[0], shapes)
    if a is not None and a == b and len(a) == 4 and all(isinstance(d, int) for d in a):
        return True
    layout = layouts.get(node.inputs[0].name)
    parts = target_parts(node)
    if layout is None or parts is None or len(parts) != 4:
        return False
    unknown = 0
    for i, part in enumerate(parts):
        if isinstance(part, int):
            if part == -1:
                unknown += 1
            elif (a is None or a[i] != part) and (
                    (axis := layout[i]) is None or layouts.size(axis) != part):
                return False  # neither inferred nor the size the block's axis has
        else:
            other = layouts.get(part[0].name)
            if layout[i] is None or other is None or part[1] >= len(other) \
                    or other[part[1]] != layout[i]:
                return False
    return unknown <= 1


def target_parts(reshape: gs.Node) -> list[int | tuple[gs.Tensor, int]] | None:
    """A Reshape's target entries: ints, or (y, j) for ``Unsqueeze(Gather(Shape(y), j))``."""
    value = constant_value(reshape.inputs[1])
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    concat = producer(reshape.inputs[1], {"Concat"})
    if concat is None:
        return None
    parts: list[int | tuple[gs.Tensor, int]] = []
    for t in concat.inputs:
        part = constant_value(t)
        if part is not None:
            parts.extend(int(v) for v in part.reshape(-1))
            continue
        unsqueeze = producer(t, {"Unsqueeze"})
        gather = None if unsqueeze is None else producer(unsqueeze.inputs[0], {"Gather"})
        shape = None if gather is None else producer(gather.inputs[0], {"Shape"})
        index = None if gather is None else constant_value(gather.inputs[1])
        if shape is None or index is None or index.size != 1 or shape.attrs.get("start", 0):
            return None
        if int(index.reshape(())) < 0:
            return None
        parts.append((shape.inputs[0], int(index.reshape(()))))
    return parts


def swap_last_two(node: gs.Node, shapes: Shapes) -> gs.Tensor | None:
    """The 4-D input of a Reshape─Transpose(0,2,1)─Reshape swap of the last two axes."""
    transpose = producer(node.inputs[0], {"Transpose"})
    if transpose is None or list(transpose.attrs.get("perm", [])) != [0, 2, 1]:
        return None
    inner = producer(transpose.inputs[0], {"Reshape"})
    if inner is None:
        return None
    x = inner.inputs[0]
    x_dims, out_dims = dims(x, shapes), dims(node.outputs[0], shapes)
    flat = dims(inner.outputs[0], shapes)
    if x_dims is None or out_dims is None or flat is None or len(x_dims) != 4:
        return None
    if len(flat) != 3 or tuple(flat[1:]) != tuple(x_dims[2:]):
        return None
    if tuple(out_dims) != (x_dims[0], x_dims[1], x_dims[3], x_dims[2]):
        return None
    return x


def cast_to(cast: gs.Node) -> np.dtype | None:
    """The NumPy type a Cast converts to, or None."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(cast.attrs["to"])))
    except (KeyError, TypeError, ValueError):
        return None


def through_identity(t: gs.Tensor) -> np.ndarray | None:
    """A constant's value, or that of the constant an ``Identity`` passes on, or None."""
    node = producer(t, {"Identity"})
    return constant_value(t if node is None else node.inputs[0])


def enter_projection(t: gs.Tensor, axes: tuple[str | None, ...], layouts: Layouts
                      ) -> None:
    """Enter `t` and the tensors it is projected from as `axes` (B, S, ·) in `layouts`.

    The walk goes back through what keeps the leading axes: Add of a constant bias of
    rank 0 or 1, MatMul by a constant 2-D weight, and Slice or Split on the last axis
    (a fused QKV projection); exporters read B and S from those tensors' shapes.
    """
    for _ in range(6):
        layouts[t.name] = axes
        node = producer(t, {"Add", "MatMul", "Slice", "Split"})
        if node is None:
            return
        consts = [through_identity(x) for x in node.inputs]
        if node.op == "Add" and len(node.inputs) == 2 and any(
                c is not None and c.ndim <= 1 for c in consts):
            t = node.inputs[0] if consts[1] is not None else node.inputs[1]
        elif node.op == "MatMul" and consts[1] is not None and consts[1].ndim == 2:
            t = node.inputs[0]
        elif node.op == "Slice" and len(node.inputs) > 3 and consts[3] is not None \
                and [int(a) for a in consts[3].reshape(-1)] in ([2], [-1]):
            t = node.inputs[0]
        elif node.op == "Split" and node.attrs.get("axis", 0) in (2, -1):
            t = node.inputs[0]
        else:
            return
