"""The TensorRT build as loaders, in Polygraphy's style.

Polygraphy (``polygraphy/backend/trt/loader.py``) builds an engine from small callables,
each making one thing from the one before: ``EngineBytesFromNetwork(
NetworkFromOnnxPath(path), config=CreateConfig(...))``. The ``tensorrt`` backend's build
is the same composition:

    plan = PlanFromNetwork(NetworkFromOnnx(trt, path), ConfigFromSettings(trt, settings),
                           TimingCacheFile(cache_path, str(trt_module)))()

and a built plan is kept per trial by `PlanCache`. Each loader raises `BuildError` with
TensorRT's own messages.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from routetune.errors import BuildError
from routetune.feeds.profile import ShapeProfile
from routetune.plugins.tensorrt import timing_cache
from routetune.plugins.tensorrt.logger import make_logger

logger_ = logging.getLogger(__name__)

NS = "tensorrt."
WORKSPACE_BYTES = 4 << 30
"""The workspace memory pool limit, 4 GiB: the TensorRT sample's value (research notes)."""


@dataclass
class Network:
    """A parsed network and what must stay alive with it (the builder, the parser)."""

    builder: Any
    network: Any
    parser: Any
    logger: Any


_LOADED: dict[str, Any] = {}
"""The plugin libraries loaded into this process's plugin registry, by path: their
handles, kept for the life of the process (`load_plugins`)."""


def load_plugins(registry: Any, paths: Sequence[Path], logger: Any, name: str) -> None:
    """Load each plugin library into `registry` once per process.

    As trtexec's ``--dynamicPlugins`` does (``IPluginRegistry.load_library``).
    TensorRT's registry is the process's: a library loaded once serves every builder
    and runtime after it, and loading it again would register its creators twice.

    Args:
        registry: ``builder.get_plugin_registry()`` or ``runtime.get_plugin_registry()``.
        paths: The libraries, absolute.
        logger: The capturing logger of the builder or runtime (`make_logger`).
        name: The TensorRT build's name, for the message.

    Raises:
        BuildError: TensorRT refused a library (its own message: a missing
            ``getCreators`` or ``getPluginCreators`` entry point, no creator returned).
    """
    for path in paths:
        if str(path) in _LOADED:
            continue
        handle = registry.load_library(str(path))
        if handle is None:
            raise BuildError(f"{name} refused the plugin library {path}: "
                             f"{logger.errors()}")
        _LOADED[str(path)] = handle


@dataclass(frozen=True)
class NetworkFromOnnx:
    """A strongly typed network parsed from an ONNX file (``trt.OnnxParser``).

    Args:
        trt: The TensorRT (or TensorRT-RTX) Python module.
        path: The ONNX file; external data is read from beside it.
        plugins: Plugin libraries loaded before the parse (`load_plugins`), so that the
            parser finds their creators for the ONNX ops they implement.
    """

    trt: Any
    path: Path
    plugins: tuple[Path, ...] = ()

    def __call__(self) -> Network:
        """Parse the model.

        Raises:
            BuildError: TensorRT refused a plugin library, or the parser refused the
                model (`parse_failure`).
        """
        trt = self.trt
        logger = make_logger(trt)
        builder = trt.Builder(logger)
        load_plugins(builder.get_plugin_registry(), self.plugins, logger,
                     getattr(trt, "__name__", "TensorRT"))
        network = builder.create_network(0)  # TensorRT 11: always strongly typed
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(self.path)):
            raise BuildError(parse_failure(parser, self.path))
        return Network(builder, network, parser, logger)


@dataclass(frozen=True)
class ConfigFromSettings:
    """A builder config from the backend's full settings, with one optimisation profile.

    Args:
        trt: The TensorRT Python module.
        settings: The full build settings (``tensorrt.*`` keys).
    """

    trt: Any
    settings: Mapping[str, Any]

    def __call__(self, network: Network) -> Any:
        """The ``IBuilderConfig`` for `network`.

        Raises:
            BuildError: TensorRT rejected a build-route knob, or a dynamic input has no
                shapes in the profile.
        """
        config = network.builder.create_builder_config()
        configure(self.trt, config, self.settings)
        config.add_optimization_profile(profile(network, self.settings))
        return config


@dataclass(frozen=True)
class TimingCacheFile:
    """The output folder's timing cache, shared by its build workers (`timing_cache`).

    Args:
        path: ``OUTDIR/artifacts/engines/timing.cache``.
        name: The TensorRT build's name, for the message when the file cannot be read.
        gpu: Whether a GPU is here: without one TensorRT reads no cache (it needs a
            CUDA context), which is then expected and logged at INFO, not WARNING.
    """

    path: Path
    name: str = "TensorRT"
    gpu: bool = True

    def load(self, config: Any, logger: Any) -> None:
        """Start `config` from the file (read under its lock)."""
        cache = config.create_timing_cache(timing_cache.read(self.path))
        if any("deserialize timing cache" in m for m in logger.messages):
            _warn_once(logging.WARNING if self.gpu else logging.INFO,
                       "%s could not load the timing cache %s (%s); this build starts "
                       "from an empty one", self.name, self.path, logger.errors())
        config.set_timing_cache(cache, False)

    def save(self, config: Any) -> None:
        """Merge the build's cache into the file (locked, combined, atomic)."""
        timing_cache.merge(self.path, config)


