"""The tensorrt backend's build path, against the real TensorRT-RTX builder (no GPU needed).

Engines that must run are under ``@pytest.mark.gpu`` and skip, with the reason, where
no GPU and runtime that accepts them exist.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tensorrt_helpers import PROFILE, TRT, conv, needs_trt, settings

from routetune.candidate.artifacts import build_engine
from routetune.errors import BuildError, EngineNotRunnable
from routetune.feeds.profile import ShapeProfile
from routetune.plugins.tensorrt.backend import (
    NS,
    TensorRtBackend,
    _gpu,
    all_build_routes,
    make_runtime,
)
from routetune.plugins.tensorrt.loaders import configure
from routetune.plugins.tensorrt.logger import make_logger

pytestmark = needs_trt


def test_discovery_reports_the_module_and_version() -> None:
    backend = TensorRtBackend(PROFILE)
    assert backend.available() is None
    assert TRT.name in ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings")
    assert backend.version() == f"{TRT.name} {TRT.version}"
    assert backend.versions()["tensorrt_module"] == TRT.name
    assert backend.versions()["tensorrt"] == TRT.version


def test_parser_errors_name_the_node_and_the_operator(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="fine"),
                               helper.make_node("FooBar", ["r"], ["y"], name="mystery")],
                              "bad", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "bad.onnx")
    backend = TensorRtBackend(ShapeProfile({}))
    with pytest.raises(BuildError) as err:
        backend.build(tmp_path / "bad.onnx", settings(backend), tmp_path)
    text = str(err.value)
    assert text.startswith("TensorRT's ONNX parser refused the model: node 'mystery' (FooBar)")
    assert text.endswith("operators it cannot take: FooBar")


def test_profile_is_required_for_dynamic_inputs_and_recorded(tmp_path: Path) -> None:
    model = conv(tmp_path / "m.onnx")
    bare = TensorRtBackend(ShapeProfile({}))
    with pytest.raises(BuildError, match="input 'x' dimension 0 is dynamic and the profile "
                                         "has no shapes for it"):
        bare.build(model, settings(bare), tmp_path)
    backend = TensorRtBackend(PROFILE)
    full = settings(backend)
    assert full[NS + "profile"] == "x:1x3x32x32/2x3x32x32/4x3x32x32"
    engine = backend.build(model, full, tmp_path)
    assert engine.size_bytes > 100_000 and engine.settings[NS + "profile"] == str(PROFILE)
    assert ShapeProfile.parse(str(PROFILE)) == PROFILE


def test_config_knobs_are_set_and_read_back(tmp_path: Path) -> None:
    trt = TRT.module
    backend = TensorRtBackend(PROFILE)
    config = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    configure(trt, config, settings(backend, builder_optimization_level=0,
                                    tiling_optimization_level="full", max_aux_streams=2,
                                    tf32=False))
    assert config.builder_optimization_level == 0
    assert config.tiling_optimization_level == trt.TilingOptimizationLevel.FULL
    assert config.max_aux_streams == 2
    assert not config.get_flag(trt.BuilderFlag.TF32)
    defaults = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    assert backend.options()[NS + "builder_optimization_level"].default == \
        defaults.builder_optimization_level
    assert backend.options()[NS + "tf32"].default == defaults.get_flag(trt.BuilderFlag.TF32)


def _differing(a: bytes, b: bytes) -> set[int]:
    x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    if len(x) != len(y):
        return {-1}
    return set(np.nonzero(x != y)[0].tolist())


def test_engines_are_nonempty_and_differ_when_options_differ(tmp_path: Path) -> None:
    """Two builds with the same options differ only in a per-build id (a few bytes);
    TF32 off changes the plan beyond those bytes."""
    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    a = backend.build(model, settings(backend), tmp_path).handle
    again = backend.build(model, settings(backend), tmp_path).handle
    no_tf32 = backend.build(model, settings(backend, tf32=False), tmp_path).handle
    assert len(a) > 100_000
    build_id = _differing(a, again)
    assert len(build_id) <= 8
    assert _differing(a, no_tf32) - build_id


def test_plans_are_kept_by_fingerprint_and_reused(tmp_path: Path) -> None:
    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    first = backend.build(model, settings(backend), tmp_path, key="f" * 64)
    plan = tmp_path / "engines" / f"{'f' * 64}.plan"
    assert first.path == plan and plan.read_bytes() == first.handle
    stamp = plan.stat().st_mtime_ns
    second = backend.build(model, settings(backend), tmp_path, key="f" * 64)
    assert second.handle == first.handle and plan.stat().st_mtime_ns == stamp
    conv(model, dims=["N", 3, 32, 32])  # the same model written again: still reused
    assert backend.build(model, settings(backend), tmp_path, key="f" * 64).handle == first.handle
    # another candidate under the same key (a seasoning changed): rebuilt, not reused
    model.write_bytes(model.read_bytes().replace(b"relu0", b"relu9"))
    rebuilt = backend.build(model, settings(backend), tmp_path, key="f" * 64)
    assert plan.stat().st_mtime_ns != stamp and rebuilt.handle != first.handle


def test_a_kept_plan_is_opened_only_when_its_trial_recorded_its_hash(tmp_path: Path) -> None:
    # Security issue: a plan in a results folder is deserialised only when its sha256 is
    # the one its trial recorded; the sidecar (what it was built from) cannot vouch for
    # it, since whoever edits the plan can edit the sidecar too.
    import hashlib

    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    key, full = "e" * 64, settings(backend)
    plan = tmp_path / "engines" / f"{key}.plan"
    built = build_engine(backend, model, full, tmp_path, key, "")
    assert not built.reused and built.sha256 == hashlib.sha256(plan.read_bytes()).hexdigest()
    again = build_engine(backend, model, full, tmp_path, key, built.sha256)
    assert again.reused and again.handle == built.handle  # recorded: taken as kept
    plan.write_bytes(b"a plan someone planted")  # the sidecar still matches the model
    assert backend.build(model, full, tmp_path, key).reused  # the backend alone takes it
    rebuilt = build_engine(backend, model, full, tmp_path, key, built.sha256)
    assert not rebuilt.reused and rebuilt.handle != b"a plan someone planted"
    assert plan.read_bytes() == rebuilt.handle
    unrecorded = build_engine(backend, model, full, tmp_path, key, "")  # no record: built
    assert not unrecorded.reused


def test_plans_never_run_host_code_and_are_not_version_compatible(tmp_path: Path) -> None:
    # Host code embedded in a plan (plugins, a lean runtime) would run on deserialising.
    trt = TRT.module
    assert make_runtime(trt, make_logger(trt)).engine_host_code_allowed is False
    backend = TensorRtBackend(PROFILE)
    config = trt.Builder(make_logger(trt)).create_builder_config()
    configure(trt, config, settings(backend))
    assert not config.get_flag(trt.BuilderFlag.VERSION_COMPATIBLE)


def test_timing_cache_is_saved_per_output_directory_and_reloaded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="routetune.plugins.tensorrt.loaders")
    """The cache file is written after a build and read before the next one.

    TensorRT says when it cannot load the file, and the build goes on from an empty
    cache that is then saved. A saved cache loads silently where a GPU exists; without
    one, TensorRT-RTX cannot deserialize any cache (it needs a CUDA context), and
    TensorRT-RTX does no autotuning, so its cache holds no timings anyway.
    """
    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    cache = tmp_path / "engines" / "timing.cache"
    backend.build(model, settings(backend), tmp_path, key="a" * 64)
    saved = cache.read_bytes()
    assert len(saved) > 0
    cache.write_bytes(b"not a cache" * 10)
    backend.build(model, settings(backend, builder_optimization_level=2), tmp_path,
                  key="c" * 64)
    assert f"{TRT} could not load the timing cache {cache}" in caplog.text
    assert cache.read_bytes()[:8] == saved[:8]  # a real cache again
    if _gpu():
        caplog.clear()
        backend.build(model, settings(backend, builder_optimization_level=4), tmp_path,
                      key="b" * 64)
        assert "could not load the timing cache" not in caplog.text


@pytest.mark.skipif(not TRT.rtx, reason="TensorRT 11.1+ has build routes; this pins RTX")
def test_tensorrt_rtx_has_no_build_routes_and_rejects_knobs(tmp_path: Path,
                                                            registry) -> None:  # noqa: ANN001
    assert all_build_routes(TRT) == ""
    backend = TensorRtBackend(PROFILE)
    reason = registry.seasoning("trt-build-route")().supports(backend)
    assert f"{TRT} has no Global Performance Tuner (config.all_build_routes is empty" in reason
    with pytest.raises(BuildError, match=r"TensorRT rejected the build route "
                                         r"'-slice_fusion=off' \(read back ''\)"):
        backend.build(conv(tmp_path / "m.onnx"), settings(backend,
                      build_route="-slice_fusion=off"), tmp_path)


@pytest.mark.skipif(bool(_gpu()), reason="this machine has a GPU; see the gpu tests")
def test_without_a_gpu_engines_are_build_only(tmp_path: Path) -> None:
    backend = TensorRtBackend(PROFILE)
    engine = backend.build(conv(tmp_path / "m.onnx"), settings(backend), tmp_path)
    with pytest.raises(EngineNotRunnable, match="no CUDA GPU here"):
        backend.open(engine)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU (CuPy) here")
def test_on_a_gpu_the_engine_runs_or_the_runtime_says_why(tmp_path: Path) -> None:
    """TensorRT 11 on a supported GPU runs the engine and matches ONNX Runtime; where the
    runtime refuses the device (TensorRT-RTX on compute capability 9.0) the backend
    raises EngineNotRunnable with the runtime's own message."""
    import onnxruntime as ort

    backend = TensorRtBackend(PROFILE)
    model = conv(tmp_path / "m.onnx")
    engine = backend.build(model, settings(backend), tmp_path)
    try:
        runner = backend.open(engine)
    except EngineNotRunnable as e:
        assert TRT.rtx and "runtime refused the engine" in str(e), str(e)
        assert "Error Code" in str(e) or "compute capability" in str(e), str(e)
        pytest.skip(f"runtime refuses this GPU (asserted): {e}")
    feed = {"x": np.random.default_rng(1).random((2, 3, 32, 32), dtype=np.float32)}
    with runner:
        got = runner.infer(feed)["y"]
        call = runner.prepare(feed)
        times = [runner.timed(call) for _ in range(5)]
    want = ort.InferenceSession(str(model)).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
    assert all(t > 0 for t in times)


