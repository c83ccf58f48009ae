"""Ray: trials spread over the nodes of a Ray cluster (``--executor ray``).

An integration like the backends': `pool.RayPool` is the executor (build tasks and
measuring actors), `tasks` what runs on the nodes, `cluster` connecting and placing.
Ray itself is imported only when a run connects (``pip install 'routetune[ray]'``).
"""

from __future__ import annotations

from routetune.hookspecs import hookimpl
from routetune.plugins.ray.pool import RayPool
from routetune.registry import Registry


@hookimpl
def routetune_register_executors(registry: Registry) -> None:
    """Register ``--executor ray``."""
    registry.add_executor(RayPool)
