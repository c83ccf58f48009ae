"""`RayPool`: trials spread over the nodes of a Ray cluster (``--executor ray``).

The search's process is the Ray driver; it alone writes the trial store and the output
directory. On the cluster (`routetune.plugins.ray.tasks`):

- builds run as Ray tasks holding one ``CPU`` each, placed by this pool on a node with a CPU
  free (as many at once as the node has CPUs);
- measure phases run in measuring actors, fixed to a node and a GPU for the whole run: one per
  GPU (``num_gpus=1``) for a GPU backend, one per node on the CPU, where no build runs on a
  node while its actor measures, and a measurement waiting for a node keeps new builds off it
  (as `routetune.execution.local_pool.LocalPool` does on one machine). Each trial is timed
  against the base route on the same actor, so trials measured on different machines compare
  through their speed-ups, never directly.

Files travel through Ray's object store (`routetune.plugins.ray.tasks.Bundle`), never a shared
file system. Jobs are fed, and phases logged to ``artifacts/timeline.jsonl`` (with the node),
as in `LocalPool` (`routetune.execution.scheduling`).

Faults: a dead worker gives ``crashed``, a phase past ``--trial-timeout`` ``timed-out`` (the
task cancelled or the actor replaced), each with the end of its log from its node. A node lost
mid-trial sends the trial back to the queue once, for another node; each lost attempt is in
the timeline (``node-lost``) and in ``conditions["lost_attempts"]``. Every trial's
``conditions["node"]`` says where it was measured (or built).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from routetune.candidate.records import BUILT, Outcome, StoredEngine, TrialInputs
from routetune.errors import describe, one_line
from routetune.execution import scheduling
from routetune.execution.executor import (
    NOT_MEASURED,
    AfterBuild,
    Executor,
    ExecutorSettings,
    Job,
)
from routetune.execution.scheduling import JobFeed, Timeline, died, timed_out
from routetune.logs import LOGS
from routetune.plugins.ray import cluster as ray_cluster
from routetune.plugins.ray import tasks as ray_tasks
from routetune.plugins.ray.cluster import Node, on_node
from routetune.records.trial import Confirmation
from routetune.registry import Registry

ATTEMPTS = 2
"""Attempts per trial when nodes are lost under it: the first and one re-queued."""

SETTLE_S = 5.0  # seconds `RayPool.cancel` gives cancelled phases before killing actors


@dataclass
class _Slot:
    """A measuring actor: its node, its handle (None once killed) and its current job."""

    node: Node
    actor: Any = None
    job: Job | None = None


@dataclass
class _Phase:
    """A phase running on the cluster."""

    job: Job
    node: Node
    start: float
    bundle: Any = None  # the build's files (ObjectRef): built, or measured from
    built: Outcome | None = None  # a measurement's build outcome
    slot: _Slot | None = None
    lost: list[dict[str, Any]] = field(default_factory=list)  # attempts lost with a node
    where: dict[str, Any] = field(default_factory=dict)  # where it ran (ray_tasks.Where)


class RayPool(Executor):
    """Build tasks and measuring actors on a Ray cluster (``--executor ray``).

    Args:
        address: ``--ray-address``: None (start Ray here), ``auto`` or ``HOST:PORT``
            (`routetune.plugins.ray.cluster`).
        backend: The backend's name, for messages.
        gpu: Whether the backend's engines run on GPUs (`Backend.gpus` not empty).
        timeout_s: Seconds each phase may run once handed to the cluster.
        tasks: What runs on the nodes: `routetune.plugins.ray.tasks`, or a stand-in
            (``benchmarks/ray_scale.py`` simulates trials with one).
    """

    name = "ray"
    summary = ("trials spread over the nodes of a Ray cluster (--ray-address; the ray "
               "extra on every node)")
    refuses_worker_options = ("on a Ray cluster each node builds as many routes at once as "
                              "it has CPUs (`ray start --num-cpus`); drop them")
    cluster = True

    def __init__(self, address: str | None, backend: str, gpu: bool, timeout_s: float,
                 tasks: Any = ray_tasks) -> None:
        self.address, self.backend, self.gpu, self.timeout_s, self.tasks = (
            address, backend, gpu, timeout_s, tasks)
        self._connected = False
        self._nodes: list[Node] = []
        self._slots: list[_Slot] = []
        self._outdir = Path()  # the driver's output directory, once `start` gives it
        self._box: list[Any] = []
        self._run = ""
        self._running: dict[Any, _Phase] = {}
        self._prefixes: dict[Any, tuple[Any, str]] = {}  # model steps -> (bundle, node id)

    @classmethod
    def make(cls, settings: ExecutorSettings) -> RayPool:
        """Tasks and actors on the cluster at ``settings.address``.

        Ray is imported later, when `warm_up` connects.
        """
        return cls(settings.address, settings.backend, bool(settings.gpus), settings.timeout_s)

    def warm_up(self, outdir: Path) -> None:
        """Connect to the cluster and check that it can run this backend.

        Raises:
            UsageError: Ray is missing, the address does not answer, or the cluster
                lacks CPUs, or GPUs for a GPU backend (`ray_cluster.check_resources`).
        """
        if self._connected:
            return
        ray_cluster.connect(self.address)
        self._connected = True
        try:
            self._nodes = ray_cluster.alive_nodes()
            ray_cluster.check_resources(self._nodes, self.backend, self.gpu)
        except BaseException:
            self.close()
            raise
        self._run = os.urandom(8).hex()  # names the run's folder on each node

    def start(self, registry: Registry, inputs: TrialInputs) -> None:
        """Put the inputs in the object store and start the measuring actors."""
        scheduling.check_plugins_travel(registry)
        self.warm_up(inputs.outdir)
        ray = ray_cluster.import_ray()
        self._outdir = inputs.outdir
        self._box = [ray.put(inputs), ray_tasks.put_weights(inputs), ray_tasks.driver()]
        self._spawn()

    def _spawn(self) -> None:
        """One measuring actor per GPU, or per node on the CPU; wait until all loaded."""
        self._slots = [_Slot(node) for node in self._nodes
                       for _ in range(node.gpus if self.gpu else 1)]
        for slot in self._slots:
            slot.actor = self._actor(slot.node)
        ray = ray_cluster.import_ray()
        ray.get([s.actor.ready.remote() for s in self._slots], timeout=self.timeout_s)

    def _actor(self, node: Node) -> Any:
        ray = ray_cluster.import_ray()
        remote = ray.remote(self.tasks.Measurer).options(
            num_cpus=0, num_gpus=1 if self.gpu else 0, max_restarts=0,
            scheduling_strategy=on_node(node.id))
        return remote.remote(self._box, self._run, self.timeout_s)

    def _first(self) -> Node:
        """The first node that measures: this one, where it can."""
        return next(n for n in self._nodes if n.gpus or not self.gpu)

    def run(self, jobs: Iterator[Job], after_build: AfterBuild) -> Iterator[tuple[Job, Outcome]]:
        """Schedule builds and measurements as the module docstring says."""
        ray = ray_cluster.import_ray()
        feed = JobFeed(jobs)
        waiting: deque[_Phase] = deque()  # built, to measure
        retry: deque[_Phase] = deque()  # lost with a node, to run again
        while True:
            yield from self._place_measurements(waiting, after_build)
            self._place_builds(feed, retry, waiting)
            if not self._running:
                if not (waiting or retry or feed.pending):
                    return
                if not self._slots or not any(n.cpus for n in self._nodes):
                    raise RuntimeError("the Ray cluster lost every node that could build "
                                       "or measure")
                continue
            refs = sorted(self._running, key=lambda r: self._running[r].job.fingerprint)
            done, _ = ray.wait(refs, num_returns=1, timeout=self._wait_s())
            if done:  # all of those finished by now, in a stable order
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in [r for r in refs if r in done] + self._overdue(done):
                phase = self._running.pop(ref)
                outcome = self._finished(ref, phase, ref in done)
                if outcome is None:  # lost with its node
                    if len(phase.lost) < ATTEMPTS and self._nodes:
                        retry.append(replace(phase, bundle=None, built=None, slot=None))
                        continue
                    outcome = died(phase.lost[-1]["phase"], "its node was lost "
                                   f"{len(phase.lost)} times (conditions.lost_attempts)", {})
                elif outcome.status == BUILT:
                    waiting.append(replace(phase, built=outcome))
                    continue
                yield phase.job, self._recorded(outcome, phase)

    def _place_measurements(self, waiting: deque[_Phase], after_build: AfterBuild
                            ) -> Iterator[tuple[Job, Outcome]]:
        """Measure built trials in order (where built, if free), or yield `after_build`'s."""
        for phase in list(waiting):
            free = [s for s in self._slots if s.job is None and s.actor is not None
                    and (self.gpu or not self._builds_on(s.node))]
            if not free:
                return
            waiting.remove(phase)
            job, built = phase.job, phase.built
            assert built is not None
            final = after_build(job, built)
            if final is not None:
                if final is not NOT_MEASURED:
                    yield job, self._recorded(final, phase)
                continue
            slot = next((s for s in free if s.node == phase.node), free[0])  # files there
            start = time.time()
            ref = slot.actor.measure.remote(job.route, job.fingerprint, built.fields, job.bar,
                                            start + self.timeout_s, phase.bundle)
            slot.job = job
            self._running[ref] = replace(phase, node=slot.node, start=start, slot=slot)

    def _place_builds(self, feed: JobFeed, retry: deque[_Phase], waiting: deque[_Phase]
                      ) -> None:
        ray = ray_cluster.import_ray()
        task = ray.remote(self.tasks.build)
        for node in self._nodes:
            while self._builds_on(node) < node.cpus and not (
                    not self.gpu and any(s.node == node and (s.job or waiting)
                                         for s in self._slots)):
                if retry:
                    phase = retry.popleft()
                else:
                    job = feed.next_ready(p.job for p in self._running.values()
                                          if p.slot is None)
                    if job is None:
                        return
                    phase = _Phase(job, node, 0.0)
                start = time.time()
                meta, bundle = task.options(
                    num_cpus=1, num_returns=2, max_retries=0,
                    scheduling_strategy=on_node(node.id)).remote(
                    self._box, self._run, phase.job.route, phase.job.fingerprint,
                    start + self.timeout_s, *self._bundles(phase.job, node))
                self._running[meta] = replace(phase, node=node, start=start, bundle=bundle)

    def _builds_on(self, node: Node) -> int:  # running now
        return sum(p.node == node and p.slot is None for p in self._running.values())

    def _bundles(self, job: Job, node: Node) -> list[Any]:
        """Files of finished builds that `job`'s model steps extend, made on other nodes."""
        steps = job.model_steps.steps
        found = [self._prefixes.get(steps[:n]) for n in range(1, len(steps) + 1)]
        return [ref for ref, where in filter(None, found) if where != node.id]

    def _wait_s(self) -> float:  # until the next phase runs out of time, at most 1 s
        first = min(p.start for p in self._running.values()) + self.timeout_s
        return max(0.0, min(1.0, first - time.time()))

    def _overdue(self, done: list[Any]) -> list[Any]:
        return [r for r, p in self._running.items()
                if r not in done and time.time() - p.start > self.timeout_s]

    def _finished(self, ref: Any, phase: _Phase, ready: bool) -> Outcome | None:
        """A phase's outcome; None when its node was lost (recorded in `phase.lost`)."""
        ray = ray_cluster.import_ray()
        what = "build" if phase.slot is None else "measure"
        fields = phase.built.fields if phase.built is not None else {}
        where: dict[str, Any] = {"node": phase.node.ip, "node_id": phase.node.id}
        start, end, pid, outcome = phase.start, time.time(), None, None
        if phase.slot is not None:
            phase.slot.job = None
        if not ready:  # past --trial-timeout
            self._stop(ref, phase)
            outcome = timed_out(what, self.timeout_s, fields, self._tail(phase))
        else:
            try:
                (timed, where, text) = ray.get(ref)
                outcome, start, end, pid = timed
                ray_tasks.append_log(self._outdir, f"{phase.job.fingerprint[:16]}.log", text)
                if outcome.status == BUILT:  # the driver keeps every candidate model
                    ray_tasks.unpack(self._outdir, ray.get(phase.bundle))
            except Exception as e:
                if ray_cluster.lost_node(e, phase.node.id):
                    self._lose(phase, what, e)
                    return None
                self._stop(ref, phase)
                outcome = died(what, one_line(describe(e), 300), fields, self._tail(phase))
        self._event(what, phase, outcome.status, start, end, pid, where)
        if outcome.status == BUILT and phase.job.model_steps:
            self._prefixes[phase.job.model_steps.steps] = (phase.bundle, phase.node.id)
        phase.where = where
        return outcome

    def _lose(self, phase: _Phase, what: str, error: BaseException) -> None:
        """Record a phase lost with its node, and forget the node."""
        now, node = time.time(), {"node": phase.node.ip, "node_id": phase.node.id}
        phase.lost.append({"phase": what, **node, "error": one_line(describe(error), 300),
                           "start": round(phase.start, 4), "end": round(now, 4)})
        self._event(what, phase, "node-lost", phase.start, now, None, node)
        self._nodes = [n for n in self._nodes if n.id != phase.node.id]
        self._slots = [s for s in self._slots if s.node.id != phase.node.id]
        self._prefixes = {k: v for k, v in self._prefixes.items() if v[1] != phase.node.id}

    def _recorded(self, outcome: Outcome, phase: _Phase) -> Outcome:
        """`outcome` with where it ran, and the attempts lost, in its conditions."""
        conditions = dict(outcome.fields.get("conditions") or {})
        conditions["node"] = phase.where or {"node": phase.node.ip, "node_id": phase.node.id}
        if phase.lost:
            conditions["lost_attempts"] = list(phase.lost)
        return replace(outcome, fields={**outcome.fields, "conditions": conditions})

    def _stop(self, ref: Any, phase: _Phase) -> None:
        """Cancel a build task, or kill a measuring actor (a new one takes its place)."""
        ray = ray_cluster.import_ray()
        slot = phase.slot
        if slot is None:
            ray.cancel(ref, force=True)
        elif slot.actor is not None:
            ray.kill(slot.actor, no_restart=True)
            slot.actor = self._actor(slot.node) if slot in self._slots else None

    def _tail(self, phase: _Phase) -> str:
        """The end of the trial's log on its node (`log_tail`), which is copied here."""
        ray, name = ray_cluster.import_ray(), f"{phase.job.fingerprint[:16]}.log"
        task = ray.remote(self.tasks.read_log).options(
            num_cpus=0, max_retries=0, scheduling_strategy=on_node(phase.node.id))
        try:
            text = ray.get(task.remote(self._run, name), timeout=10)
        except Exception as e:  # the node went away meanwhile: say where the log was
            return f" (the log on node {phase.node.ip} is out of reach: {describe(e)[:100]})"
        ray_tasks.append_log(self._outdir, name, text[text.rfind("\n== ") + 1:])
        return scheduling.log_tail(text, f"log {LOGS / name}, from node {phase.node.ip}")

    def _event(self, what: str, phase: _Phase, status: str, start: float, end: float,
               pid: int | None, where: dict[str, Any]) -> None:
        Timeline(self._outdir).add({
            "phase": what, "route": str(phase.job.route), "status": status, "start": start,
            "end": end, "pid": pid, **{k: where.get(k) for k in ("gpu", "node", "node_id")}})

    def confirm(self, stored: StoredEngine) -> Confirmation:
        """Re-measure on a new actor on the first measuring node, stopped after."""
        result: Confirmation = self._on_actor("confirm", stored, fresh=True)
        return result

    def outputs(self, stored: StoredEngine) -> list[dict[str, np.ndarray]] | None:
        """Build the engine and run it on the first measuring node's actor."""
        result: list[dict[str, np.ndarray]] | None = self._on_actor("outputs", stored,
                                                                    fresh=False)
        return result

    def _on_actor(self, method: Literal["confirm", "outputs"], stored: StoredEngine,
                  fresh: bool) -> Any:
        """Run the measurer's `method` on the first measuring node's actor, or a new one.

        The trial's candidate model (under the output directory) goes along, with the
        external data files it names.

        Raises:
            TimeoutError: It ran past ``--trial-timeout``.
            Exception: Whatever the method raised.
        """
        ray = ray_cluster.import_ray()
        if not fresh and not self._slots:  # released: one actor, on the first measuring node
            self._slots = [_Slot(self._first())]
            self._slots[0].actor = self._actor(self._slots[0].node)
        slot = _Slot(self._first()) if fresh else self._slots[0]
        actor = self._actor(slot.node) if fresh else slot.actor
        bundle = ray_tasks.model_bundle(self._outdir, stored.artifact)
        start = time.time()
        try:
            ref = getattr(actor, method).remote(stored, bundle)
            try:
                result, text = ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError as e:
                ray.kill(actor, no_restart=True)
                if not fresh:
                    slot.actor = self._actor(slot.node)
                raise TimeoutError(f"{method} ran past --trial-timeout {self.timeout_s:g} s"
                                   ) from e
            ray_tasks.append_log(self._outdir, f"{method}.log", text)
            return result
        finally:
            if fresh:
                ray.kill(actor, no_restart=True)
            Timeline(self._outdir).add({
                "phase": method, "route": stored.route, "status": None, "start": start,
                "end": time.time(), "pid": None, "gpu": None, "node": slot.node.ip,
                "node_id": slot.node.id})

    def in_flight(self) -> list[Job]:
        """The jobs whose phase runs on the cluster."""
        return sorted((p.job for p in self._running.values()), key=lambda j: str(j.route))

    def cancel(self) -> None:
        """Stop every phase in flight, then the actors; `call` starts new ones.

        Phases get a `KeyboardInterrupt` first and `SETTLE_S` to end: Ray 2.60's driver
        can abort when a task it killed or force-cancelled answers meanwhile.
        """
        if not self._connected:
            return
        ray, refs = ray_cluster.import_ray(), list(self._running)
        for ref in ray.wait(refs, num_returns=len(refs), timeout=0)[1] if refs else ():
            ray.cancel(ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)
        for slot in self._slots:
            if slot.actor is not None:
                ray.kill(slot.actor, no_restart=True)
        self._running.clear()
        self._slots = []

    def release(self) -> None:
        """Stop the search's actors and tasks; `call` starts what it needs."""
        self.cancel()

    def close(self) -> None:
        """Stop everything, delete the run's folders on the nodes, and leave the cluster."""
        if not self._connected:
            return
        self.cancel()
        if self._run:
            ray, task = ray_cluster.import_ray(), ray_cluster.import_ray().remote(self.tasks.clean)
            refs = [task.options(num_cpus=0, max_retries=0, scheduling_strategy=on_node(n.id))
                    .remote(self._run) for n in self._nodes]
            ray.wait(refs, num_returns=len(refs), timeout=10)
        ray_cluster.shutdown()
        self._connected = False