def test_int8_qdq_for_tensorrt_keeps_biases_fp32_and_builds(tmp_path: Path,
                                                            registry) -> None:  # noqa: ANN001
    """ONNX Runtime's quantizer writes INT32 biases by default; TensorRT's parser refuses
    them ("input has type Int32 but must have type FP8, FP4, Int4, Int8"), as the PP-OCR
    benchmark showed. For this backend the seasoning leaves biases in FP32."""
    import onnx_graphsurgeon as gs

    from routetune.seasoning import RouteContext, RouteState

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], rng.random(216)),
             helper.make_tensor("b", TensorProto.FLOAT, [8], rng.random(8))]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv0",
                                                pads=[1, 1, 1, 1])], "conv", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    backend = TensorRtBackend(ShapeProfile({}))
    feeds = ({"x": rng.random((2, 3, 32, 32)).astype(np.float32)},)
    state = RouteState(gs.import_onnx(model))
    result = registry.seasoning("int8-qdq")()(state, RouteContext(backend, feeds))
    assert "biases kept in FP32" in result.note
    quantized = gs.export_onnx(state.graph)
    dq_inputs = {n.input[0] for n in quantized.graph.node if n.op_type == "DequantizeLinear"}
    types = {i.name: i.data_type for i in quantized.graph.initializer}
    assert all(types.get(name, TensorProto.INT8) == TensorProto.INT8 for name in dq_inputs)
    onnx.save(quantized, tmp_path / "q.onnx")
    engine = backend.build(tmp_path / "q.onnx", backend.full_settings({}), tmp_path)
    assert engine.size_bytes > 0

    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

    for_cpu = RouteState(gs.import_onnx(model))  # the CPU's Q/DQ model: INT32 biases
    registry.seasoning("int8-qdq")()(for_cpu, RouteContext(OnnxRuntimeBackend(), feeds))
    onnx.save(gs.export_onnx(for_cpu.graph), tmp_path / "cpu.onnx")
    with pytest.raises(BuildError, match="input has type Int32 but must have type"):
        backend.build(tmp_path / "cpu.onnx", backend.full_settings({}), tmp_path)