@dataclass(frozen=True)
class PlanFromNetwork:
    """A serialized plan (``build_serialized_network``) from a network and a config.

    Args:
        network: Makes the network (`NetworkFromOnnx`).
        config: Makes the builder config for it (`ConfigFromSettings`).
        cache: The timing cache loaded before and merged after the build; None: none.
    """

    network: NetworkFromOnnx
    config: ConfigFromSettings
    cache: TimingCacheFile | None = None

    def __call__(self) -> bytes:
        """Build the plan.

        Raises:
            BuildError: Any loader's failure, or TensorRT could not build the engine.
        """
        parsed = self.network()
        config = self.config(parsed)
        with warnings.catch_warnings():  # TensorRT-RTX: timing-cache calls are no-ops
            warnings.simplefilter("ignore", DeprecationWarning)
            if self.cache is not None:
                self.cache.load(config, parsed.logger)
            plan = parsed.builder.build_serialized_network(parsed.network, config)
            if plan is None:
                raise BuildError(f"{self.cache.name if self.cache else 'TensorRT'} could "
                                 f"not build the engine: {parsed.logger.errors()}")
            if self.cache is not None:
                self.cache.save(config)
        return bytes(plan)


@dataclass(frozen=True)
class PlanCache:
    """A trial's plan kept as ``engines/<key>.plan``, with the sha256 of its source.

    Args:
        path: The plan file.
        source: sha256 of what the plan is built from (model bytes, settings, TensorRT
            version): a kept plan is handed back only when this matches, since a
            changed seasoning or TensorRT would otherwise give a stale engine under the
            same trial fingerprint.
    """

    path: Path
    source: str

    @property
    def stamp(self) -> Path:
        """The ``.sha256`` sidecar holding `source`."""
        return self.path.with_suffix(".sha256")

    def get(self) -> bytes | None:
        """The kept plan if it was built from `source`; None otherwise."""
        if self.path.exists() and self.stamp.exists() and self.stamp.read_text() == self.source:
            return self.path.read_bytes()
        return None

    def put(self, data: bytes) -> None:
        """Keep `data` as the plan of `source` (each file written atomically)."""
        timing_cache.write_atomic(self.path, data)
        timing_cache.write_atomic(self.stamp, self.source.encode())

    @staticmethod
    def source_of(model_path: Path, settings: Mapping[str, Any], version: str) -> str:
        """sha256 of the model file's bytes, the settings and the TensorRT version."""
        digest = hashlib.sha256(model_path.read_bytes())
        digest.update(json.dumps([dict(settings), version], sort_keys=True).encode())
        return digest.hexdigest()


def configure(trt: Any, config: Any, settings: Mapping[str, Any]) -> None:
    """Set the builder config from full settings, and check what TensorRT kept.

    Raises:
        BuildError: TensorRT did not keep the build route (a knob it rejects; the
            Python setter drops ``setBuildRoute``'s success flag, so it is read back).
    """
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    config.builder_optimization_level = settings[NS + "builder_optimization_level"]
    config.tiling_optimization_level = getattr(
        trt.TilingOptimizationLevel, settings[NS + "tiling_optimization_level"].upper())
    config.max_aux_streams = settings[NS + "max_aux_streams"]
    if settings[NS + "tf32"]:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    route = settings[NS + "build_route"]
    if route:
        config.build_route = route
        if config.build_route != route:
            raise BuildError(
                f"TensorRT rejected the build route '{route}' (read back "
                f"'{config.build_route}'): a knob it does not know; see `routetune "
                "seasonings` for this TensorRT's knobs")


def parse_failure(parser: Any, model_path: Path) -> str:
    """The parser's errors in one line, with the operators it cannot take."""
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        where = f"node '{e.node_name()}' ({e.node_operator()})" if e.node_name() else \
            f"node {e.node()}"
        errors.append(f"{where}: {' '.join(e.desc().split())}")
    model = onnx.load(str(model_path), load_external_data=False)
    ops = sorted({n.op_type for n in model.graph.node})
    unsupported = [op for op in ops if not parser.supports_operator(op)]
    text = "TensorRT's ONNX parser refused the model: " + "; ".join(errors[:5])
    if unsupported:
        text += f"; operators it cannot take: {', '.join(unsupported)}"
    return text[:900]


def profile(network: Network, settings: Mapping[str, Any]) -> Any:
    """One optimisation profile with every network input's min/opt/max shape.

    Raises:
        BuildError: A dynamic input has no shapes in the profile.
    """
    shapes = ShapeProfile.parse(settings[NS + "profile"]).shapes
    out = network.builder.create_optimization_profile()
    for i in range(network.network.num_inputs):
        tensor = network.network.get_input(i)
        dims = tuple(tensor.shape)
        if tensor.name in shapes:
            out.set_shape(tensor.name, *shapes[tensor.name])
        elif any(d < 0 for d in dims):
            dim = next(j for j, d in enumerate(dims) if d < 0)
            raise BuildError(f"input '{tensor.name}' dimension {dim} is dynamic and the "
                             "profile has no shapes for it; give --shapes or --min/--opt/"
                             "--max-shapes")
        else:
            out.set_shape(tensor.name, dims, dims, dims)
    return out


@functools.cache
def _warn_once(level: int, message: str, *args: object) -> None:
    """Log once per process for the same arguments."""
    logger_.log(level, message, *args)
