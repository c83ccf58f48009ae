"""The protocol between a precision seasoning and ``precision-repair``: its `Lowering`.

A precision seasoning (``fp16``, ``bf16``, ``int8-qdq``, ``fp8-qdq``) stashes how to redo
its conversion, ``state.stash[LOWERED] = Lowering(self, before)``; ``precision-repair``
reads it and converts again with more nodes kept in FP32
(`routetune.passes.precision.repair`). The stash is core's typed extension point
(`routetune.stash`); core knows nothing of this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx_graphsurgeon as gs

from routetune.seasoning import Seasoning
from routetune.stash import Codec, StashContext, StashKey


@dataclass(frozen=True)
class Lowering:
    """A precision seasoning's conversion, kept so that it can be redone.

    Args:
        seasoning: The precision seasoning as applied; it has a ``nodes_to_exclude``
            parameter.
        graph: A copy of the graph it converted, before conversion.
    """

    seasoning: Seasoning
    graph: gs.Graph


def _encode(lowering: Lowering, context: StashContext) -> dict[str, Any]:
    """The seasoning by name and parameters, the graph as a kept model by sha256."""
    return {"seasoning": lowering.seasoning.info.name,
            "params": dict(lowering.seasoning.params),
            "model_sha256": context.keep(context.serialized(lowering.graph))}


def _decode(data: dict[str, Any], context: StashContext) -> Lowering:
    params = {k: tuple(v) if isinstance(v, list) else v  # JSON has no tuple
              for k, v in data["params"].items()}
    seasoning = context.registry.seasoning(data["seasoning"])(params)
    return Lowering(seasoning, context.graph(context.stored(data["model_sha256"])))


LOWERED: StashKey[Lowering] = StashKey("precision.lowering", Codec(_encode, _decode))
"""Where a precision seasoning stashes its `Lowering`."""
