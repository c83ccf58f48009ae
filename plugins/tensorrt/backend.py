"""The ``tensorrt`` backend: strongly typed TensorRT engines built from the ONNX graph.

Built with TensorRT 11 where installed, else TensorRT-RTX (`module.find_tensorrt`):
parse the ONNX file (``OnnxParser``), make the builder config and one optimisation
profile, build a serialized plan (``build_serialized_network``). Precision is the
graph's own: no FP16/INT8 builder flags exist in TensorRT 11. Plans are kept in
``OUTDIR/artifacts/engines/<trial fingerprint>.plan`` and handed back on resume when the
model, settings and TensorRT version it was built from are unchanged (the ``.sha256``
sidecar); the search opens such a plan only if its sha256 is the one its trial
recorded (`Engine.reused`), and the runtime never runs host code embedded in a plan
(`make_runtime`). One timing cache per output directory (``engines/timing.cache``) is
loaded before each build and saved after it. Engines run through `TensorRtRunner`;
where the runtime refuses the device (TensorRT-RTX on compute capability 9.0, or no
GPU) `open` raises `EngineNotRunnable` and the trial is ``build-only``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from routetune.backend import Backend, Engine, OptionSpec, Runner
from routetune.errors import BuildError, EngineNotRunnable
from routetune.plugins.cuda import cuda_versions
from routetune.plugins.tensorrt import timing_cache
from routetune.plugins.tensorrt.module import TensorRtModule, find_tensorrt
from routetune.profile import ShapeProfile

logger_ = logging.getLogger(__name__)

NS = "tensorrt."
TILING = ("none", "fast", "moderate", "full")
PREFLIGHT = ("int32-limits", "fold-if")
"""The TensorRT base pipeline: graph rewrites the ONNX parser needs (see each seasoning)."""
TIMING_CACHE = "timing.cache"
WORKSPACE_BYTES = 4 << 30
"""The workspace memory pool limit, 4 GiB: the TensorRT sample's value (research notes)."""


@functools.cache
def _logger_class(trt: Any) -> type:
    class KeepingLogger(trt.ILogger):  # type: ignore[name-defined,misc]
        """Keeps warnings and errors, for failure messages; logs them at DEBUG level.

        A failure's message is its errors, not the warnings TensorRT logs on every build
        (``nbStreams -1 should not be negative`` for the default aux-stream count).
        """

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []
            self._errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            text = " ".join(msg.split())
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self._errors.append(text)
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                self.messages.append(text)
                logger_.debug("TensorRT: %s", text)

        def errors(self) -> str:
            return ("; ".join(self._errors[-3:]) or "; ".join(self.messages[-3:])
                    or "no message from TensorRT")

    return KeepingLogger


def make_logger(trt: Any) -> Any:
    """A TensorRT logger (``trt.ILogger``) whose ``errors()`` gives its last messages."""
    return _logger_class(trt)()