def test_the_base_pipeline_names_paddles_unknown_dims_apart(tmp_path: Path) -> None:
    """Paddle2ONNX writes x[-1,3,?,?]; TensorRT treats dims that share a name as equal,
    so 48x192 contradicts itself and the build fails. routetune's base pipeline
    (`routetune.model.loading.sanitize`) names each unknown dimension apart; then it builds."""
    from routetune.model.loading import prepare

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng(0).random(108).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, "?", "?"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    raw, prepared = tmp_path / "raw.onnx", tmp_path / "prepared.onnx"
    onnx.save(model, raw)
    prepared.write_bytes(prepare(raw).data)
    backend = TensorRtBackend(ShapeProfile({"x": ((1, 3, 48, 192),) * 3}))
    with pytest.raises(BuildError, match="could not build the engine: .*different constant "
                                         "values"):
        backend.build(raw, backend.full_settings({}), tmp_path)
    assert backend.build(prepared, backend.full_settings({}), tmp_path).size_bytes > 0


def test_a_failure_message_is_tensorrts_error_not_its_routine_warnings() -> None:

    trt = TRT.module
    logger = make_logger(trt)
    logger.log(trt.ILogger.Severity.WARNING, "nbStreams -1 should not be negative")
    logger.log(trt.ILogger.Severity.INFO, "detail nobody needs")
    assert logger.errors() == "nbStreams -1 should not be negative"  # nothing better
    logger.log(trt.ILogger.Severity.ERROR, "IBuilder::buildSerializedNetwork: Error Code 4:\n"
               "  Internal Error (no implementation for node relu0)")
    logger.log(trt.ILogger.Severity.WARNING, "another routine warning")
    assert logger.errors() == ("IBuilder::buildSerializedNetwork: Error Code 4: Internal "
                               "Error (no implementation for node relu0)")


