"""Candidate model files, and route prefixes shared between a search's workers.

A candidate model is kept as ``artifacts/models/<sha256[:16]>.onnx`` (`save_model`) and
used again only when it matches the trial's record (`matches_record`). A route prefix's
model (``fp16`` for ``fp16,nhwc``) is shared through a data-only index entry
(`PrefixStore`), so that a worker starts from another worker's work.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.backend import Backend, Engine, Runner
from routetune.candidate.records import TrialInputs
from routetune.errors import BuildError
from routetune.model.loading import sha256
from routetune.model.weights import import_graph, intact
from routetune.records.store import disk_full, full_disk
from routetune.registry import Registry
from routetune.routes.route import Route
from routetune.stash import Stash
from routetune.timing.float_env import contained, guarded_runner

logger = logging.getLogger(__name__)

MODELS = "artifacts/models"
"""Candidate models, relative to the output directory; for a model with external data
also its weights store (``weights/``, `routetune.model.weights`)."""

Snapshot = tuple[bytes, list[dict[str, Any]], Stash]
"""A route prefix's model, its pass records, and what its steps stashed for later ones."""


class PrefixStore:
    """Route prefixes' models on disk, for the other workers of one search.

    Args:
        registry: The installed plugins (stash codecs make their values again from
            names, such as a precision step's seasoning and parameters).
        inputs: The search's trial inputs; the index is keyed by what a graph or
            precision step may read (`path`).
        export: Turns a graph into the model a candidate keeps
            (`routetune.candidate.application.RouteApplier.export`).
    """

    def __init__(self, registry: Registry, inputs: TrialInputs,
                 export: Callable[[gs.Graph], onnx.ModelProto]) -> None:
        self.registry = registry
        self.inputs = inputs
        self.export = export
        self.outdir = inputs.outdir
        self.workdir = inputs.outdir / "artifacts"
        self.store = inputs.model.weights
        self._salt: str | None = None

    def path(self, prefix: Route) -> Path:
        """The index entry of a prefix.

        Keyed by everything a graph or precision step may read: the base model, the
        backend, the profile, the input sets and the routetune version.
        """
        if self._salt is None:
            import routetune

            h = hashlib.sha256(self.inputs.base_data)
            h.update(f"{self.inputs.backend} {self.inputs.profile} {routetune.__version__}"
                     .encode())
            for feed in self.inputs.feeds:
                for name in sorted(feed):
                    h.update(name.encode() + str(feed[name].shape).encode())
                    h.update(np.ascontiguousarray(feed[name]).tobytes())
            self._salt = h.hexdigest()
        key = sha256(f"{self._salt} {prefix}".encode())
        return self.workdir / "prefixes" / f"{key[:32]}.json"

    def share(self, prefix: Route, snapshot: Snapshot) -> None:
        """Keep a route prefix's model on disk, for the other workers of this search.

        The model goes to ``artifacts/models/`` like a candidate; the index entry,
        ``artifacts/prefixes/<key>.json``, is data only: the model's sha256, the pass
        records, and the route's stash as its keys' codecs write it (a precision step's
        `Lowering`: the seasoning's name and parameters, and its graph as a model in
        ``artifacts/models/`` too, by sha256; `routetune.stash`). Never pickle: an
        output folder may come from someone else, and reading it must not run code. A
        prefix whose stash holds a value that cannot travel is not shared. Written
        atomically.
        """
        path = self.path(prefix)
        if path.exists():
            return
        data, passes, stash = snapshot
        encoded = stash.encode(self)
        if encoded is None:
            logger.debug("route prefix '%s' not shared: its stash cannot travel", prefix)
            return
        save_model(self.outdir, data)
        entry: dict[str, Any] = {"model_sha256": sha256(data), "passes": passes,
                                 "stash": encoded}
        try:
            text = json.dumps(entry)
        except (TypeError, ValueError) as e:  # a plugin's pass record that is not data
            logger.debug("route prefix '%s' not shared: %s", prefix, e)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def shared(self, prefix: Route) -> Snapshot | None:
        """A route prefix's model that a worker of this search kept (`share`), or None.

        An entry that does not read as one `share` writes, or whose models are missing
        or do not match their sha256, is ignored: the prefix is built again.
        """
        try:
            entry = json.loads(self.path(prefix).read_text())
            data = self.stored(entry["model_sha256"])
            stash = Stash.decode(entry["stash"], self)
            passes = [dict(p) for p in entry["passes"]]
        except Exception as e:  # anything a planted or damaged file can cause: rebuild
            logger.debug("route prefix '%s' not taken from disk: %s", prefix, e)
            return None
        return data, passes, stash

    def keep(self, data: bytes) -> str:
        """Keep a serialized model in ``artifacts/models/``; its sha256 (`StashContext`)."""
        save_model(self.outdir, data)
        return sha256(data)

    def graph(self, data: bytes) -> gs.Graph:
        """A kept model as a graph, its external data from the run's store."""
        return import_graph(onnx.load_from_string(data), self.store)

    def serialized(self, graph: gs.Graph) -> bytes:
        """A graph as the model a candidate keeps, serialized."""
        return self.export(graph).SerializeToString()

    def stored(self, digest: str) -> bytes:
        """The model `save_model` kept for this sha256, checked against it.

        Raises:
            ValueError: `digest` is not a sha256, or the file's content does not match.
            OSError: No such file.
        """
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"not a sha256: {digest!r}")
        data = (self.outdir / MODELS / f"{digest[:16]}.onnx").read_bytes()
        if sha256(data) != digest:
            raise ValueError(f"{digest[:16]}.onnx does not match its sha256")
        return data


