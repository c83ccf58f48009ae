"""The built-in graph seasonings, registered as the ``graph`` plugin."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.graph.eliminate_noops import EliminateNoops
from routetune.passes.graph.fold_constants import FoldConstants
from routetune.passes.graph.fold_if import FoldIf
from routetune.passes.graph.fuse_bn_into_conv import FuseBnIntoConv
from routetune.passes.graph.int32_limits import Int32Limits
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the graph rewrites, and TensorRT's preflight rewrites (not searched).

    ``eliminate-noops``, ``fold-constants`` and ``fuse-bn-into-conv`` are searched;
    ``int32-limits`` and ``fold-if`` form the ``tensorrt`` backend's base pipeline.
    """
    for cls in (EliminateNoops, FoldConstants, FuseBnIntoConv, Int32Limits, FoldIf):
        registry.add_seasoning(cls)
