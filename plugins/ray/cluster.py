"""Joining a Ray cluster, and what `routetune.plugins.ray.pool.RayPool` needs to know of it.

``--ray-address`` takes three forms:

- not given: start a Ray instance on this machine for the run, stopped at its end;
- ``auto``: join the cluster that ``ray start`` started on this machine (or the one
  ``RAY_ADDRESS`` names);
- ``HOST:PORT``: join the cluster whose head listens there (``ray start --head``
  prints it; the GCS port, 6379 by default).

Ray is imported here only, and only when ``--executor ray`` is asked for.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from routetune.install import pip_install
from routetune.options import OptionError

logger = logging.getLogger(__name__)

UNAVAILABLE_GRACE_S = 30.0
"""Seconds to wait for the cluster to declare a node dead after an actor on it became
unreachable (Ray's default health checks take about 15 s: 3 s periods, 5 misses)."""

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a TCP connection to the head before ``--ray-address`` is refused
(Ray itself retries for minutes)."""


@dataclass(frozen=True)
class Node:
    """One alive node of the cluster.

    Args:
        id: Ray's node id (hex).
        ip: Its IP address.
        cpus: Its ``CPU`` resource (builds at once).
        gpus: Its ``GPU`` resource (measuring actors, for a GPU backend).
    """

    id: str
    ip: str
    cpus: int
    gpus: int


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        OptionError: Ray is not installed (a `UsageError` naming ``executor``).
    """
    try:
        import ray
    except ImportError as e:
        raise OptionError("executor", f" ray: Ray is not installed; {pip_install('ray')} "
                          "on this machine and on every node") from e
    return ray


def connect(address: str | None) -> bool:
    """Connect this process to Ray (see the module docstring).

    Ray's own logging is left as it is, and its workers' output is not echoed here
    (each phase's output is in the trial's log). The SIGINT and SIGTERM handlers in place
    stay (`routetune.signals`: the first signal stops the search and keeps its trials).

    Returns:
        Whether a Ray instance was started here (``address`` None).

    Raises:
        OptionError: Ray is not installed, or no cluster answers at `address` (a
            `UsageError` naming the option as the user wrote it).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address not in (None, "auto"):
        _reachable(address)
    kwargs: dict[str, Any] = {"configure_logging": False, "log_to_driver": False}
    if address is None:
        kwargs["include_dashboard"] = False
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = "a cluster started on this machine" if address == "auto" else address
        raise OptionError(
            "ray_address", f" {address}: no Ray cluster found at {where} "
            f"({' '.join(str(e).split())[:200]}); start one with `ray start --head`, or "
            "leave the address out to start one for this run") from e
    finally:  # Ray's core worker puts its own SIGTERM handler in ours' place (it exits)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                if handler is not None:
                    signal.signal(sig, handler)
    return address is None


def _reachable(address: str) -> None:
    """Refuse an address whose head does not accept a TCP connection, quickly."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise OptionError("ray_address", f" {address}: write HOST:PORT (the head's GCS "
                          "address, e.g. 10.0.0.1:6379), or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise OptionError(
            "ray_address", f" {address}: no Ray cluster answers there ({e.strerror or e}); "
            "start one with `ray start --head --port "
            f"{port}` on {host}, or check the address `ray start` printed") from e


def alive_nodes() -> list[Node]:
    """The cluster's alive nodes: this process's node first, then by IP address and id."""
    ray = import_ray()
    here = ray.get_runtime_context().get_node_id()
    nodes = [Node(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)),
                  int(n["Resources"].get("GPU", 0)))
             for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (n.id != here, n.ip, n.id))


def is_alive(node_id: str) -> bool:
    """Whether the node is alive now (as the cluster's control store knows it)."""
    return any(n.id == node_id for n in alive_nodes())


def check_resources(nodes: list[Node], backend: str, gpu: bool) -> None:
    """Refuse a cluster without CPUs to build on, or without GPUs for a GPU backend.

    Raises:
        OptionError: No node has a ``CPU`` resource; or `gpu` and no node has a
            ``GPU`` (a `UsageError` naming ``executor``).
    """
    if not any(n.cpus for n in nodes):
        raise OptionError(
            "executor", " ray: no node of this Ray cluster has a CPU to build routes on; "
            "start one with `ray start --num-cpus N` (N of 1 or more)")
    if gpu and not any(n.gpus for n in nodes):
        raise OptionError(
            "executor", f" ray: the {backend} backend measures on GPUs, and this Ray "
            f"cluster ({len(nodes)} node{'s' * (len(nodes) != 1)}) has none; start its "
            "GPU nodes with `ray start` (it finds their GPUs), or choose a CPU backend")


def on_node(node_id: str) -> Any:
    """A scheduling strategy that runs a task or actor on this node, and nowhere else."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def lost_node(error: BaseException, node_id: str, grace_s: float = UNAVAILABLE_GRACE_S
              ) -> bool:
    """Whether `error`, from a task or actor on `node_id`, means the node was lost.

    A raylet that dies fails its tasks with `NodeDiedError` and its actors with an
    `ActorDiedError` that says so; an object that lived only there is lost. An actor
    whose connection broke before the cluster decided (`ActorUnavailableError`) is
    lost with its node if the node is declared dead within `grace_s` seconds.
    """
    ray = import_ray()
    exc = ray.exceptions
    if isinstance(error, exc.NodeDiedError | exc.ObjectLostError | exc.OwnerDiedError):
        return True
    if isinstance(error, exc.ActorUnavailableError):
        deadline = time.monotonic() + grace_s
        while is_alive(node_id) and time.monotonic() < deadline:
            time.sleep(0.25)
        return not is_alive(node_id)
    if isinstance(error, exc.RayActorError | exc.WorkerCrashedError):
        return "node has died" in str(error) or not is_alive(node_id)
    return False


def shutdown() -> None:
    """Disconnect this process from Ray (and stop the instance it started, if any)."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
