"""The ``onnxruntime-cuda`` backend: ONNX Runtime's CUDA execution provider on one GPU.

Engines are inference sessions on the CUDA provider with a CuPy stream as the
provider's compute stream (``user_compute_stream``). Timed runs use I/O binding: the
inputs are copied to the device once per input set and the outputs stay there, so the
timing is device compute, bracketed by CUDA events recorded on that stream
(``cudaEventElapsedTime``, 0.5 µs resolution). `CudaRunner.prepare_end_to_end` gives
the other figure, a host-to-host run with the copies. Provider options are settings
``onnxruntime.cuda.<option>``; only those the installed provider reports
(``InferenceSession.get_provider_options``) are offered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from routetune.backend import Engine, Feed, OptionSpec, Runner
from routetune.errors import BuildError
from routetune.install import pip_install
from routetune.plugins.cuda import cuda_versions, device_memory_used, event_timed
from routetune.plugins.onnxruntime.backend import (
    NS,
    OnnxRuntimeBackend,
    engine_float_env,
    owned,
    session_options,
    with_custom_ops,
)
from routetune.plugins.onnxruntime.cuda_options import FLAG, SEARCHED, flags_beyond_catalog
from routetune.plugins.onnxruntime.cuda_provider import PROVIDER, provider_defaults

CUDA_NS = NS + "cuda."

CUDA_OPTIONS = SEARCHED
"""The CUDA provider options routetune searches (`cuda_options.SEARCHED`)."""


class OnnxRuntimeCudaBackend(OnnxRuntimeBackend):
    """ONNX Runtime on the CUDA execution provider; device-resident I/O, CUDA-event timing."""

    name = "onnxruntime-cuda"

    def available(self) -> str | None:
        """Why not: no CUDA provider in this onnxruntime, no CuPy, or no GPU."""
        if PROVIDER not in ort.get_available_providers():
            return ("this onnxruntime has no CUDAExecutionProvider; install onnxruntime-gpu "
                    f"({pip_install('gpu')})")
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                return "no CUDA device"
        except Exception as e:  # noqa: BLE001 - ImportError or a CUDA runtime error
            return f"CuPy cannot reach a GPU ({type(e).__name__}: {e})"
        if not provider_defaults():
            return "the CUDA provider does not start (CUDA or cuDNN libraries missing?)"
        return None

    def device(self) -> str:
        """``cuda: <GPU> (cc X.Y, driver A.B, CUDA runtime C.D)``."""
        v = cuda_versions()
        return (f"cuda: {v['gpu']} (cc {v['compute_capability']}, driver {v['cuda_driver']}, "
                f"CUDA runtime {v['cuda_runtime']})")

    def versions(self) -> dict[str, str]:
        """onnxruntime-gpu, CUDA driver and runtime, CuPy, and the GPU's name."""
        return {**super().versions(), **cuda_versions()}

    def options(self) -> Mapping[str, OptionSpec]:
        """The session options, CUDA as the provider, and the CUDA options it knows."""
        specs = dict(super().options())
        specs[NS + "execution_provider"] = OptionSpec(str, PROVIDER, (PROVIDER,),
                                                      "execution provider the session runs on")
        known = provider_defaults()
        for key, (choices, help_) in CUDA_OPTIONS.items():
            if key in known:
                default = known[key] if known[key] in choices else choices[0]
                specs[CUDA_NS + key] = OptionSpec(str, default, choices, help_)
        for key, default in flags_beyond_catalog(known).items():  # a newer provider's
            specs[CUDA_NS + key] = OptionSpec(str, default, FLAG, "a 0/1 option of the "
                                              "installed provider (ort-cuda-flag)")
        return specs

    def option_keys(self) -> frozenset[str]:
        """The session options and the CUDA options (routetune's, and the provider's flags).

        routetune's CUDA options count whether installed or not (`check_option_keys`
        then catches a misspelled key anywhere); the installed provider's 0/1 options
        beyond them are ``ort-cuda-flag``'s.
        """
        return (frozenset(super().options()) | {CUDA_NS + key for key in CUDA_OPTIONS}
                | {CUDA_NS + key for key in flags_beyond_catalog(provider_defaults())})

    def dtype_support(self, dtype: str) -> str | None:
        """FP8 Q/DQ has no CUDA-provider kernels; float16 and bfloat16 run natively."""
        if dtype.startswith("float8"):
            return "ONNX Runtime's CUDA provider has no FP8 Conv/MatMul kernels for Q/DQ models"
        return None

    def emulates(self, dtype: str, settings: Mapping[str, Any]) -> bool:
        """The GPU computes float16 and bfloat16 natively."""
        return False

    def device_memory_used(self) -> int | None:
        """Bytes in use on this process's GPU (`routetune.plugins.cuda.device_memory_used`)."""
        return device_memory_used()

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Create a CUDA-provider session on a fresh CuPy stream.

        ONNX Runtime's Python session falls back to other providers when the CUDA
        provider fails, at creation or at a run (printing "Falling back to …"): the
        engine would then not be the route's. The fallback is turned off
        (``enable_fallback=0``, and `disable_fallback` where that keyword is not read),
        so such a failure is the trial's.

        Raises:
            BuildError: ONNX Runtime refused the model or the provider options, or the
                session it made does not run on the CUDA provider.
        """
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        options = {k.removeprefix(CUDA_NS): v for k, v in settings.items()
                   if k.startswith(CUDA_NS)}
        options["user_compute_stream"] = str(stream.ptr)
        try:
            session = ort.InferenceSession(str(model_path), session_options(settings),
                                           providers=[(PROVIDER, options)], enable_fallback=0)
            session.disable_fallback()
        except Exception as e:  # ORT raises its own exception types per failure
            raise BuildError(f"ONNX Runtime (CUDA) refused the model: "
                             f"{' '.join(str(e).split())[:400]}") from e
        if session.get_providers()[:1] != [PROVIDER]:
            raise BuildError(f"ONNX Runtime made a session on {session.get_providers()}, "
                             f"not on {PROVIDER}: the CUDA provider refused the model")
        size = model_path.stat().st_size
        return Engine(model_path, dict(settings), model_path, size, handle=(session, stream),
                      float_env=engine_float_env(settings))

    def open(self, engine: Engine) -> Runner:
        """A `CudaRunner` on the engine's session and stream."""
        if engine.handle is None:
            engine = self.build(engine.model_path, engine.settings, engine.path.parent)
        session, stream = engine.handle
        graph = engine.settings.get(CUDA_NS + "enable_cuda_graph") == "1"
        return CudaRunner(session, stream, graph, engine.model_path)


