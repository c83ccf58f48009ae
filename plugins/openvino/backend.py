"""The ``openvino`` backend: OpenVINO compiled models on the CPU.

An engine is the candidate ONNX file read by OpenVINO (``Core.read_model``), reshaped to
the profile's opt shapes where an input is dynamic (to its min..max range where the
input sets differ, `OpenVinoBackend.profile_shapes`), and compiled for the CPU
(``Core.compile_model(model, "CPU", config)``) with the route's properties
(`routetune.plugins.openvino.properties`). Compiled models are cached by OpenVINO
itself (``CACHE_DIR``) in the user's routetune cache (`cache_folder`), never in an output
folder: a later build of the same model with the same properties imports the blob
instead of compiling, and an output folder from someone else brings no blob that
OpenVINO would parse. The FP32
reference stays ONNX Runtime's CPU provider.

openvino is imported only when this backend builds, runs or describes its device;
`available`, `version` and `options` read the installed distribution's metadata, so
``routetune seasonings`` and a run on another backend never import it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routetune.backend import Backend, Engine, Feed, OptionSpec, Runner
from routetune.errors import BuildError
from routetune.feeds.examples import cache_dir
from routetune.plugins.openvino.installed import DEVICE, core, cpu_facts, installed_version, missing
from routetune.plugins.openvino.properties import NS, UNSET, cores

CACHE = "openvino"
"""The folder under routetune's cache (``$ROUTETUNE_CACHE`` or ``~/.cache/routetune``) for
OpenVINO's model cache (`cache_folder`)."""
COMPILE_ONLY = (NS + "TBB_PARTITIONER",)
"""Properties OpenVINO applies when it compiles a model, not when it imports a cached
blob: OpenVINO 2026.4.1 imports a blob compiled with the default partitioner and
reports ``TBB_PARTITIONER`` ``STATIC`` though ``AUTO`` was asked (measured on PP-OCRv4
det, 2026-12-07). A route that sets one is compiled without the cache."""
FP8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0",
       "float4e2m1")


def cache_folder() -> Path:
    """OpenVINO's model cache: ``openvino`` in routetune's cache folder.

    Outside every output folder: OpenVINO imports any blob whose name matches without a
    check routetune could make, so blobs come only from this user's own builds
    (SECURITY.md).
    """
    return cache_dir() / CACHE


@dataclass(frozen=True)
class Compiled:
    """A compiled model and its outputs' ONNX names.

    OpenVINO merges a graph output's tensor names with its producer's when it compiles
    (``Identity`` removed: ``{'y', 'r'}``), so the names are read from the model as read.

    Args:
        model: The ``openvino.CompiledModel``.
        output_names: The ONNX graph's output names, in OpenVINO's output order.
    """

    model: Any
    output_names: tuple[str, ...]


