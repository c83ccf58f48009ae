"""What runs on the nodes of a Ray cluster for `routetune.plugins.ray.pool.RayPool`.

Build phases run as Ray tasks (`build`); measure phases, and the final ``confirm`` and
``outputs`` calls, in measuring actors (`Measurer`). Both are plain Python here:
`RayPool` wraps them with ``ray.remote`` and its resources. A Ray worker process keeps
its `Candidate` (plugins, model, base-route engine) between tasks of one run.

No shared file system is assumed. Each node keeps the run's files in a folder of its
own (`node_outdir`, under the node's temporary directory). What a build wrote under
``artifacts/`` (the candidate model, route prefixes' models and index entries, a kept
engine) comes back as a `Bundle`, through Ray's object store; it is written
(`unpack`) where the trial is measured, on nodes that build routes extending it, and
in the driver's output directory. Each phase's log comes back as text, which the
driver appends to the trial's log there. A model with external data (over 2 GiB) sends
its data files once per run (`put_weights`); each node other than the driver's writes
them into its folder once (`_with_weights`).

Every task and actor gets the run as a ``box``: ``[inputs, weights, driver]``, the
ObjectRef of the `TrialInputs`, that of the base model's external data files (or None),
and the driver's (Ray node id, pid). Refs inside a list are not fetched with each task.
"""

from __future__ import annotations

import faulthandler
import fcntl
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import numpy as np
import onnx

from routetune.candidate.candidate import Candidate
from routetune.candidate.records import Built, StoredEngine, TrialInputs
from routetune.execution.worker import Timed, run_phase
from routetune.logs import LOGS, captured
from routetune.model import weights
from routetune.records.trial import Confirmation
from routetune.routes.route import Route
from routetune.timing.race import Bar

T = TypeVar("T")

Bundle = dict[str, bytes]
"""Files by path relative to the output directory (always under ``artifacts/``)."""

Where = dict[str, Any]
"""Where a phase ran: ``node`` (IP address), ``node_id`` (Ray's, hex), ``hostname``,
``gpu`` (Ray's GPU id, the ``CUDA_VISIBLE_DEVICES`` value, or None) and ``pid``."""

Done = tuple[Timed, Where, str]
"""A phase's `Timed` result, where it ran, and what it wrote to the trial's log."""

_NOT_SHIPPED = ("artifacts/logs/", "artifacts/timeline", "artifacts/busy-")


def node_outdir(run: str, node_id: str) -> Path:
    """A node's folder for run `run` (a `RayPool` run key): its trials' output directory.

    Named by the node's id too, so that two nodes on one machine (a test's cluster) keep
    apart what two machines would.
    """
    return Path(tempfile.gettempdir()) / "routetune-ray" / run / node_id[:12]


def append_log(outdir: Path, name: str, text: str) -> None:
    """Append a phase's log text to ``OUTDIR/artifacts/logs/NAME``."""
    log = outdir / LOGS / name
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(text)


@dataclass
class _Process:
    """What one Ray worker process keeps for the run it works for."""

    key: str
    candidate: Candidate


_current: _Process | None = None


def _setup() -> None:
    """Once per process: stacks on a fatal signal, warnings to the trial's log."""
    if not faulthandler.is_enabled():
        faulthandler.enable()
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")


def _live(box: list[Any], run: str) -> Candidate:
    """This process's candidate for the run that `box` holds (see the module docstring).

    The inputs come from the object store once per process; their output directory is
    this node's, and so are the base model's external data files, on nodes other than
    the driver's. The tuner's own processes, for the busy check, are the node's raylet
    (whose children are the run's Ray workers: builds, the measuring actor) and the
    driver where it runs on this node.
    """
    global _current
    import ray

    key = f"{run} {box[0].hex()}"
    if _current is None or _current.key != key:
        from routetune.plugin_manager import load_registry

        _setup()
        if _current is not None:
            _current.candidate.close()
            _current = None
        inputs: TrialInputs = ray.get(box[0])
        node, (driver_node, driver_pid) = ray.get_runtime_context().get_node_id(), box[2]
        here = node == driver_node
        inputs = replace(inputs, outdir=node_outdir(run, node), tuner_pids=(
            os.getppid(), *((driver_pid,) if here else ())))
        if inputs.model.weights is not None:
            inputs = _with_weights(inputs, None if here else ray.get(box[1]))
        _current = _Process(key, Candidate(load_registry(), inputs))
    return _current.candidate


