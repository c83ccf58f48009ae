"""The backend interface: build an engine from an ONNX model and build options, run it.

A backend plugin registers a `Backend` subclass through ``routetune_register_backends``.
Timing is not the backend's job: `routetune.timing.measure` times every backend the same way,
through `Runner.prepare`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from routetune.errors import BackendError
from routetune.feeds.profile import ShapeProfile

Feed = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class OptionSpec:
    """One build option a backend accepts.

    Args:
        type: The Python type of the value (``str``, ``int``, ``bool``).
        default: The value the backend's default build uses.
        choices: The allowed values, or empty when any value of `type` is allowed.
        help: One line.
        runtime: Applied when the engine runs, not kept in the engine file (TensorRT's
            CUDA graph): two routes whose engine files are equal are the same engine
            only when these options are equal too (`routetune.search.loop`).
    """

    type: type
    default: Any
    choices: tuple[Any, ...] = ()
    help: str = ""
    runtime: bool = False


@dataclass(frozen=True)
class Engine:
    """A built engine, ready to open.

    Args:
        model_path: The ONNX model the engine was built from.
        settings: The full build options, defaults included.
        path: The engine file (for ONNX Runtime, the model itself).
        size_bytes: The engine's size in bytes.
        handle: A backend-private in-memory object (a session), or None.
        sha256: For an engine the backend keeps in a file under a trial's key (a
            TensorRT plan): the sha256 of its bytes, hex. For one it keeps no file of,
            what identifies the compiled engine where the backend can say (OpenVINO:
            `routetune.plugins.openvino.backend.compiled_identity`); empty otherwise.
            Two routes with equal hashes and run-time options are one engine, timed once.
        kernels: For a backend that can say: what the engine runs, its weights' values
            aside, as a sha256 (hex; OpenVINO's execution graph and resolved properties,
            `routetune.plugins.openvino.backend.runtime_graph`); empty otherwise. A route
            whose kernels are those of a shorter route within it that met the accuracy
            constraint runs as fast as that route and is not timed
            (`routetune.search.loop`).
        reused: True when `Backend.build` returned that kept file instead of building.
            The search then opens it only if its `sha256` is the one recorded for the
            trial when it was built, and otherwise builds again (SECURITY.md).
        float_env: The floating-point environment the engine's calls run under
            (`routetune.timing.float_env.FloatEnv`), or None for the thread's own: set by a
            backend whose engine expects one (`routetune.timing.float_env.flushing`), else by
            `routetune.candidate.artifacts.build_engine` when the build changed how the
            calling thread treats denormals.
    """

    model_path: Path
    settings: Mapping[str, Any]
    path: Path
    size_bytes: int
    handle: Any = field(default=None, compare=False, repr=False)
    sha256: str = ""
    kernels: str = ""
    reused: bool = False
    float_env: Any = field(default=None, compare=False, repr=False)


@dataclass
class PreparedCalls:
    """One prepared call per input set (`Runner.prepared`), in the order of `feeds`.

    Attributes:
        feeds: The input sets (the very sequence they were prepared from).
        calls: A call per input set (`Runner.prepare`).
        ran: Whether a timing has run every call (its warm-up): a later timing of the
            same calls needs a few runs to wake the engine, not one per input set
            (`routetune.timing.measure.measure_blocks`).
    """

    feeds: Sequence[Feed]
    calls: list[Callable[[], None]]
    ran: bool = False


class Runner:
    """An opened engine. A context manager; `infer` and `prepare` run it.

    Subclasses implement `infer` and `prepare`; `synchronize` matters for devices
    that run asynchronously.

    Class attributes:
        host_copies: Whether a run from host memory copies inputs and outputs between
            host and device (a GPU engine): then device compute (`prepare`, `timed`)
            and host-to-host time (`prepare_end_to_end`, `wall_timed`) differ, and the
            search records both (``--latency`` says which one it optimises).
        calls_like_infer: Whether a prepared call (`prepare`) runs the engine as `infer`
            does, with no request, binding or buffer of its own (ONNX Runtime on a CPU:
            both are ``session.run``). A candidate whose accuracy pass has run every
            input set through `infer` then needs no first run of each call before its
            timing, only `routetune.timing.measure.MeasureSettings.warmup` runs to
            wake its threads (`routetune.timing.measure.measure_blocks`). False where a
            call holds state of its own that its first run sets up (an OpenVINO infer
            request, an I/O binding on a GPU).
    """

    host_copies: ClassVar[bool] = False
    calls_like_infer: ClassVar[bool] = False

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the engine's resources."""

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once and return every output as a host array, by output name."""
        raise NotImplementedError

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """Return a call that runs one inference on `feed`, with setup done up front.

        `routetune.timing.measure` times calls to it; whatever can be done once (binding
        inputs, allocating outputs) belongs here, not in the call.
        """
        raise NotImplementedError

    def prepare_end_to_end(self, feed: Feed) -> Callable[[], None]:
        """Like `prepare`, but each call also copies the inputs and outputs host↔device.

        The default is `prepare`: a host device has no copies.
        """
        return self.prepare(feed)

    def prepared(self, feeds: Sequence[Feed], end_to_end: bool = False) -> PreparedCalls:
        """The calls of `feeds` (`prepare`, or `prepare_end_to_end`), made once and kept.

        A runner timed again on the same input sets (the base route's engine, open from
        one candidate to the next) reuses its calls: no new request, binding or device
        copy per timing, and the calls' own state (an OpenVINO request's output tensors)
        is already warm (`PreparedCalls.ran`). The calls live as long as the runner.
        """
        kept: dict[bool, PreparedCalls] = vars(self).setdefault("_prepared_calls", {})
        calls = kept.get(end_to_end)
        if calls is None or calls.feeds is not feeds:
            prepare = self.prepare_end_to_end if end_to_end else self.prepare
            calls = kept[end_to_end] = PreparedCalls(feeds, [prepare(f) for f in feeds])
        return calls

    def timed(self, call: Callable[[], None]) -> float:
        """Run a prepared call once and return its duration in ms.

        The default: wall-clock time (``time.perf_counter_ns``) around the call and
        `synchronize`. A GPU runner times on the device instead (CUDA events).
        """
        return self.wall_timed(call)

    def wall_timed(self, call: Callable[[], None]) -> float:
        """Run a prepared call once; wall-clock ms around the call and `synchronize`.

        What a host-to-host run (`prepare_end_to_end`) is timed with on every device.
        """
        t0 = time.perf_counter_ns()
        call()
        self.synchronize()
        return (time.perf_counter_ns() - t0) / 1e6

    def synchronize(self) -> None:
        """Wait until queued work has finished (a no-op on synchronous devices)."""


class Backend:
    """Base class of backends.

    Class attributes:
        name: The ``--backend`` value.
        preflight: Seasonings every route of this backend starts with, applied once
            to the prepared model and recorded with every trial (TensorRT's preflight
            rewrites, for example).

    Args:
        profile: The optimisation profile of the model's dynamic inputs; backends that
            build for fixed shape ranges (TensorRT) need it, others ignore it.
    """

    name: ClassVar[str]
    preflight: ClassVar[tuple[str, ...]] = ()

    def __init__(self, profile: ShapeProfile | None = None) -> None:
        self.profile = profile

    def available(self) -> str | None:
        """Return why this backend cannot be used here, or None when it can."""
        return None

    def version(self) -> str:
        """The backend's version string, recorded with every trial."""
        raise NotImplementedError

    def device(self) -> str:
        """A one-line description of the device that runs and times engines."""
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Versions recorded with every trial: the backend's, and its device stack's."""
        return {self.name: self.version()}

    def options(self) -> Mapping[str, OptionSpec]:
        """The build options this backend accepts, by namespaced key."""
        return {}

    def option_keys(self) -> frozenset[str]:
        """Every option key this backend may accept, whatever the installed version.

        What option seasonings are checked against before a search
        (`routetune.option_seasoning.check_option_keys`). The default: `options`' keys.
        A backend whose options depend on the installed library overrides it with all
        the keys it knows of, so that a key an older library lacks is not taken for a
        typo.
        """
        return frozenset(self.options())

    def full_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Check `settings` against `options` and fill in every default.

        Raises:
            BackendError: An unknown option key, or a value of the wrong type or
                outside its choices.
        """
        specs = self.options()
        for key, value in settings.items():
            if key not in specs:
                raise BackendError(
                    f"unknown option '{key}' for backend '{self.name}'; known: "
                    + ", ".join(sorted(specs))
                )
            spec = specs[key]
            if not isinstance(value, spec.type) or (spec.choices and value not in spec.choices):
                allowed = "|".join(map(str, spec.choices)) or spec.type.__name__
                raise BackendError(f"option '{key}': bad value {value!r}; allowed: {allowed}")
        return {**{k: s.default for k, s in specs.items()}, **settings}

    def load_plugin_libraries(self, paths: Sequence[Path]) -> None:
        """Load plugin libraries (``--plugin-library``) for this process's builds and engines.

        Called in the main process before the search, so that a library the backend
        refuses is one line there, and again before each build and each engine in every
        process (`routetune.libraries.in_use`); a library loads once per process.
        The default: a backend that takes no plugin libraries refuses any.

        Raises:
            BackendError: This backend takes none, or refused one (its own message).
        """
        if paths:
            raise BackendError(f"the {self.name} backend loads no plugin libraries (they "
                               "are TensorRT's); drop it, or use --backend tensorrt")

    def gpus(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The GPUs that run engines built with `settings`, one measuring worker each.

        Returns:
            ``CUDA_VISIBLE_DEVICES`` values, one per GPU; empty (the default) when
            engines run on the host CPU, so that measurement waits until no build runs.
        """
        return ()

    def dtype_support(self, dtype: str) -> str | None:
        """Return why engines of this backend cannot compute in `dtype`, or None.

        Args:
            dtype: An ONNX element type name in lower case (``float16``, ``bfloat16``,
                ``float8e4m3fn``).
        """
        return None

    def operator_schemas(self) -> Mapping[tuple[str, str], Any]:
        """Schemas of the operators this backend adds beyond ONNX's domains.

        A precision pass reads a node's type constraints from its schema; ``onnx.defs``
        knows only ONNX's domains, so a node of another (ONNX Runtime's ``com.microsoft``
        SkipLayerNormalization, say) would be kept in FP32 for want of one.

        Returns:
            ``(domain, op_type)`` to an object with ``inputs``, ``outputs`` (formal
            parameters with ``option`` and ``type_str`` or ``typeStr``) and
            ``type_constraints``, as ``onnx.defs.OpSchema`` has; the newest version of
            each. Empty by default.
        """
        return {}

    def kernel_gaps(self, model: Any, feeds: Sequence[Feed]) -> dict[str, str]:
        """The nodes of `model` this backend has no kernel for, found by running it.

        A precision pass asks before it hands over a converted model: a schema may admit
        float16 where a backend's kernel does not (ONNX Runtime's CPU provider has no
        float16 ScatterND with ``reduction='max'``, and says so only when the node runs).

        Args:
            model: An ``onnx.ModelProto`` that holds its data.
            feeds: Input sets to run it on.

        Returns:
            Node name to the backend's message, one line each; empty when it runs, or
            when this backend cannot tell (the default).
        """
        return {}

    def emulates(self, dtype: str, settings: Mapping[str, Any]) -> bool:
        """Whether engines built with `settings` compute `dtype` in a wider type inside.

        Such a device hides overflow of the low type (ONNX Runtime's CPU provider runs
        many float16 kernels in float32), so the search adds the strict-FP16 check
        (`routetune.judging.strict_fp16`) to the accuracy check. The default is False.

        Args:
            dtype: An ONNX element type name in lower case (``float16``).
            settings: Full build settings (`full_settings`).
        """
        return False

    def build(self, model_path: Path, settings: Mapping[str, Any], workdir: Path,
              key: str = "") -> Engine:
        """Build an engine from an ONNX file with full `settings`.

        Args:
            model_path: The candidate model.
            settings: Full build settings (`full_settings`).
            workdir: Where the backend may keep files that outlive the build (engine
                files, a timing cache); the search passes ``OUTDIR/artifacts``.
            key: The trial's fingerprint, to name a stored engine file so that a resumed
                search reuses it; empty for an engine that is not kept.

        Raises:
            BuildError: The backend refused the model or the options.
        """
        raise NotImplementedError

    def open(self, engine: Engine) -> Runner:
        """Open a built engine for inference.

        Raises:
            EngineNotRunnable: This device or runtime cannot run the engine; the search
                records the trial as ``build-only``.
        """
        raise NotImplementedError

    def evaluate(self, model: Any, feeds: list[Feed], weights: Path | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
        """Run an ``onnx.ModelProto`` as the FP32 reference on each feed; all outputs.

        One mapping per feed, in order, each produced when it is asked for: a model with
        every intermediate tensor as an output gives hundreds of MB per feed (212 MB for
        PP-OCRv4's recogniser), so a caller that reduces each feed's outputs before it
        asks for the next holds one feed's at a time. Errors are raised while iterating.

        Args:
            model: The model.
            feeds: Input sets, name to array.
            weights: The folder its external data locations are relative to (a model
                over 2 GiB, `routetune.model.weights`); None when it holds its data.

        Raises:
            BackendError: This backend cannot serve as the reference.
        """
        raise BackendError(f"backend '{self.name}' cannot compute reference outputs")

    def run_on_device(self, model: Any, feeds: list[Feed], weights: Path | None = None
                      ) -> Iterator[dict[str, np.ndarray]]:
        """Run an ``onnx.ModelProto`` on this backend's device, with its defaults; all outputs.

        For a model the FP32 reference cannot run: ``precision-repair`` ranks a bfloat16
        model's nodes here when the reference (ONNX Runtime's CPU provider) has no
        bfloat16 kernels. Graph optimisations are off, so that every tensor keeps its name.

        Args: as `evaluate`'s.

        Raises:
            BackendError: This backend cannot run a model outside an engine build.
            Exception: Whatever the runtime raises for a model it cannot run.
        """
        raise BackendError(f"backend '{self.name}' cannot run a model outside an engine")

    def device_memory_used(self) -> int | None:
        """Bytes of device memory in use on this process's GPU now; None on a host device.

        The search reads it before an engine is built and after it was timed: the
        difference is the engine's device memory (`routetune.records.trial.Trial`).
        """
        return None

    def reference(self, model_path: Path) -> Runner:
        """Open `model_path` as the FP32 accuracy reference, with no optimisation.

        Raises:
            BackendError: This backend cannot serve as the reference.
        """
        raise BackendError(f"backend '{self.name}' cannot compute reference outputs")
