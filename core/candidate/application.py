"""Applying a route's seasonings to the model, from the longest route prefix at hand.

A route's graph and precision steps rewrite the model one after another, each checked
against the search's postconditions (`routetune.model.postconditions.check_candidate`); its build
steps set backend options. The models of route prefixes are kept (`SNAPSHOTS` in
memory, and on disk for the other workers: `routetune.candidate.artifacts.PrefixStore`),
so that ``fp16,nhwc`` starts from ``fp16``'s model.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from routetune.backend import Backend
from routetune.candidate.artifacts import (
    PrefixStore,
    Snapshot,
    save_model,
)
from routetune.candidate.records import TrialInputs
from routetune.errors import (
    PluginError,
    PostconditionError,
    RoutetuneError,
    SeasoningCrashed,
    SeasoningError,
    describe,
)
from routetune.model.loading import keep_model_fields, toposort
from routetune.model.postconditions import cast_faults, check_candidate
from routetune.model.weights import externalize, import_graph
from routetune.registry import Registry
from routetune.routes.route import Route, Step
from routetune.seasoning import RouteContext, RouteState
from routetune.stash import Stash

logger = logging.getLogger(__name__)

SMALL_CONSTANT = 4096
"""Constants of this many elements or fewer are compared by value when a pass says it
changed nothing (`_state_digest`): shapes, axes, scales."""

SNAPSHOTS = 16
"""Model snapshots kept at route prefixes (branch points), least recently used out."""

# Why `gc.collect()` after each pass: onnx-graphsurgeon's graphs are reference cycles
# (nodes and tensors point at each other), so a pass's discarded graph, and the weights it
# loaded, wait for Python's cyclic collector, which counts objects, not bytes. For a
# 2.5 GiB model a finished fp16 pass left 1x the model's size in float32 arrays behind
# until the next collection (docs/benchmarks.md, "Models over 2 GiB").


class RouteApplier:
    """Applies routes to one prepared model for one backend, in this process.

    Args:
        registry: The installed plugins.
        inputs: The search's trial inputs (model, feeds, base model and settings).
        backend: The backend the routes are built for.
        reference: The FP32 reference backend that precision seasonings and the strict
            FP16 check run models on; None where none may run.
    """

    def __init__(self, registry: Registry, inputs: TrialInputs, backend: Backend,
                 reference: Backend | None) -> None:
        self.registry = registry
        self.inputs = inputs
        self.backend = backend
        self.reference = reference
        self.outdir = inputs.outdir
        self.store = inputs.model.weights  # external data: the folder it lives in
        self._snapshots: OrderedDict[Route, Snapshot] = OrderedDict()
        self._snapshots[Route()] = (inputs.base_data, [dict(p) for p in inputs.base_passes],
                                    Stash())
        self.prefixes = PrefixStore(registry, inputs, self.export)
        self.backend_ops = frozenset(backend.operator_schemas())
        """The operators the backend registers beyond ONNX's: judged by it, not by the
        ONNX checker (`routetune.model.postconditions.check_candidate`)."""

    def apply(self, route: Route) -> tuple[bytes, list[dict[str, Any]], dict[str, Any]]:
        """Apply a route's steps to the base model, from the longest snapshot.

        Returns:
            The candidate model (serialized), one pass record per step, and the full
            build settings.

        Raises:
            SeasoningError: A step raised `ValueError`.
            PostconditionError: A step broke the model or its signature.
            BackendError: The settings are not the backend's.
            SeasoningCrashed: A seasoning raised anything else (a bug: the trial crashed).
        """
        stage = {s.name: self.registry.seasoning(s.name).info.stage for s in route}
        model_steps = [s for s in route if stage[s.name] != "build"]
        build_steps = [s for s in route if stage[s.name] == "build"]
        k = max(i for i in range(len(model_steps) + 1) if Route(tuple(model_steps[:i]))
                in self._snapshots)
        for longer in range(len(model_steps), k, -1):  # another worker's, from disk
            shared = self.prefixes.shared(Route(tuple(model_steps[:longer])))
            if shared is not None:
                k = longer
                self._snapshot(Route(tuple(model_steps[:k])), shared)
                break
        prefix = Route(tuple(model_steps[:k]))
        self._snapshots.move_to_end(prefix)
        data, passes, stash = self._snapshots[prefix]
        passes = list(passes)
        proto = onnx.load_from_string(data) if model_steps[k:] else None
        state = RouteState(import_graph(proto, self.store) if proto is not None else None,
                           settings=dict(self.inputs.base_settings), stash=stash.copy())
        signature = self.inputs.model.signature
        faults = cast_faults(proto) if proto is not None else frozenset()
        for i in range(k, len(model_steps)):
            passes.append(self.step(model_steps[i], state, Route(tuple(model_steps[:i]))))
            gc.collect()  # the pass's discarded graph (see the note at SNAPSHOTS)
            exported = self.export(state.graph)
            try:
                faults = check_candidate(exported, signature, faults, self.store,
                                         self.backend_ops)
            except PostconditionError as e:  # name the pass that broke the contract
                raise PostconditionError(f"after '{model_steps[i]}': {e}") from e
            data = exported.SerializeToString()
            snapshot = (data, passes, state.stash.copy())
            self._snapshot(Route(tuple(model_steps[: i + 1])), snapshot)
            self.prefixes.share(Route(tuple(model_steps[: i + 1])), snapshot)
        for i, step in enumerate(build_steps):
            passes.append(self.step(step, state, Route(tuple(model_steps + build_steps[:i]))))
        return data, passes, self.backend.full_settings(state.settings)

    def step(self, step: Step, state: RouteState, applied: Route) -> dict[str, Any]:
        """Apply one seasoning to `state`; its pass record.

        A graph or precision seasoning that is not applicable to the model as it stands
        (`Seasoning.applicable`: int8-qdq on a model with nothing to quantize) declines,
        whether the search, a pinned route or ``routetune build`` asked for it.

        Raises:
            SeasoningError: The seasoning is not applicable, or raised `ValueError` or a
                routetune error.
            SeasoningCrashed: The seasoning raised anything else (a bug).
        """
        seasoning = self.registry.seasoning(step.name)(dict(step.params))
        evaluate = self.evaluate if self.reference is not None else None
        ctx = RouteContext(self.backend, tuple(self.inputs.feeds), str(applied), evaluate,
                           self.store, self.run_on_device)
        before = _state_digest(state)
        t0 = time.perf_counter_ns()
        try:
            if state.graph is not None and seasoning.info.stage != "build":
                why = seasoning.why_not(state.graph, self.backend)
                if why:
                    raise SeasoningError(step.name, str(applied), f"not applicable: {why}")
            result = seasoning(state, ctx)
        except (PluginError, SeasoningError):
            raise
        except (RoutetuneError, ValueError) as e:
            raise SeasoningError(step.name, str(applied), describe(e)) from e
        except (Exception, SystemExit) as e:  # sys.exit() in a plugin is a crash too
            raise SeasoningCrashed(step.name, str(applied), e) from e
        ms = (time.perf_counter_ns() - t0) / 1e6
        modified, note = result.modified, result.note
        if not modified and _state_digest(state) != before:  # the record must be honest:
            modified = True  # the search takes an unmodified step for the same engine
            note = "; ".join(filter(None, [note, "reported modified: false, but changed the "
                                           "model or the settings: recorded as modified"]))
            logger.warning("%s after '%s': %s", step, applied, note)
        return {"step": str(step), "modified": modified, "stats": dict(result.stats),
                "note": note, "ms": round(ms, 3)}

    def evaluate(self, model: onnx.ModelProto) -> Iterator[dict[str, np.ndarray]]:
        """Run `model` in FP32 on the reference backend on every input set; all outputs.

        One input set's outputs at a time, as they are asked for (`Backend.evaluate`).

        With external data, the tensors a pass wrote go to the weights store first, so
        that the model stays under protobuf's 2 GiB whatever its size (`model` changes).
        """
        assert self.reference is not None
        if self.store is not None:
            externalize(model, self.store)
        return self.reference.evaluate(model, list(self.inputs.feeds), weights=self.store)

    def run_on_device(self, model: onnx.ModelProto) -> Iterator[dict[str, np.ndarray]]:
        """Run `model` on the backend's device, its defaults, on every input set; all outputs.

        One input set's outputs at a time, as they are asked for.

        Raises:
            BackendError: The backend cannot run a model outside an engine build.
        """
        if self.store is not None:
            externalize(model, self.store)
        return self.backend.run_on_device(model, list(self.inputs.feeds), weights=self.store)

    def _snapshot(self, prefix: Route, snapshot: Snapshot) -> None:
        data, passes, stash = snapshot
        self._snapshots[prefix] = (data, list(passes), stash)
        while len(self._snapshots) > SNAPSHOTS:
            oldest = next(iter(self._snapshots))
            if oldest.is_base:
                self._snapshots.move_to_end(oldest)
                oldest = next(iter(self._snapshots))
            del self._snapshots[oldest]

    def export(self, graph: gs.Graph) -> onnx.ModelProto:
        """`gs.export_onnx`, nodes sorted; with external data, new large tensors go to the store.

        Nodes are put in topological order (`routetune.model.loading.toposort`, subgraphs' outer
        reads counted): a pass that appends nodes, or a tool that writes them out of
        order (ONNX Runtime's quantizer on graphs with ``If``), leaves a valid graph.
        The model stays small whatever its weights' size: tensors a pass left alone
        keep their locations, and those it wrote (`weights.MIN_EXTERNAL_BYTES` or more)
        are stored once each under ``artifacts/models/weights/``. The model keeps what
        the prepared model carries besides its graph (`loading.keep_model_fields`).
        """
        model = gs.export_onnx(graph)
        keep_model_fields(self.inputs.model.proto, model)
        toposort(model.graph)  # a pass may leave nodes out of order: sorting is enforced
        if self.store is not None:
            externalize(model, self.store)
        return model

    def save_model(self, data: bytes) -> Path:
        """Keep a candidate model under ``artifacts/models/<sha256[:16]>.onnx``; its path."""
        return save_model(self.outdir, data)


def _state_digest(state: RouteState) -> tuple[Any, ...]:
    """What a pass may change of a route's state, for comparing before and after it.

    The nodes (operator, domain, attributes, input and output names), the graph's
    inputs and outputs, the constants (name, shape, dtype, and the bytes of those of
    `SMALL_CONSTANT` elements or fewer) and the settings. A large constant's values are
    not read: for a 2 GiB model that would cost seconds a step (a pass that rewrites
    weights renames them or changes the nodes that read them, as every built-in does).
    """
    settings = tuple(sorted((k, repr(v)) for k, v in state.settings.items()))
    graph = state.graph
    if graph is None:
        return (settings,)

    def light(value: Any) -> Any:
        if isinstance(value, gs.Tensor):
            return ("tensor", value.name)
        if isinstance(value, np.ndarray):
            return ("array", value.shape, str(value.dtype),
                    value.tobytes() if value.size <= SMALL_CONSTANT else None)
        if isinstance(value, gs.Graph):
            return ("graph", value.name, len(value.nodes))
        return repr(value)

    nodes = tuple((n.op, n.domain, tuple(t.name for t in n.inputs),
                   tuple(t.name for t in n.outputs),
                   tuple(sorted((k, light(v)) for k, v in n.attrs.items())))
                  for n in graph.nodes)
    constants = tuple(sorted(
        (t.name, tuple(t.shape or ()), str(t.dtype),
         np.asarray(t.values).tobytes() if int(np.prod(t.shape or ())) <= SMALL_CONSTANT else b"")
        for t in graph.tensors().values() if isinstance(t, gs.Constant)))
    return (settings, nodes, constants, tuple(t.name for t in graph.inputs),
            tuple(t.name for t in graph.outputs))