def test_a_candidate_with_external_data_is_parsed_from_its_file(tmp_path: Path) -> None:
    # Real-models issue, kind 4: TensorRT parses a candidate by path (parse_from_file),
    # so its weights are read from the run's store next to it, as ONNX Runtime reads them
    from routetune.model.weights import externalize

    store = tmp_path / "artifacts" / "models"
    store.mkdir(parents=True)
    model = onnx.load(conv(tmp_path / "m.onnx"))
    w = model.graph.initializer[0]  # as raw bytes, as onnx-graphsurgeon exports weights
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w), "w"))
    externalize(model, store, min_bytes=16)
    (weight,) = model.graph.initializer
    assert not weight.HasField("raw_data") and weight.external_data  # in the store
    onnx.save(model, store / "candidate.onnx")
    backend = TensorRtBackend(PROFILE)
    engine = backend.build(store / "candidate.onnx", settings(backend), tmp_path)
    inline = backend.build(tmp_path / "m.onnx", settings(backend), tmp_path / "inline")
    assert engine.size_bytes > 0 and abs(engine.size_bytes - inline.size_bytes) < 4096
    location = next(e.value for e in weight.external_data if e.key == "location")
    (store / location).unlink()  # the data file gone: TensorRT's parser says so, one line
    with pytest.raises(BuildError) as err:
        backend.build(store / "candidate.onnx", settings(backend, builder_optimization_level=2),
                      tmp_path / "again")
    assert "\n" not in str(err.value)


BUILD_WORKER = """
import sys
from pathlib import Path
from routetune.plugins.tensorrt.backend import TensorRtBackend
from routetune.feeds.profile import ShapeProfile

model, workdir, level = sys.argv[1], sys.argv[2], int(sys.argv[3])
backend = TensorRtBackend(ShapeProfile.parse({profile!r}))
options = backend.full_settings({{"tensorrt.builder_optimization_level": level}})
engine = backend.build(Path(model), options, Path(workdir), key=str(level) * 64)
print(engine.size_bytes)
"""


def test_two_build_workers_share_the_timing_cache_without_a_race(tmp_path: Path) -> None:
    """Two processes build at once into one output folder (``--build-workers 2``).

    The cache is read and merged under a lock and replaced through names unique to each
    process, so both builds succeed, no temporary file is left, and the file is one
    whole cache. (TensorRT-RTX keeps no timings, so whether the merged cache has grown
    is for TensorRT 11 on a GPU: with RTX both builds' caches are the same empty one.)
    """
    import subprocess
    import sys

    from routetune.plugins.tensorrt import timing_cache

    model = conv(tmp_path / "m.onnx")
    code = BUILD_WORKER.format(profile=str(PROFILE))
    for _ in range(2):  # twice: the second round merges into the first round's file
        workers = [subprocess.Popen([sys.executable, "-c", code, str(model), str(tmp_path),
                                     str(level)], stdout=subprocess.PIPE, text=True)
                   for level in (1, 2)]
        outs = [w.communicate(timeout=300)[0] for w in workers]
        assert [w.returncode for w in workers] == [0, 0]
        assert all(int(out.split()[-1]) > 0 for out in outs)
    engines = tmp_path / "engines"
    assert not list(engines.glob("*.tmp"))
    cache = (engines / "timing.cache").read_bytes()
    single = tmp_path / "single"
    done = subprocess.run([sys.executable, "-c", code, str(model), str(single), "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert cache[:8] == (single / "engines" / "timing.cache").read_bytes()[:8]
    with timing_cache.locked(engines / "timing.cache"):  # the lock is free again
        pass