def matches_record(path: Path, settings: Mapping[str, Any], candidate_sha256: str | None
                   ) -> bool:
    """Whether a candidate model file is the one a trial recorded, weights included.

    Args:
        path: The model under ``artifacts/models/``.
        settings: The trial's full build settings.
        candidate_sha256: The trial's `Trial.candidate_sha256`.

    Returns:
        True when the sha256 of the file's bytes followed by the settings as sorted
        JSON is `candidate_sha256`, and each external data file it names still hashes
        to its name (`routetune.model.weights.intact`).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if sha256(data + json.dumps(settings, sort_keys=True).encode()) != candidate_sha256:
        return False
    try:
        model = onnx.load_from_string(data)
    except Exception:  # protobuf's DecodeError and others: not a model
        return False
    return intact(model, path.parent)


def save_model(outdir: Path, data: bytes) -> Path:
    """Keep a model under ``OUTDIR/artifacts/models/<sha256[:16]>.onnx``; its path.

    Written to a temporary name and renamed, so that two workers writing the same
    model, or a kill midway, never leave a partial file under the final name. A file
    already there with other content (damaged, or planted) is replaced.

    Raises:
        StorageError: The disk is full (`routetune.records.store.full_disk`).
        OSError: The file cannot be written for another reason.
    """
    path = outdir / MODELS / f"{sha256(data)[:16]}.onnx"
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # no partial file left to fill the disk
            if disk_full(e):
                raise full_disk(path, e) from e
            raise
    return path


def build_engine(backend: Backend, model: Path, settings: Mapping[str, Any], workdir: Path,
                 key: str, recorded: str) -> Engine:
    """`Backend.build`, opening a kept engine file only if it is the one recorded.

    A backend may hand back an engine file it kept under `key` (a TensorRT plan, on
    resume) instead of building (`Engine.reused`). That file came from the output
    folder, which someone else may have written, so it is used only when its sha256 is
    `recorded`, the hash this trial's build phase returned (and the trial store keeps);
    otherwise it is deleted and the engine built again. A sidecar beside the file
    cannot vouch for it: whoever edits one can edit both.

    Args:
        backend: The backend.
        model: The candidate model.
        settings: Full build settings.
        workdir: ``OUTDIR/artifacts``.
        key: The trial's fingerprint, or empty for an engine that is not kept.
        recorded: The engine's recorded sha256, hex; empty when none is (the build
            phase, or a store written before it was recorded).

    Raises:
        BuildError: The backend refused the model, or kept handing back a file.
    """
    engine = _contained_build(backend, model, settings, workdir, key)
    if engine.reused and engine.sha256 != recorded:
        logger.info("%s is not the engine recorded for this trial; building it again",
                    engine.path)
        engine.path.unlink(missing_ok=True)
        engine = _contained_build(backend, model, settings, workdir, key)
        if engine.reused:
            raise BuildError(f"the {backend.name} backend reused {engine.path} after it was "
                             "deleted; it must build an engine it has no file for")
    return engine


def _contained_build(backend: Backend, model: Path, settings: Mapping[str, Any],
                     workdir: Path, key: str) -> Engine:
    """`Backend.build` with the thread's floating-point environment kept (`float_env`)."""
    with contained() as left:
        engine = backend.build(model, settings, workdir, key)
    if engine.float_env is None and left.env is not None:
        engine = replace(engine, float_env=left.env)
    return engine


def open_engine(backend: Backend, engine: Engine) -> Runner:
    """`Backend.open`, keeping the thread's floating-point environment (`float_env`).

    The engine's calls run under the environment its build or open set up; everything
    else in the thread keeps its own.

    Raises:
        BuildError, EngineNotRunnable: As `Backend.open`.
    """
    with contained() as left:
        runner = backend.open(engine)
    return guarded_runner(runner, engine.float_env or left.env)