class OpenVinoBackend(Backend):
    """Compiles OpenVINO models for the CPU and runs them through infer requests."""

    name = "openvino"

    def available(self) -> str | None:
        """None with the openvino package installed; else why not, in one line."""
        return missing()

    def version(self) -> str:
        """The installed openvino distribution's version (``2026.4.1``)."""
        return installed_version() or "not installed"

    def versions(self) -> dict[str, str]:
        """The OpenVINO build, and the CPU's name and capabilities as OpenVINO sees them."""
        facts = cpu_facts()
        return {"openvino": self.version(), "openvino_build": facts.version,
                "openvino_cpu": facts.name,
                "openvino_capabilities": ",".join(facts.capabilities),
                "openvino_default_precision": facts.default_precision}

    def device(self) -> str:
        """The CPU, as OpenVINO names it, and the core count (``cpu: AMD EPYC (2 cores)``)."""
        return f"cpu: {cpu_facts().name} ({cores()} cores)"

    def options(self) -> Mapping[str, OptionSpec]:
        """The CPU properties routetune sets; ``""`` or 0 leaves one to OpenVINO."""
        flag = (UNSET, "YES", "NO")
        counts = tuple(range(cores() + 1))
        return {
            NS + "PERFORMANCE_HINT": OptionSpec(
                str, "LATENCY", ("LATENCY", "THROUGHPUT"), "PERFORMANCE_HINT"),
            NS + "NUM_STREAMS": OptionSpec(
                int, 0, counts, "NUM_STREAMS; 0: as the performance hint decides"),
            NS + "INFERENCE_NUM_THREADS": OptionSpec(
                int, 0, counts, "INFERENCE_NUM_THREADS; 0: OpenVINO chooses"),
            NS + "ENABLE_CPU_PINNING": OptionSpec(str, UNSET, flag, "ENABLE_CPU_PINNING"),
            NS + "ENABLE_HYPER_THREADING": OptionSpec(
                str, UNSET, flag, "ENABLE_HYPER_THREADING"),
            NS + "SCHEDULING_CORE_TYPE": OptionSpec(
                str, "ANY_CORE", ("ANY_CORE", "PCORE_ONLY", "ECORE_ONLY"),
                "SCHEDULING_CORE_TYPE"),
            NS + "TBB_PARTITIONER": OptionSpec(
                str, UNSET, (UNSET, "STATIC", "AUTO"), "TBB_PARTITIONER"),
            NS + "CPU_DENORMALS_OPTIMIZATION": OptionSpec(
                str, UNSET, flag, "CPU_DENORMALS_OPTIMIZATION"),
            NS + "INFERENCE_PRECISION_HINT": OptionSpec(
                str, UNSET, (UNSET, "f32", "bf16", "f16"),
                "INFERENCE_PRECISION_HINT; '': OpenVINO's default for this CPU"),
        }

    def dtype_support(self, dtype: str) -> str | None:
        """FP8 and FP4 tensors: OpenVINO's CPU plugin does not compute in them."""
        if dtype in FP8:
            return f"OpenVINO's CPU plugin does not compute in {dtype}"
        return None

    def emulates(self, dtype: str, settings: Mapping[str, Any]) -> bool:
        """float16 and bfloat16 layers run in the inference precision unless it is theirs.

        OpenVINO's CPU plugin converts a low-precision model's layers to its inference
        precision (f32 by default, bf16 on AMX/AVX-512 BF16 CPUs), so float16 overflow
        shows only where ``INFERENCE_PRECISION_HINT`` is ``f16`` itself.
        """
        own = {"float16": "f16", "bfloat16": "bf16"}.get(dtype)
        return own is not None and settings.get(NS + "INFERENCE_PRECISION_HINT") != own

    def compile_config(self, settings: Mapping[str, Any], cache: Path | None) -> dict[str, Any]:
        """OpenVINO's config from full settings: every property that is set, and CACHE_DIR."""
        config = {key[len(NS):]: value for key, value in settings.items()
                  if key.startswith(NS) and value not in (UNSET, 0)}
        if cache is not None:
            config["CACHE_DIR"] = str(cache)
        return config

    def profile_shapes(self, model: Any) -> dict[str, Any]:
        """The shape each of `model`'s inputs is compiled for, from the profile.

        Its opt shape where min, opt and max agree; else a bounded dynamic shape, each
        dimension from its min to its max (``openvino.Dimension(min, max)``), so that
        every input set of the range runs: a decoder's decode steps against a growing
        cache, sequences of several lengths.
        """
        if self.profile is None:
            return {}
        import openvino as ov

        names = {name for port in model.inputs for name in port.get_names()}
        return {name: list(opt) if low == high else ov.PartialShape(
                    [ov.Dimension(a, b) for a, b in zip(low, high, strict=True)])
                for name, (low, opt, high) in self.profile.shapes.items() if name in names}

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Read, reshape to the profile's shapes, and compile for the CPU with full `settings`.

        OpenVINO's cache (``CACHE_DIR``) is `cache_folder`. OpenVINO names each
        blob by a hash of the model and the properties that shape the compiled graph, so
        `key` is not needed; run-time properties (threads, streams, pinning) are applied
        when a blob is imported (``LOADED_FROM_CACHE``), so routes that differ only in
        them share one blob; a route that sets a `COMPILE_ONLY` property is compiled
        without the cache. The engine's `Engine.sha256` is `compiled_identity`: two
        routes whose properties OpenVINO resolves alike (``ENABLE_HYPER_THREADING=NO``
        where it is off already) are one engine, measured once. Its `Engine.kernels` is
        the sha256 of `runtime_graph`: the same without the weights' values.

        Raises:
            BuildError: OpenVINO refused the model, the shapes or a property.
        """
        cache: Path | None = None
        if all(settings.get(key, UNSET) == UNSET for key in COMPILE_ONLY):
            cache = cache_folder()
            cache.mkdir(parents=True, exist_ok=True)
        compiled = self.compile(model_path, settings, cache)
        graph = runtime_graph(compiled.model)
        return Engine(model_path, dict(settings), model_path, model_path.stat().st_size,
                      handle=compiled, sha256=compiled_identity(model_path, graph),
                      kernels=hashlib.sha256(graph).hexdigest())

    def compile(self, model_path: Path, settings: Mapping[str, Any],
                cache: Path | None) -> Compiled:
        """`model_path` compiled for the CPU.

        Raises:
            BuildError: OpenVINO refused the model, the shapes or a property.
        """
        try:
            ov_core = core()
            model = ov_core.read_model(str(model_path))
            shapes = self.profile_shapes(model)
            if shapes:
                model.reshape(shapes)
            names = tuple(port.get_any_name() for port in model.outputs)
            return Compiled(ov_core.compile_model(model, DEVICE,
                                                  self.compile_config(settings, cache)), names)
        except Exception as e:  # OpenVINO raises RuntimeError and its own types
            raise BuildError(f"OpenVINO refused the model: {_one_line(e)}") from e

    def open(self, engine: Engine) -> Runner:
        """Wrap the compiled model (built already, or compiled now, uncached) in a runner."""
        compiled = engine.handle
        if compiled is None:
            compiled = self.compile(engine.model_path, engine.settings, None)
        return OpenVinoRunner(compiled)


class OpenVinoRunner(Runner):
    """Runs an ``openvino.CompiledModel`` through infer requests, on host arrays."""

    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled.model
        self.request = self.compiled.create_infer_request()
        self.output_names = compiled.output_names
        self.dtypes = {name: _numpy_type(port.get_element_type())
                       for port in self.compiled.inputs for name in port.get_names()}

    def _tensors(self, feed: Feed) -> dict[str, Any]:
        """The feed as OpenVINO tensors of each input's type, each a copy it owns.

        A copy (``shared_memory=False``), so that no run can write into the caller's
        feed, which the FP32 reference reads too.
        """
        import openvino as ov

        return {name: ov.Tensor(np.ascontiguousarray(value, dtype=self.dtypes.get(name)),
                                shared_memory=False)
                for name, value in feed.items()}

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once; outputs by name, as arrays that own their memory."""
        request = self.request
        for name, tensor in self._tensors(feed).items():
            request.set_tensor(name, tensor)
        request.infer()
        return {name: np.array(request.get_output_tensor(i).data, copy=True)
                for i, name in enumerate(self.output_names)}

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """A call that runs a request whose input tensors were set once, here.

        The call starts the request and waits for it: no input conversion, and no
        output copy (the results stay in the request's own tensors).
        """
        request = self.compiled.create_infer_request()
        for name, tensor in self._tensors(feed).items():
            request.set_tensor(name, tensor)

        def call() -> None:
            request.start_async()
            request.wait()

        return call

    def close(self) -> None:
        """Drop the requests and the compiled model."""
        self.request = None
        self.compiled = None