@dataclass
class _Graph:
    """One captured CUDA graph: its I/O binding, its bound input buffers, its run options.

    The run options name the graph (``gpu_graph_id``).
    """

    binding: Any
    bound: dict[str, Any]
    options: Any


class CudaRunner(Runner):
    """Runs a CUDA-provider session with device-resident inputs and outputs.

    ``host_copies``: `prepare_end_to_end` runs from host memory, with the copies.

    Args:
        session: The session; its compute stream is `stream`.
        stream: The CuPy stream the provider computes on.
        model_path: The ONNX model, run once on the CPU to size a CUDA graph's outputs.
        cuda_graph: Whether the session replays CUDA graphs, one per input shape
            (`_graph`): every run of a shape reads the same input buffers and writes
            the same output buffers, so an input set is copied (device to device) into
            its shape's bound inputs before its run, outside the timed interval.
    """

    def __init__(self, session: ort.InferenceSession, stream: Any, cuda_graph: bool,
                 model_path: Path) -> None:
        self.session = session
        self.stream = stream
        self.cuda_graph = cuda_graph
        self.model_path = model_path
        self.output_names = [o.name for o in session.get_outputs()]
        self.input_types = {i.name: _np_type(i.type) for i in session.get_inputs()}
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self._cpu: ort.InferenceSession | None = None
        self._keep: list[Any] = []
        self.quiet = ort.RunOptions()
        self.quiet.log_severity_level = 4  # a failed run raises: its error is reported once

    host_copies = True

    def _cast(self, feed: Feed) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(np.asarray(v).astype(self.input_types.get(k, None)
                                                             or np.asarray(v).dtype))
                for k, v in feed.items()}

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run host to host; outputs by name as host arrays."""
        if self.cuda_graph:  # a graph-captured session runs only through its bound buffers
            call = self.prepare(feed)
            call.stage()  # type: ignore[attr-defined]
            call()
            self.synchronize()
            return owned(self.output_names,
                         call.graph.binding.copy_outputs_to_cpu())  # type: ignore[attr-defined]
        return owned(self.output_names, self.session.run(None, self._cast(feed), self.quiet))

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """Copy `feed` to the device and return a call that runs on the bound buffers."""
        host = self._cast(feed)
        values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in host.items()}
        self._keep.append(values)
        if self.cuda_graph:
            return self._prepare_graph(values, host)
        binding = self.session.io_binding()
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)
        session = self.session
        return lambda: session.run_with_iobinding(binding)

    def _graph(self, values: dict[str, Any], host: dict[str, np.ndarray]) -> _Graph:
        """The captured graph for these inputs' shapes and types, bound on first use.

        A CUDA graph replays fixed buffers, so input sets of other shapes (a decoder's
        decode steps against a growing cache) each get their own graph, told apart by
        ONNX Runtime's ``gpu_graph_id`` run option (1, 2, ...; 0 is reserved, -1 turns
        capture off: onnxruntime_run_options_config_keys.h).
        """
        key = tuple((k, a.shape, a.dtype.str) for k, a in sorted(host.items()))
        graph = self._graphs.get(key)
        if graph is None:  # this set's buffers become the bound ones for its shape
            binding = self.session.io_binding()
            for name, value in values.items():
                binding.bind_ortvalue_input(name, value)
            # Output buffers must exist before the first (captured) run; their shapes
            # come from one CPU run of the same model on these inputs.
            for name, out in self.output_shapes(host).items():
                fixed = ort.OrtValue.ortvalue_from_shape_and_type(out.shape, out.dtype,
                                                                  "cuda", 0)
                self._keep.append(fixed)
                binding.bind_ortvalue_output(name, fixed)
            options = ort.RunOptions()
            options.log_severity_level = 4
            options.add_run_config_entry("gpu_graph_id", str(len(self._graphs) + 1))
            graph = self._graphs[key] = _Graph(binding, dict(values), options)
        return graph

    def _prepare_graph(self, values: dict[str, Any], host: dict[str, np.ndarray]
                       ) -> Callable[[], None]:
        import cupy

        graph = self._graph(values, host)
        session, stream = self.session, self.stream
        copies = [(graph.bound[k].data_ptr(), v.data_ptr(), _nbytes(v))
                  for k, v in values.items() if v is not graph.bound[k]]  # same shapes

        def stage() -> None:
            for dst, src, n in copies:
                cupy.cuda.runtime.memcpyAsync(dst, src, n, 3, stream.ptr)  # device to device

        def call() -> None:
            session.run_with_iobinding(graph.binding, graph.options)

        call.stage = stage  # type: ignore[attr-defined]
        call.graph = graph  # type: ignore[attr-defined]
        return call

    def output_shapes(self, feed: Feed) -> dict[str, np.ndarray]:
        """Zero arrays shaped and typed like the outputs on `feed` (one CPU run)."""
        if self._cpu is None:  # one session for every shape's graph
            self._cpu = ort.InferenceSession(str(self.model_path),
                                             with_custom_ops(ort.SessionOptions()),
                                             providers=["CPUExecutionProvider"])
        outs = self._cpu.run(self.output_names, dict(feed))
        return {n: np.zeros_like(o) for n, o in zip(self.output_names, outs, strict=True)}

    def prepare_end_to_end(self, feed: Feed) -> Callable[[], None]:
        """A call that runs host to host: input copies, compute, output copies."""
        if self.cuda_graph:
            inner = self.prepare(feed)  # binds the buffers on first use
            graph: _Graph = inner.graph  # type: ignore[attr-defined]
            binding, bound, host = graph.binding, graph.bound, self._cast(feed)

            def call() -> None:
                for name, array in host.items():
                    bound[name].update_inplace(array)  # host to device
                inner()
                binding.copy_outputs_to_cpu()
            return call
        session, names, inputs = self.session, self.output_names, self._cast(feed)
        return lambda: session.run(names, inputs)

    def timed(self, call: Callable[[], None]) -> float:
        """Run `call` between two CUDA events on the compute stream; their gap in ms."""
        stage = getattr(call, "stage", None)
        if stage is not None:
            stage()
        return event_timed(self.stream, call)

    def synchronize(self) -> None:
        """Wait for the compute stream."""
        self.stream.synchronize()

    def close(self) -> None:
        """Drop the bound buffers and the session."""
        self._keep.clear()
        self._graphs.clear()
        self._cpu = None


_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(double)": np.float64, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
          "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def _np_type(onnx_type: str) -> Any:
    return _TYPES.get(onnx_type)


def _nbytes(value: Any) -> int:
    return int(np.prod(value.shape())) * np.dtype(_np_type(value.data_type())).itemsize