def put_weights(inputs: TrialInputs) -> Any:
    """The base model's external data files in the object store, for the other machines.

    Returns:
        An ObjectRef of ``{location: uint8 array}``, locations relative to
        ``inputs.model.weights`` (Ray keeps numpy arrays in its store without pickling);
        None for a model without external data, or when every node of the cluster is
        the driver's (they copy the files from its folder).
    """
    import ray

    model = inputs.model
    here = ray.get_runtime_context().get_node_id()
    if model.weights is None or all(n["NodeID"] == here for n in ray.nodes() if n["Alive"]):
        return None
    return ray.put({name: np.fromfile(model.weights / name, dtype=np.uint8)
                    for name in sorted(weights.locations(model.proto))})


def _with_weights(inputs: TrialInputs, files: Mapping[str, np.ndarray] | None) -> TrialInputs:
    """`inputs` with the base model's external data in this node's folder, and read there.

    Candidate models are written to the node's folder and name their data files relative
    to it, so the base model's must be there too. Each is written once per node (under a
    lock: a node's build tasks and measuring actor start together): from `files` (the
    object store's), or on the driver's node (`files` None) copied from the driver's
    folder.
    """
    store = inputs.outdir / "artifacts" / "models"
    source = inputs.model.weights
    store.mkdir(parents=True, exist_ok=True)
    with open(inputs.outdir / "weights.lock", "w") as lock:  # outside artifacts/: not shipped
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in sorted(weights.locations(inputs.model.proto)):
            dest = store / name
            if dest.is_file():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
            if files is not None:
                files[name].tofile(tmp)
            elif source is not None:  # a copy: the ONNX checker refuses hard-linked data
                shutil.copyfile(source / name, tmp)
            os.replace(tmp, dest)
    return replace(inputs, model=replace(inputs.model, weights=store))


def model_bundle(outdir: Path, artifact: str) -> Bundle:
    """A stored candidate model and its external data files, for a ``confirm`` or ``outputs``.

    Args:
        outdir: The driver's output directory.
        artifact: The model's path relative to it (`Trial.artifact`), or "".

    Returns:
        The files by path relative to `outdir`; empty without a model.
    """
    path = outdir / artifact
    if not artifact or not path.is_file():
        return {}
    bundle = {artifact: path.read_bytes()}
    proto = onnx.load_model_from_string(bundle[artifact])  # names its data, reads none
    for name in sorted(weights.locations(proto)):
        data = path.parent / name
        if data.is_file():
            bundle[(PurePosixPath(artifact).parent / name).as_posix()] = data.read_bytes()
    return bundle


def where() -> Where:
    """This process's node, GPU and pid."""
    import ray

    gpus = ray.get_gpu_ids()
    return {"node": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "gpu": ",".join(str(g) for g in gpus) if gpus else None, "pid": os.getpid()}


def driver() -> tuple[str, int]:
    """This process's Ray node id and pid: the driver's, in the run's ``box``."""
    import ray

    return ray.get_runtime_context().get_node_id(), os.getpid()


def _files(outdir: Path) -> dict[str, tuple[int, int]]:
    """Shippable files under ``artifacts/``: relative path to (size, mtime in ns)."""
    out: dict[str, tuple[int, int]] = {}
    root = outdir / "artifacts"
    if not root.is_dir():
        return out
    for path in root.rglob("*"):
        rel = path.relative_to(outdir).as_posix()
        if path.is_file() and not rel.startswith(_NOT_SHIPPED) and ".tmp" not in path.name:
            stat = path.stat()
            out[rel] = (stat.st_size, stat.st_mtime_ns)
    return out


def pack(outdir: Path, before: Mapping[str, tuple[int, int]], always: tuple[str, ...] = ()
         ) -> Bundle:
    """The files written under ``outdir/artifacts`` since `before` (`_files`), and `always`."""
    after = _files(outdir)
    names = {n for n, stat in after.items() if before.get(n) != stat} | set(always)
    return {n: (outdir / n).read_bytes() for n in sorted(names) if (outdir / n).is_file()}


def unpack(outdir: Path, bundle: Bundle) -> None:
    """Write a bundle's files under `outdir` (atomically), unless there with that content.

    Raises:
        ValueError: A path is absolute, leaves ``artifacts/`` or names a log.
    """
    for name, data in bundle.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or rel.parts[:1] != ("artifacts",) \
                or name.startswith(_NOT_SHIPPED):
            raise ValueError(f"a bundle may only hold files under artifacts/: {name!r}")
        path = outdir / rel
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{time.monotonic_ns()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)


def _logged(outdir: Path, fingerprint: str, phase: Any) -> Done:
    """Run `phase(log)` and return its result, where it ran, and what it logged."""
    log = outdir / LOGS / f"{fingerprint[:16]}.log"
    start = log.stat().st_size if log.is_file() else 0
    timed = phase(log)
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return timed, where(), text