IGNORED_PROPERTIES = frozenset({"NETWORK_NAME", "SUPPORTED_PROPERTIES", "EXECUTION_DEVICES"})
"""Compiled-model properties that name the model or list others, not how it runs."""
LAYER_INFO = ("layerType", "primitiveType", "runtimePrecision", "outputPrecisions",
              "outputLayouts", "execOrder")
"""The execution graph's per-layer facts (``CompiledModel.get_runtime_model()`` rt_info,
OpenVINO's "Runtime information" of the CPU plugin) that say what a layer runs; its
names (numbered anew by each compile) and timings are left out."""


def compiled_identity(model_path: Path, graph: bytes) -> str:
    """What makes a compiled model the engine it is, as a sha256 (hex).

    The candidate ONNX file's bytes (its weights, or for external data their
    content-addressed locations, `routetune.model.weights`: routes that differ only in a
    constant's value compile to the same layers), then its `runtime_graph`. Equal
    identities run the same kernels on the same weights under the same threads,
    streams, pinning and precision.

    Args:
        model_path: The ONNX file the engine was compiled from.
        graph: `runtime_graph` of the compiled model.
    """
    digest = hashlib.sha256()
    with model_path.open("rb") as f:  # streamed: a decoder's file can be large
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(graph)
    return digest.hexdigest()


def runtime_graph(compiled: Any) -> bytes:
    """What a compiled model runs, its weights' values aside, as JSON bytes.

    OpenVINO's execution graph (each layer's type, kernel, runtime precision, layouts
    and order, its inputs by position, its outputs' types and shapes) and every property
    of the compiled model as OpenVINO resolved it (``compiled.get_property(name)`` over
    ``SUPPORTED_PROPERTIES``, less `IGNORED_PROPERTIES`). Two compiled models with an equal
    graph run the same kernels on weights of the same types and shapes under the same
    threads, streams, pinning and precision, so they run equally fast: on ppocr-cls,
    ``fold-constants``, ``fuse-bn-into-conv`` and ``fp16`` compile to the base route's
    kernels (OpenVINO folds constants and batch norms, and widens FP16 weights, itself).
    Their weights' values may differ, and with them the outputs; values change the speed
    only through denormal arithmetic, which OpenVINO's ``CPU_DENORMALS_OPTIMIZATION``
    (a property, so in the graph's properties) governs. Its sha256 is the engine's
    `Engine.kernels`.

    Args:
        compiled: The ``openvino.CompiledModel``.
    """
    ops = compiled.get_runtime_model().get_ordered_ops()
    position = {op.get_friendly_name(): i for i, op in enumerate(ops)}
    layers = []
    for op in ops:
        info = op.get_rt_info()
        layers.append([
            op.get_type_name(), [str(info[k]) if k in info else "" for k in LAYER_INFO],
            [[position[i.get_source_output().get_node().get_friendly_name()],
              i.get_source_output().get_index()] for i in op.inputs()],
            [[str(o.get_element_type()), str(o.get_partial_shape())] for o in op.outputs()]])
    properties = {}
    for name in compiled.get_property("SUPPORTED_PROPERTIES"):
        if name not in IGNORED_PROPERTIES:
            try:
                properties[str(name)] = str(compiled.get_property(name))
            except Exception:  # a property the CPU plugin lists but cannot read
                continue
    return json.dumps([layers, sorted(properties.items())]).encode()


def _numpy_type(element_type: Any) -> np.dtype | None:
    """The numpy type of an OpenVINO element type; None where numpy has none (bf16)."""
    try:
        return np.dtype(element_type.to_dtype())
    except Exception:  # noqa: BLE001 - OpenVINO raises for types numpy lacks
        return None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]
