"""The ``tensorrt`` backend: strongly typed TensorRT engines built from the ONNX graph.

Built with TensorRT 11 where installed, else TensorRT-RTX (`module.find_tensorrt`):
parse the ONNX file (``OnnxParser``), make the builder config and one optimisation
profile, build a serialized plan (``build_serialized_network``), each step a loader in
Polygraphy's style (`routetune.plugins.tensorrt.loaders`). Precision is the
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from routetune.backend import Backend, Engine, OptionSpec, Runner
from routetune.errors import BackendError, BuildError, EngineNotRunnable
from routetune.feeds.profile import ShapeProfile
from routetune.libraries import PLUGINS, in_use
from routetune.plugins.cuda import cuda_versions
from routetune.plugins.tensorrt.loaders import (
    NS,
    ConfigFromSettings,
    NetworkFromOnnx,
    PlanCache,
    PlanFromNetwork,
    TimingCacheFile,
    load_plugins,
)
from routetune.plugins.tensorrt.logger import make_logger
from routetune.plugins.tensorrt.module import TensorRtModule, find_tensorrt

TILING = ("none", "fast", "moderate", "full")
PREFLIGHT = ("int32-limits", "fold-if")
"""The TensorRT base pipeline: graph rewrites the ONNX parser needs (see each seasoning)."""
TIMING_CACHE = "timing.cache"


class TensorRtBackend(Backend):
    """Builds TensorRT plans; runs and times them on the GPU where the runtime allows."""

    name = "tensorrt"
    preflight = PREFLIGHT

    @property
    def trt(self) -> TensorRtModule:
        """The TensorRT module in use."""
        return find_tensorrt()

    def device_memory_used(self) -> int | None:
        """Bytes in use on this process's GPU; None without a usable GPU."""
        from routetune.plugins.cuda import device_memory_used

        return device_memory_used() if _gpu() else None

    def load_plugin_libraries(self, paths: Sequence[Path]) -> None:
        """Load plugin libraries into TensorRT's registry in this process (`load_plugins`).

        Raises:
            BackendError: No TensorRT here, or TensorRT refused a library (its message).
        """
        if not paths:
            return
        trt = self.trt.module
        if trt is None:
            raise BackendError(f"no TensorRT here to load {paths[0]} into: {self.trt.reason}")
        logger = make_logger(trt)
        builder = trt.Builder(logger)
        try:
            load_plugins(builder.get_plugin_registry(), paths, logger, str(self.trt))
        except BuildError as e:
            raise BackendError(f"{e}; give a TensorRT plugin library built for {self.trt}"
                               ) from e

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
                bool, False, (True, False), "replay the enqueue as a CUDA graph (runtime)",
                runtime=True),
            NS + "profile": OptionSpec(
                str, str(self.profile or ""), (), "optimisation profile, name:min/opt/max"),
        }

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Parse, configure and build a serialized plan; reuse a stored one for `key`.

        The build is a composition of loaders (`routetune.plugins.tensorrt.loaders`):
        the network from the ONNX file, the config from the settings, the timing cache,
        the plan; `PlanCache` keeps the plan per trial.

        Raises:
            BuildError: The parser refused the model (its messages, with node names and
                the operators it cannot take), TensorRT rejected a build-route knob, a
                dynamic input has no profile, or the build failed.
        """
        plans = PlanCache(workdir / "engines" / f"{key}.plan", PlanCache.source_of(
            model_path, settings, str(self.trt))) if key else None
        data = plans.get() if plans is not None else None
        if plans is not None and data is not None:
            return Engine(model_path, dict(settings), plans.path, len(data), handle=data,
                          sha256=hashlib.sha256(data).hexdigest(), reused=True)
        trt = self.trt.module
        cache = TimingCacheFile(workdir / "engines" / TIMING_CACHE, str(self.trt), bool(_gpu()))
        data = PlanFromNetwork(NetworkFromOnnx(trt, model_path, _plugins()),
                               ConfigFromSettings(trt, settings), cache)()
        if plans is not None:
            plans.put(data)
        return Engine(model_path, dict(settings), plans.path if plans else model_path,
                      len(data), handle=data,
                      sha256=hashlib.sha256(data).hexdigest() if plans else "")

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
        try:
            load_plugins(runtime.get_plugin_registry(), _plugins(), logger, str(self.trt))
        except BuildError as e:
            raise EngineNotRunnable(str(e)) from e
        data = engine.handle if engine.handle is not None else engine.path.read_bytes()
        cuda_engine = runtime.deserialize_cuda_engine(data)
        if cuda_engine is None:
            raise EngineNotRunnable(f"the {self.trt} runtime refused the engine on "
                                    f"{self.device()}: {logger.errors()}")
        profile = ShapeProfile.parse(engine.settings.get(NS + "profile", ""))
        return TensorRtRunner(trt, runtime, cuda_engine, profile,
                              bool(engine.settings.get(NS + "cuda_graph")))


def _plugins() -> tuple[Path, ...]:
    """This process's ``--plugin-library`` files (`routetune.libraries.in_use`)."""
    return tuple(lib.path for lib in in_use(PLUGINS))


def make_runtime(trt: Any, logger: Any) -> Any:
    """A ``trt.Runtime`` that refuses plans carrying host code.

    ``engine_host_code_allowed`` (TensorRT's ``IRuntime::setEngineHostCodeAllowed``)
    lets a plan run plugin or lean-runtime code embedded in it; a plan from a results
    folder is data, so it stays off whatever the library's default (SECURITY.md).
    """
    runtime = trt.Runtime(logger)
    runtime.engine_host_code_allowed = False
    return runtime


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
