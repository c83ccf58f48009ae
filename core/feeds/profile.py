"""Optimisation profiles: the min, opt and max shape of every dynamic input.

TensorRT builds an engine for a range of shapes per dynamic input, one optimisation
profile (``IOptimizationProfile.set_shape(name, min, opt, max)``). routetune takes them
as trtexec does: ``--min-shapes``, ``--opt-shapes``, ``--max-shapes``, and ``--shapes``
for all three at once (trtexec's ``--minShapes``/``--optShapes``/``--maxShapes``/
``--shapes``). Accuracy is validated and latency measured at the opt shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from routetune.errors import UsageError
from routetune.options import OptionError

if TYPE_CHECKING:
    from routetune.model.loading import TensorSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeProfile:
    """One optimisation profile.

    Args:
        shapes: Per dynamic input, its ``(min, opt, max)`` shapes; inputs with no
            dynamic dimension are left out.
    """

    shapes: Mapping[str, tuple[Shape, Shape, Shape]]

    def __str__(self) -> str:
        """``name:min/opt/max`` per input, comma-separated (``x:1x3x32x32/2x3x32x32/4x3x32x32``)."""
        def dims(shape: Shape) -> str:
            return "x".join(map(str, shape))

        return ",".join(f"{name}:{'/'.join(dims(s) for s in mom)}"
                        for name, mom in self.shapes.items())

    @classmethod
    def parse(cls, text: str) -> ShapeProfile:
        """Read the text `str` writes.

        Raises:
            UsageError: The text is not ``name:min/opt/max,...``.
        """
        shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
        for term in filter(None, text.split(",")):
            name, _, triple = term.rpartition(":")
            parts = triple.split("/")
            try:
                mom = tuple(tuple(int(d) for d in p.split("x")) for p in parts)
            except ValueError:
                mom = ()
            if not name or len(mom) != 3:
                raise UsageError(f"profile '{text}': cannot read '{term}'; write "
                                 "name:MINxDIMS/OPTxDIMS/MAXxDIMS")
            shapes[name] = mom  # type: ignore[assignment]
        return cls(shapes)


def make_profile(
    specs: Sequence[TensorSpec],
    opt: Mapping[str, Shape],
    min_text: str | None = None,
    max_text: str | None = None,
    feeds: Sequence[Mapping[str, Any]] = (),
) -> ShapeProfile:
    """The profile of the dynamic inputs of `specs`, checked.

    Args:
        specs: The model's inputs.
        opt: Every input's opt shape, already resolved (`routetune.feeds.inputs.resolve_shapes`).
        min_text: ``--min-shapes``; an input left out takes its opt shape, or with
            `feeds` the smallest size in each dimension among them.
        max_text: ``--max-shapes``; an input left out takes its opt shape, or with
            `feeds` the largest size in each dimension among them.
        feeds: Loaded input sets (``--inputs``); every one must fit the profile.

    Raises:
        UsageError: An unknown input, a wrong rank, a size that contradicts a fixed
            dimension, min > opt or opt > max in some dimension, or an input set
            outside the profile.
    """
    from routetune.feeds.inputs import parse_shapes, resolve_shapes  # ONNX: only when used

    given = {"--min-shapes": parse_shapes(min_text, "--min-shapes"),
             "--max-shapes": parse_shapes(max_text, "--max-shapes")}
    if feeds:  # the inputs' own span, per dimension (rank 0 and size 0 included)
        spans = {k: [tuple(f[k].shape[i] for f in feeds) for i in range(len(v))]
                 for k, v in opt.items()}
        if not min_text:
            given["--min-shapes"] = {k: tuple(min(d) for d in v) for k, v in spans.items()}
        if not max_text:
            given["--max-shapes"] = {k: tuple(max(d) for d in v) for k, v in spans.items()}
    bounds = {flag: resolve_shapes(specs, {**opt, **shapes}, flag)
              for flag, shapes in given.items()}
    shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
    for spec in specs:
        if all(isinstance(d, int) for d in spec.shape):
            continue
        low, mid, high = bounds["--min-shapes"][spec.name], opt[spec.name], \
            bounds["--max-shapes"][spec.name]
        for i, (a, b, c) in enumerate(zip(low, mid, high, strict=True)):
            if not a <= b <= c:
                raise UsageError(
                    f"input '{spec.name}' dimension {i}: min {a}, opt {b}, max {c} are not "
                    "in order; give --min-shapes <= --opt-shapes <= --max-shapes")
        shapes[spec.name] = (low, mid, high)
        for f in feeds:
            got = tuple(f[spec.name].shape)
            if not all(a <= g <= c for a, g, c in zip(low, got, high, strict=True)):
                raise OptionError(
                    "inputs", f": input '{spec.name}' has shape {_dims(got)}, outside the "
                    f"profile {_dims(low)}..{_dims(high)}; widen --min-shapes/--max-shapes")
    return ShapeProfile(shapes)


def _dims(shape: Shape) -> str:
    return "x".join(map(str, shape)) or "scalar"

