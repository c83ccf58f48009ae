"""The built-in graph seasonings, registered as the ``graph`` plugin."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.graph.eliminate_noops import EliminateNoops
from routetune.passes.graph.fold_constants import FoldConstants
from routetune.passes.graph.fuse_bn_into_conv import FuseBnIntoConv
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register ``eliminate-noops``, ``fold-constants`` and ``fuse-bn-into-conv``."""
    registry.add_seasoning(EliminateNoops)
    registry.add_seasoning(FoldConstants)
    registry.add_seasoning(FuseBnIntoConv)
