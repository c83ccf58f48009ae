"""The ONNX Runtime backend: an engine is an ONNX model plus session options.

The execution provider is an option (``onnxruntime.execution_provider``), so CUDA or
TensorRT providers are settings of this backend, not new backends.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from routetune.backend import Backend, Engine, Feed, OptionSpec, Runner
from routetune.errors import BuildError
from routetune.libraries import in_use
from routetune.timing.float_env import FloatEnv, flushing

NS = "onnxruntime."
CONFIG = NS + "config."
"""Prefix of session config entries (``SessionOptions.add_session_config_entry``)."""

OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
if hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):  # ONNX Runtime >= 1.22
    OPT_LEVELS["layout"] = ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT

MODES = {
    "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
    "parallel": ort.ExecutionMode.ORT_PARALLEL,
}

# Session config keys and their defaults, from onnxruntimesession_options_config_keys.h.
CONFIG_DEFAULTS = {
    "session.intra_op.allow_spinning": "1",
    "session.inter_op.allow_spinning": "1",
    "session.set_denormal_as_zero": "0",
    "session.disable_prepacking": "0",
}


CPU_MISSING_DTYPES = {
    "bfloat16": "ONNX Runtime's CPUExecutionProvider has no bfloat16 kernels "
                "(MatMul and Add give NOT_IMPLEMENTED)",
    "float8e4m3fn": "ONNX Runtime's CPUExecutionProvider has no FP8 kernels",
}


class OnnxRuntimeBackend(Backend):
    """Builds ONNX Runtime inference sessions; CPU execution provider by default."""

    name = "onnxruntime"

    def version(self) -> str:
        """The installed onnxruntime version."""
        return ort.__version__

    def device(self) -> str:
        """The CPU model and core count (e.g. ``cpu: Intel Xeon ... (2 cores)``)."""
        return f"cpu: {_cpu_name()} ({os.cpu_count()} cores)"

    def options(self) -> Mapping[str, OptionSpec]:
        """The session options this backend sets, with ONNX Runtime's defaults."""
        specs = {
            NS + "execution_provider": OptionSpec(
                str, "CPUExecutionProvider", tuple(ort.get_available_providers()),
                "execution provider the session runs on",
            ),
            NS + "graph_optimization_level": OptionSpec(
                str, "all", tuple(OPT_LEVELS), "SessionOptions.graph_optimization_level"
            ),
            NS + "execution_mode": OptionSpec(
                str, "sequential", tuple(MODES), "SessionOptions.execution_mode"
            ),
            NS + "intra_op_num_threads": OptionSpec(
                int, 0, (), "threads inside one op; 0 lets ONNX Runtime choose"
            ),
            NS + "inter_op_num_threads": OptionSpec(
                int, 0, (), "threads across ops in parallel mode; 0 lets ONNX Runtime choose"
            ),
            NS + "enable_mem_pattern": OptionSpec(bool, True, (True, False), ""),
            NS + "enable_cpu_mem_arena": OptionSpec(bool, True, (True, False), ""),
        }
        for key, default in CONFIG_DEFAULTS.items():
            specs[CONFIG + key] = OptionSpec(str, default, ("0", "1"), "session config entry")
        return specs

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Create an inference session for `model_path` with full `settings`.

        Raises:
            BuildError: ONNX Runtime refused the model or the options.
        """
        so = session_options(settings)
        provider = settings[NS + "execution_provider"]
        try:
            session = ort.InferenceSession(str(model_path), so, providers=[provider])
        except Exception as e:  # ORT raises its own exception types per failure
            raise BuildError(f"ONNX Runtime refused the model: {_one_line(e)}") from e
        size = model_path.stat().st_size
        return Engine(model_path, dict(settings), model_path, size, handle=session,
                      float_env=engine_float_env(settings))

    def open(self, engine: Engine) -> Runner:
        """Wrap the engine's session (built already) in a runner."""
        if engine.handle is None:
            engine = self.build(engine.model_path, engine.settings, engine.path.parent)
        return OnnxRuntimeRunner(engine.handle)

    def dtype_support(self, dtype: str) -> str | None:
        """bfloat16 and FP8 have no kernels on the CPU execution provider."""
        provider = self.options()[NS + "execution_provider"].default
        if provider == "CPUExecutionProvider" and dtype in CPU_MISSING_DTYPES:
            return CPU_MISSING_DTYPES[dtype]
        return None

    def gpus(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The visible GPUs for a GPU execution provider; none for the CPU provider."""
        if settings.get(NS + "execution_provider", "CPUExecutionProvider") in (
                "CPUExecutionProvider", "DnnlExecutionProvider", "OpenVINOExecutionProvider"):
            return ()
        from routetune.plugins.cuda import visible_gpus

        return visible_gpus()

    def emulates(self, dtype: str, settings: Mapping[str, Any]) -> bool:
        """The CPU provider computes float16 Pow, reductions, Exp and Softmax in float32.

        Its MLAS kernels widen float16 to float32, compute, and round the result, so an
        accumulator that would overflow in float16 does not show.
        """
        return dtype == "float16" and settings.get(NS + "execution_provider") in (
            None, "CPUExecutionProvider")

    def evaluate(self, model: Any, feeds: list[Feed], weights: Path | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
        """Run an in-memory model on the CPU provider, optimisations off; all outputs.

        One feed's outputs at a time (`Backend.evaluate`). External data is read from
        `weights` (ONNX Runtime's session option
        ``session.model_external_initializers_file_folder_path``).
        """
        session = ort.InferenceSession(model.SerializeToString(), reference_options(weights),
                                       providers=["CPUExecutionProvider"])
        runner = OnnxRuntimeRunner(session)
        for feed in feeds:
            yield runner.infer(feed)

    def run_on_device(self, model: Any, feeds: list[Feed], weights: Path | None = None
                      ) -> Iterator[dict[str, np.ndarray]]:
        """Run an in-memory model on this backend's execution provider, optimisations off.

        One feed's outputs at a time (`Backend.evaluate`). ONNX Runtime's Python API
        returns no bfloat16 array, so each bfloat16 output is cast to float32 in the
        graph (exact) and handed back as ``ml_dtypes.bfloat16``.
        """
        provider = self.options()[NS + "execution_provider"].default
        model, bf16 = _bfloat16_outputs_as_float(model)
        session = ort.InferenceSession(model.SerializeToString(), reference_options(weights),
                                       providers=[provider])
        runner = OnnxRuntimeRunner(session)
        for feed in feeds:
            run = runner.infer(feed)
            for name in bf16:
                run[name] = run.pop(name + AS_FLOAT).astype(ml_dtypes.bfloat16)
            yield run

    def operator_schemas(self) -> Mapping[tuple[str, str], Any]:
        """ONNX Runtime's own operators: ``com.microsoft`` and its other contrib domains.

        From ``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema``.
        """
        return _contrib_schemas()

    def kernel_gaps(self, model: Any, feeds: Sequence[Feed]) -> dict[str, str]:
        """Run `model` with this backend's provider and default settings on `feeds`.

        ONNX Runtime names the node it lacks a kernel for when the session is made
        ("Could not find an implementation for ScatterND(18) node with name 'n'") or
        when the node runs ("... running ScatterND node. Name:'n' Status Message: ...");
        any other failure is not a kernel gap and gives nothing here.
        """
        provider = self.options()[NS + "execution_provider"].default
        try:
            session = ort.InferenceSession(model.SerializeToString(),
                                           session_options(self.full_settings({})),
                                           providers=[provider])
            runner = OnnxRuntimeRunner(session)
            for feed in feeds:
                runner.infer(feed)
        except Exception as e:  # ORT's own exception types
            text = _one_line(e)
            found = KERNEL_GAP.search(text)
            return {found.group(1) or found.group(2): text} if found else {}
        return {}

    def reference(self, model_path: Path) -> Runner:
        """Open `model_path` on the CPU provider with every graph optimisation off."""
        settings = self.full_settings({NS + "graph_optimization_level": "disable"})
        return self.open(self.build(model_path, settings, model_path.parent))


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], Any]:
    """ONNX Runtime's registered schemas that ONNX does not define, the newest of each.

    Its contrib domains (``com.microsoft`` …), and its own operators in the default
    domain: ``SimplifiedLayerNormalization``, which its transformer optimizer writes
    there (ONNX Runtime 1.32: 16 such names), and those it registers at opsets where
    ONNX has none: ``LayerNormalization`` from opset 1 (ONNX's from 17), which the
    optimizer writes into a model of an older opset, and ``ThresholdedRelu`` and
    ``MeanVarianceNormalization`` from 1.
    """
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    return {(s.domain, s.name): s
            for s in sorted(get_all_operator_schema(), key=lambda s: s.since_version)
            if s.domain not in ("", "ai.onnx", "ai.onnx.ml")
            or not onnx.defs.has(s.name, s.since_version, s.domain)}


KERNEL_GAP = re.compile(
    r"Could not find an implementation for \S+ node with name '([^']*)'"
    r"|running \S+ node\. Name:'([^']*)' Status Message: .*(?:not supported|NOT_IMPLEMENTED)")
"""ONNX Runtime's words for a node without a kernel (1.32), at session creation or run."""


def owned(names: Sequence[str], arrays: Sequence[Any]) -> dict[str, Any]:
    """Outputs by name, each an array that owns its memory.

    ONNX Runtime can return an output as a view of its own allocation (with graph
    optimisations off, on the CPU provider, as of 1.32); the view keeps that whole
    allocation alive after the session is closed: 0.55 GiB of a 1 GiB model for two
    kept outputs (large-model benchmark). Kept outputs (references, accuracy checks)
    must not hold a closed session's memory, so views are copied. A sequence output is a
    list of arrays (each copied the same way); a map output is returned as it came.
    """
    return {name: _owned(a) for name, a in zip(names, arrays, strict=True)}


def _owned(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value if value.flags.owndata else value.copy()
    if isinstance(value, list):
        return [_owned(v) for v in value]
    return value


class OnnxRuntimeRunner(Runner):
    """Runs an `onnxruntime.InferenceSession` on host arrays."""

    calls_like_infer = True  # `prepare` and `infer` are both `session.run`

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]
        self.low_inputs = {i.name: np.dtype(np.float16) for i in session.get_inputs()
                           if i.type == "tensor(float16)"}
        self.quiet = ort.RunOptions()
        self.quiet.log_severity_level = 4  # a failed run raises: its error is reported once

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once; outputs by name, as host arrays (float16 where the model gives it)."""
        return owned(self.output_names,
                     self.session.run(None, self._cast(feed), self.quiet))

    def _cast(self, feed: Feed) -> dict[str, Any]:
        """A private copy of the feed, cast to float16 where the model takes float16.

        A copy, because ONNX Runtime may write into an input: a training-mode
        BatchNormalization updates its ``input_mean``/``input_var`` in place (onnx node test
        ``test_batchnorm_epsilon_training_mode``), and the next run on the same feed (the
        FP32 reference) would read the changed values.
        """
        return {k: np.array(v, dtype=self.low_inputs.get(k), copy=True)
                for k, v in feed.items()}

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """Return a call that runs the session once on `feed` (cast once, here)."""
        session, names, inputs = self.session, self.output_names, self._cast(feed)
        return lambda: session.run(names, inputs)

    def close(self) -> None:
        """Drop the session."""
        self.session = None  # type: ignore[assignment]


EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
"""ONNX Runtime's session config key for the folder of a model given as bytes whose
initializers are external data (onnxruntime_session_options_config_keys.h)."""


def reference_options(weights: Path | None = None) -> ort.SessionOptions:
    """Session options of an FP32 reference run: quiet, every graph optimisation off.

    Args:
        weights: The folder a model given as bytes has its external data in, or None.
    """
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = OPT_LEVELS["disable"]
    if weights is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER, str(weights.resolve()))
    return with_custom_ops(so)


def with_custom_ops(so: ort.SessionOptions) -> ort.SessionOptions:
    """`so` with this process's custom-op libraries registered (`routetune.libraries`)."""
    for library in in_use():
        so.register_custom_ops_library(str(library.path))
    return so


def session_options(settings: Mapping[str, Any]) -> ort.SessionOptions:
    """`ort.SessionOptions` from full settings (``onnxruntime.*`` keys)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = OPT_LEVELS[settings[NS + "graph_optimization_level"]]
    so.execution_mode = MODES[settings[NS + "execution_mode"]]
    so.intra_op_num_threads = settings[NS + "intra_op_num_threads"]
    so.inter_op_num_threads = settings[NS + "inter_op_num_threads"]
    so.enable_mem_pattern = settings[NS + "enable_mem_pattern"]
    so.enable_cpu_mem_arena = settings[NS + "enable_cpu_mem_arena"]
    for key in CONFIG_DEFAULTS:
        so.add_session_config_entry(key, settings[CONFIG + key])
    return with_custom_ops(so)


def engine_float_env(settings: Mapping[str, Any]) -> FloatEnv | None:
    """FTZ and DAZ for a session made with ``session.set_denormal_as_zero``, else None.

    ONNX Runtime sets them in the thread that makes the process's first such session and
    never again, and runs a session's nodes in the calling thread too; the search keeps
    them out of the thread (`routetune.timing.float_env`) and turns them on around this
    engine's calls, as a process that made this one session would have them.
    """
    if settings.get(CONFIG + "session.set_denormal_as_zero") != "1":
        return None
    return flushing()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


AS_FLOAT = "__as_float32"
"""The suffix of a bfloat16 output's float32 copy (`_bfloat16_outputs_as_float`)."""


def _bfloat16_outputs_as_float(model: Any) -> tuple[Any, list[str]]:
    """`model` with each bfloat16 graph output read through a Cast to float32.

    Returns:
        A copy of the model (or `model` itself when no output is bfloat16), and the
        names of the outputs that were bfloat16; their float32 copies are named
        ``name + AS_FLOAT``.
    """
    import onnx

    low = [o for o in model.graph.output
           if o.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16]
    if not low:
        return model, []
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for out in copy.graph.output:
        if out.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            copy.graph.node.append(onnx.helper.make_node(
                "Cast", [out.name], [out.name + AS_FLOAT], to=onnx.TensorProto.FLOAT))
            out.name += AS_FLOAT
            out.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return copy, [o.name for o in low]