def build(box: list[Any], run: str, route: Route, fingerprint: str, deadline: float,
          *bundles: Bundle) -> tuple[Done, Bundle]:
    """The build phase of one trial, as a Ray task (`Candidate.build`).

    Args:
        box: The run (the module docstring says what it holds).
        run: The run's key (names this node's folder, `node_outdir`).
        route: The route.
        fingerprint: The trial's fingerprint.
        deadline: When the driver stops waiting (Unix time, s: handed over plus
            ``--trial-timeout``); every thread's Python stack goes to the log half a
            second before.
        *bundles: Files that routes this one extends made on other nodes.

    Returns:
        The phase (`Done`) and the files it wrote (`Bundle`), two Ray objects.
    """
    candidate = _live(box, run)
    outdir = candidate.outdir
    for bundle in bundles:
        unpack(outdir, bundle)
    before = _files(outdir)
    done = _logged(outdir, fingerprint, lambda log: run_phase(
        log, f"build {route}", {}, lambda: candidate.build(route, fingerprint),
        _left(deadline), restore=True))
    artifact = done[0][0].fields.get("artifact")
    return done, pack(outdir, before, (artifact,) if artifact else ())


def _left(deadline: float) -> float:
    """Seconds left until `deadline` (Unix time), for the stack dump; at least 1."""
    return max(1.0, deadline - time.time())


def read_log(run: str, name: str) -> str:
    """This node's log ``artifacts/logs/NAME`` of run `run` (a Ray task), or empty."""
    import ray

    log = node_outdir(run, ray.get_runtime_context().get_node_id()) / LOGS / name
    return log.read_text(errors="replace") if log.is_file() else ""


def clean(run: str) -> None:
    """Delete this node's folder of run `run` (a Ray task, at the end of a run)."""
    import ray

    folder = node_outdir(run, ray.get_runtime_context().get_node_id())
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()  # the run's, once no node of this machine has one
    except OSError:
        pass


class Measurer:
    """A measuring actor: measures trials on one node (and one GPU) for a whole run.

    Args:
        box: The run (the module docstring says what it holds).
        run: The run's key.
        timeout_s: ``--trial-timeout`` (s).
    """

    def __init__(self, box: list[Any], run: str, timeout_s: float) -> None:
        self.box, self.run, self.timeout_s = box, run, timeout_s

    def ready(self) -> Where:
        """Load plugins, inputs and model now; where this actor runs."""
        _live(self.box, self.run)
        return where()

    def measure(self, route: Route, fingerprint: str, built: Built, bar: Bar | None,
                deadline: float, *bundles: Bundle) -> Done:
        """The measure phase of one trial (`Candidate.measure`), its build's files first.

        It races against `bar`; `deadline` is as `build`'s.
        """
        candidate = _live(self.box, self.run)
        for bundle in bundles:
            unpack(candidate.outdir, bundle)
        return _logged(candidate.outdir, fingerprint, lambda log: run_phase(
            log, f"measure {route}", built,
            lambda: candidate.measure(route, fingerprint, built, bar), _left(deadline),
            restore=True))

    def confirm(self, stored: StoredEngine, *bundles: Bundle) -> tuple[Confirmation, str]:
        """`Candidate.confirm`, the stored trial's files first; its result and log text.

        Raises:
            Exception: Whatever it raised.
        """
        candidate = self._unpacked(bundles)
        return _with_log(candidate.outdir, "confirm", lambda: candidate.confirm(stored))

    def outputs(self, stored: StoredEngine, *bundles: Bundle
                ) -> tuple[list[dict[str, np.ndarray]] | None, str]:
        """`Candidate.outputs`, the stored trial's files first; its result and log text.

        Raises:
            Exception: Whatever it raised.
        """
        candidate = self._unpacked(bundles)
        return _with_log(candidate.outdir, "outputs", lambda: candidate.outputs(stored))

    def _unpacked(self, bundles: Sequence[Bundle]) -> Candidate:
        candidate = _live(self.box, self.run)
        for bundle in bundles:
            unpack(candidate.outdir, bundle)
        return candidate

    def close(self) -> None:
        """Release the base route's engine."""
        if _current is not None:
            _current.candidate.close()


def _with_log(outdir: Path, what: str, call: Callable[[], T]) -> tuple[T, str]:
    """`call`'s result, and what it wrote to ``logs/WHAT.log`` meanwhile."""
    log = outdir / LOGS / f"{what}.log"
    start = log.stat().st_size if log.is_file() else 0
    with captured(log, what):
        result = call()
    return result, log.read_bytes()[start:].decode(errors="replace")