class TensorRtBackend(Backend):
    """Builds TensorRT plans; runs and times them on the GPU where the runtime allows."""

    name = "tensorrt"
    preflight = PREFLIGHT

    @property
    def trt(self) -> TensorRtModule:
        """The TensorRT module in use."""
        return find_tensorrt()

    def gpus(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """Every visible GPU (`routetune.plugins.cuda.visible_gpus`)."""
        from routetune.plugins.cuda import visible_gpus

        return visible_gpus()

    def available(self) -> str | None:
        """None with a TensorRT 11 or TensorRT-RTX module; else why not, in one line."""
        return self.trt.reason or None

    def version(self) -> str:
        """The module and its version, e.g. ``tensorrt_rtx_bindings 1.7.1.116``."""
        return str(self.trt)

    def versions(self) -> dict[str, str]:
        """The TensorRT module and version, and the GPU stack where there is one."""
        out = {"tensorrt_module": self.trt.name, "tensorrt": self.trt.version}
        return {**out, **_gpu()}

    def device(self) -> str:
        """The GPU that runs the engines (``gpu: NVIDIA H200 (cc 9.0)``), or none."""
        gpu = _gpu()
        if not gpu:
            return "no CUDA GPU (engines are built, not run)"
        return f"gpu: {gpu['gpu']} (cc {gpu['compute_capability']})"

    def options(self) -> Mapping[str, OptionSpec]:
        """Builder and runtime options, with the installed TensorRT's defaults."""
        defaults = _config_defaults(self.trt)
        return {
            NS + "builder_optimization_level": OptionSpec(
                int, defaults["level"], (0, 1, 2, 3, 4, 5), "builder_optimization_level"),
            NS + "tiling_optimization_level": OptionSpec(
                str, "none", TILING, "tiling_optimization_level"),
            NS + "max_aux_streams": OptionSpec(
                int, defaults["aux"], (), "max_aux_streams; -1 lets TensorRT decide"),
            NS + "tf32": OptionSpec(bool, defaults["tf32"], (True, False), "BuilderFlag.TF32"),
            NS + "build_route": OptionSpec(
                str, "", (), "config.build_route (Global Performance Tuner knobs)"),
            NS + "cuda_graph": OptionSpec(
                bool, False, (True, False), "replay the enqueue as a CUDA graph (runtime)"),
            NS + "profile": OptionSpec(
                str, str(self.profile or ""), (), "optimisation profile, name:min/opt/max"),
        }

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Parse, configure and build a serialized plan; reuse a stored one for `key`.

        Raises:
            BuildError: The parser refused the model (its messages, with node names and
                the operators it cannot take), TensorRT rejected a build-route knob, a
                dynamic input has no profile, or the build failed.
        """
        plan_path = workdir / "engines" / f"{key}.plan" if key else None
        if plan_path is not None:
            source = self._source_digest(model_path, settings)
            stamp = plan_path.with_suffix(".sha256")
            if plan_path.exists() and stamp.exists() and stamp.read_text() == source:
                data = plan_path.read_bytes()
                return Engine(model_path, dict(settings), plan_path, len(data), handle=data,
                              sha256=hashlib.sha256(data).hexdigest(), reused=True)
        trt = self.trt.module
        logger = make_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(0)  # TensorRT 11: always strongly typed
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(model_path)):
            raise BuildError(parse_failure(parser, model_path))
        config = builder.create_builder_config()
        configure(trt, config, settings)
        config.add_optimization_profile(_profile(builder, network, settings))
        cache_path = workdir / "engines" / TIMING_CACHE
        with warnings.catch_warnings():  # TensorRT-RTX: timing-cache calls are no-ops
            warnings.simplefilter("ignore", DeprecationWarning)
            cache = config.create_timing_cache(timing_cache.read(cache_path))
            if any("deserialize timing cache" in m for m in logger.messages):
                # Without a GPU TensorRT cannot read any cache (it needs a CUDA context):
                # expected, so not a warning there.
                _warn_once(logging.WARNING if _gpu() else logging.INFO,
                           "%s could not load the timing cache %s (%s); this build starts "
                           "from an empty one", self.trt, cache_path, logger.errors())
            config.set_timing_cache(cache, False)
            plan = builder.build_serialized_network(network, config)
            if plan is None:
                raise BuildError(f"{self.trt} could not build the engine: {logger.errors()}")
            timing_cache.merge(cache_path, config)  # locked, merged, atomic
        data = bytes(plan)
        if plan_path is not None:
            _write(plan_path, data)
            _write(stamp, source.encode())
        return Engine(model_path, dict(settings), plan_path or model_path, len(data),
                      handle=data, sha256=hashlib.sha256(data).hexdigest() if plan_path else "")

    def _source_digest(self, model_path: Path, settings: Mapping[str, Any]) -> str:
        """sha256 of what a plan is built from: model bytes, settings, TensorRT version.

        A stored plan is reused only when this matches (a changed seasoning or TensorRT
        would otherwise hand back a stale engine under the same fingerprint).
        """
        digest = hashlib.sha256(model_path.read_bytes())
        digest.update(json.dumps([dict(settings), str(self.trt)], sort_keys=True).encode())
        return digest.hexdigest()

    def open(self, engine: Engine) -> Runner:
        """Deserialize the plan and wrap it in a `TensorRtRunner`.

        Raises:
            EngineNotRunnable: No CUDA GPU, or the runtime refused the engine on this
                device (its message).
        """
        from routetune.plugins.tensorrt.runner import TensorRtRunner

        if not _gpu():
            raise EngineNotRunnable(f"no CUDA GPU here for {self.trt} to run engines on")
        trt = self.trt.module
        logger = make_logger(trt)
        runtime = make_runtime(trt, logger)
        data = engine.handle if engine.handle is not None else engine.path.read_bytes()
        cuda_engine = runtime.deserialize_cuda_engine(data)
        if cuda_engine is None:
            raise EngineNotRunnable(f"the {self.trt} runtime refused the engine on "
                                    f"{self.device()}: {logger.errors()}")
        profile = ShapeProfile.parse(engine.settings.get(NS + "profile", ""))
        return TensorRtRunner(trt, runtime, cuda_engine, profile,
                              bool(engine.settings.get(NS + "cuda_graph")))


def make_runtime(trt: Any, logger: Any) -> Any:
    """A ``trt.Runtime`` that refuses plans carrying host code.

    ``engine_host_code_allowed`` (TensorRT's ``IRuntime::setEngineHostCodeAllowed``)
    lets a plan run plugin or lean-runtime code embedded in it; a plan from a results
    folder is data, so it stays off whatever the library's default (SECURITY.md).
    """
    runtime = trt.Runtime(logger)
    runtime.engine_host_code_allowed = False
    return runtime


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


def _profile(builder: Any, network: Any, settings: Mapping[str, Any]) -> Any:
    """One optimisation profile with every network input's min/opt/max shape.

    Raises:
        BuildError: A dynamic input has no shapes in the profile.
    """
    shapes = ShapeProfile.parse(settings[NS + "profile"]).shapes
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = tuple(tensor.shape)
        if tensor.name in shapes:
            profile.set_shape(tensor.name, *shapes[tensor.name])
        elif any(d < 0 for d in dims):
            dim = next(j for j, d in enumerate(dims) if d < 0)
            raise BuildError(f"input '{tensor.name}' dimension {dim} is dynamic and the "
                             "profile has no shapes for it; give --shapes or --min/--opt/"
                             "--max-shapes")
        else:
            profile.set_shape(tensor.name, dims, dims, dims)
    return profile


@functools.cache
def _warn_once(level: int, message: str, *args: object) -> None:
    """Log once per process for the same arguments."""
    logger_.log(level, message, *args)


def _write(path: Path, data: bytes) -> None:
    timing_cache.write_atomic(path, data)


@functools.cache
def _gpu() -> dict[str, str]:
    """The GPU's facts (`cuda_versions`), or empty without CuPy or a usable GPU."""
    try:
        return cuda_versions()
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: no GPU
        return {}


@functools.cache
def _config_defaults(trt_module: TensorRtModule) -> dict[str, Any]:
    """The installed TensorRT's builder defaults, read from a fresh config."""
    if trt_module.module is None:
        return {"level": 3, "aux": -1, "tf32": True}
    trt = trt_module.module
    config = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    return {"level": config.builder_optimization_level, "aux": config.max_aux_streams,
            "tf32": bool(config.get_flag(trt.BuilderFlag.TF32))}


@functools.cache
def all_build_routes(trt_module: TensorRtModule) -> str:
    """``config.all_build_routes`` of a fresh builder config ("" without TensorRT)."""
    if trt_module.module is None:
        return ""
    trt = trt_module.module
    config = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    return str(getattr(config, "all_build_routes", "") or "")
