"""The ``openvino`` backend with real OpenVINO compilation on this CPU."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from graphs import conv_bn, kv_decoder, matmul_chain

from routetune.errors import BackendError, BuildError
from routetune.feeds.decoder import DecoderSettings, phase_sets, signature
from routetune.feeds.profile import ShapeProfile, make_profile
from routetune.install import pip_install
from routetune.model.loading import prepare
from routetune.option_seasoning import check_option_keys
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.openvino.backend import CACHE, OpenVinoBackend
from routetune.plugins.openvino.installed import core, cpu_facts
from routetune.plugins.openvino.properties import (
    LEFT_OUT,
    NS,
    SEARCHED,
    SEASONINGS,
    OvCoreType,
    hybrid_cpu,
    precision_seasoning,
)
from routetune.registry import Registry
from routetune.seasoning import RouteContext, RouteState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                reason="openvino is not installed: "
                                       + pip_install("openvino"))


def rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("make", ["conv_bn", "matmul_chain"])
def test_a_compiled_model_matches_the_onnx_runtime_reference(tmp_path: Path, make: str) -> None:
    if make == "conv_bn":  # dynamic batch: reshaped to the profile's range
        model = conv_bn(tmp_path / "m.onnx")
        profile = ShapeProfile({"x": ((1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))})
        feed = {"x": np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)}
    else:
        model = matmul_chain(tmp_path / "m.onnx", depth=3, width=64, batch=8)
        profile = None
        feed = {"x": np.random.default_rng(0).standard_normal((8, 64), dtype=np.float32)}
    backend = OpenVinoBackend(profile)  # f32: the CPU's default may be bf16
    engine = backend.build(model, backend.full_settings({NS + "INFERENCE_PRECISION_HINT": "f32"}),
                           tmp_path / "artifacts")
    with backend.open(engine) as runner, OnnxRuntimeBackend().reference(model) as ref:
        got, want = runner.infer(feed), ref.infer(feed)
        call = runner.prepare(feed)
        call()
        assert runner.timed(call) > 0
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape
        assert rel_l2(got[name], want[name]) < 1e-5, name
    if profile is not None:  # compiled for the profile's range, 1 to 4
        shape = engine.handle.model.inputs[0].get_partial_shape()
        assert str(shape) == "[1..4,3,32,32]"
        with backend.open(engine) as runner, OnnxRuntimeBackend().reference(model) as ref:
            for batch in (1, 4):  # the whole range runs, as a TensorRT profile's does
                x = {"x": np.random.default_rng(batch).random((batch, 3, 32, 32),
                                                               dtype=np.float32)}
                assert rel_l2(runner.infer(x)["y"], ref.infer(x)["y"]) < 1e-5


def test_a_decoders_decode_steps_run_against_a_growing_cache(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx")
    model = prepare(path)
    cache = signature(model.inputs, model.outputs, path)
    with OnnxRuntimeBackend().reference(path) as ref:
        sets = phase_sets(cache, DecoderSettings(cache_tokens=9, generate_tokens=4), ref.infer)
        shapes = {n: tuple(sets[0][n].shape) for n in sets[0]}
        profile = make_profile(model.inputs, shapes, None, None, sets)
        backend = OpenVinoBackend(profile)
        engine = backend.build(path, backend.full_settings(
            {NS + "INFERENCE_PRECISION_HINT": "f32"}), tmp_path / "artifacts")
        with backend.open(engine) as runner:
            for feed in sets:  # caches of 9 to 12: one engine for the whole range
                assert rel_l2(runner.infer(feed)["logits"], ref.infer(feed)["logits"]) < 1e-5


def test_properties_reach_the_compiled_model_and_the_cache_serves_a_second_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTETUNE_CACHE", str(tmp_path / "cache"))
    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=32, batch=4)
    backend = OpenVinoBackend()
    settings = backend.full_settings({NS + "INFERENCE_NUM_THREADS": 1,
                                      NS + "ENABLE_CPU_PINNING": "NO"})
    first = backend.build(model, settings, tmp_path / "artifacts")
    compiled = first.handle.model
    assert compiled.get_property("LOADED_FROM_CACHE") is False
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
    assert str(compiled.get_property("PERFORMANCE_HINT")).endswith("LATENCY")
    cache = tmp_path / "cache" / CACHE  # the user's cache, never the output folder
    assert not (tmp_path / "artifacts").exists() or not list(
        (tmp_path / "artifacts").rglob("*.blob"))
    blobs = {p: p.stat().st_mtime_ns for p in cache.glob("*.blob")}
    assert len(blobs) == 1
    again = backend.build(model, settings, tmp_path / "artifacts").handle.model
    assert again.get_property("LOADED_FROM_CACHE") is True
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.blob")} == blobs
    # Run-time properties (threads, pinning) are not part of the blob: a route that
    # differs only in them imports the same blob, with its own properties applied.
    other = backend.build(model, backend.full_settings({}), tmp_path / "artifacts").handle.model
    assert other.get_property("LOADED_FROM_CACHE") is True
    assert other.get_property("INFERENCE_NUM_THREADS") != 1 or os.cpu_count() == 1
    # a blob import keeps the partitioner it was compiled with: such a route compiles anew
    auto = backend.build(model, backend.full_settings({NS + "TBB_PARTITIONER": "AUTO"}),
                         tmp_path / "artifacts").handle.model
    assert auto.get_property("LOADED_FROM_CACHE") is False
    assert str(auto.get_property("TBB_PARTITIONER")).endswith("AUTO")


def test_an_engines_identity_is_its_weights_layers_and_resolved_properties_its_kernels_less_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    monkeypatch.setenv("ROUTETUNE_CACHE", str(tmp_path / "cache"))
    model = conv_bn(tmp_path / "m.onnx")
    backend = OpenVinoBackend()

    kernels: dict[str, str] = {}

    def build(path: Path, **options: object) -> tuple[str, object]:
        engine = backend.build(path, backend.full_settings(
            {NS + k: v for k, v in options.items()}), tmp_path / "artifacts")
        kernels[engine.sha256] = engine.kernels
        return engine.sha256, engine.handle.model

    base, compiled = build(model)
    assert len(base) == len(kernels[base]) == 64 and kernels[base] != base
    threads = compiled.get_property("INFERENCE_NUM_THREADS")
    # the same compile again, from OpenVINO's cache: one engine
    again, imported = build(model)
    assert imported.get_property("LOADED_FROM_CACHE") is True and again == base
    # a property set to the value OpenVINO resolved it to already: one engine
    assert build(model, INFERENCE_NUM_THREADS=threads)[0] == base
    # one it resolves otherwise, or another precision: another engine, other kernels
    fewer = build(model, INFERENCE_NUM_THREADS=1 if threads != 1 else 2)[0]
    assert fewer != base and kernels[fewer] != kernels[base]
    assert build(model, INFERENCE_PRECISION_HINT="f32")[0] != base or (
        str(compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>")
    # the same layers on other weights: another engine
    proto = onnx.load(model)
    weight = proto.graph.initializer[0]
    values = onnx.numpy_helper.to_array(weight).copy()
    values.flat[0] += 1.0
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    other = tmp_path / "other.onnx"
    onnx.save(proto, other)
    changed = build(other)[0]
    assert changed != base
    # ... running the same kernels, so equally fast (`Engine.kernels`)
    assert kernels[changed] == kernels[base]


def test_bad_options_and_bad_models_are_one_line_errors(tmp_path: Path) -> None:
    backend = OpenVinoBackend()
    with pytest.raises(BackendError, match="option 'openvino.PERFORMANCE_HINT': bad value "
                                           "'FAST'; allowed: LATENCY|THROUGHPUT"):
        backend.full_settings({NS + "PERFORMANCE_HINT": "FAST"})
    with pytest.raises(BackendError, match="unknown option 'openvino.NUM_STREAM' for backend "
                                           "'openvino'"):
        backend.full_settings({NS + "NUM_STREAM": 2})
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(BuildError) as e:
        backend.build(tmp_path / "bad.onnx", backend.full_settings({}), tmp_path / "a")
    assert str(e.value).startswith("OpenVINO refused the model: ")
    assert "\n" not in str(e.value)


def test_versions_and_device_name_the_cpu_and_its_capabilities() -> None:
    backend = OpenVinoBackend()
    facts = cpu_facts()
    versions = backend.versions()
    assert versions["openvino"] == backend.version() and versions["openvino"][:4].isdigit()
    assert versions["openvino_cpu"] == facts.name
    assert "FP32" in versions["openvino_capabilities"].split(",")
    assert backend.device().startswith(f"cpu: {facts.name} (")
    assert backend.dtype_support("float16") is None
    assert "does not compute in float8e4m3fn" in str(backend.dtype_support("float8e4m3fn"))
    assert backend.emulates("float16", backend.full_settings({}))
    assert not backend.emulates("float16", {NS + "INFERENCE_PRECISION_HINT": "f16"})


def test_every_writable_cpu_property_is_searched_or_left_out_with_a_reason() -> None:


    reported = core().get_property("CPU", "SUPPORTED_PROPERTIES")
    writable = {name for name, mode in reported.items() if "W" in str(mode)}
    assert not set(SEARCHED) & set(LEFT_OUT) and all(LEFT_OUT.values())
    assert sorted(writable - set(SEARCHED) - set(LEFT_OUT)) == []
    options = OpenVinoBackend().options()
    assert {key.removeprefix(NS) for key in options} == set(SEARCHED)
    for cls in (*SEASONINGS,):
        for key in cls.sets:
            assert key in options, (cls.info.name, key)


def test_the_property_names_are_openvinos_own() -> None:
    import openvino.properties as props
    import openvino.properties.hint as hint
    import openvino.properties.intel_cpu as intel_cpu
    import openvino.properties.streams as streams

    names = {hint.performance_mode(), streams.num(), props.inference_num_threads(),
             hint.enable_cpu_pinning(), hint.enable_hyper_threading(),
             hint.scheduling_core_type(), hint.inference_precision(), "TBB_PARTITIONER",
             intel_cpu.denormals_optimization()}
    assert names == set(SEARCHED)
    assert {m for m in hint.PerformanceMode.__members__} >= {"LATENCY", "THROUGHPUT"}
    assert set(hint.SchedulingCoreType.__members__) == {"ANY_CORE", "PCORE_ONLY", "ECORE_ONLY"}
    assert set(props.intel_cpu.TbbPartitioner.__members__) == {"STATIC", "AUTO"}


def test_each_option_seasoning_sets_what_it_says_and_is_offered_on_openvino_only(
        registry: Registry) -> None:
    backend = OpenVinoBackend()
    check_option_keys(registry, backend)
    for cls in SEASONINGS:
        why = cls().why_not(None, backend)
        assert why is None or (cls is OvCoreType and not hybrid_cpu()), (cls.info.name, why)
        assert cls().supports(OnnxRuntimeBackend()) == "applies only to backends openvino"
        state = RouteState(graph=None)  # type: ignore[arg-type]  # a build step: no graph
        cls()(state, RouteContext(backend=backend))
        backend.full_settings(state.settings)  # every value is one the backend takes
    if not hybrid_cpu():
        assert OvCoreType().supports(backend) == "not a hybrid CPU: every core is of one type"


def test_ov_precision_offers_only_the_types_this_cpu_computes(registry: Registry) -> None:
    facts = cpu_facts()
    cls = registry.seasoning("ov-precision")
    offered = cls.info.params[0].choices if cls.info.params else ()
    for name, capability in (("bf16", "BF16"), ("f16", "FP16")):
        if capability not in facts.capabilities:
            assert name not in offered
            assert cls.left_out[name] == (
                f"{facts.name} does not compute {capability} natively "
                f"(OPTIMIZATION_CAPABILITIES: {', '.join(facts.capabilities)})")
            if offered:
                assert f"not {name}: {facts.name} does not compute" in cls.info.summary
        elif name != facts.default_precision:
            assert name in offered
    if not offered:  # an AVX2 CPU: f32 is the default, nothing else is native
        why = cls().supports(OpenVinoBackend())
        assert why is not None and "bf16: " in why and "f16: " in why


def test_precision_choices_follow_the_capabilities_and_the_default() -> None:
    sapphire = precision_seasoning(("FP32", "BF16", "FP16", "INT8"), "bf16", "Xeon")
    assert sapphire.info.param("type").choices == ("f32", "f16")
    assert sapphire.left_out == {"bf16": "OpenVINO's default on Xeon: the base route "
                                         "computes in it"}
    avx512 = precision_seasoning(("FP32", "BF16", "INT8"), "f32", "Xeon")
    assert avx512.info.param("type").choices == ("bf16",)
    assert set(avx512.left_out) == {"f32", "f16"}
    assert "not f16: Xeon does not compute FP16 natively" in avx512.info.summary
    state = RouteState(graph=None)  # type: ignore[arg-type]
    avx512({"type": "bf16"})(state, RouteContext(backend=OpenVinoBackend()))
    assert state.settings == {NS + "INFERENCE_PRECISION_HINT": "bf16"}
    avx2 = precision_seasoning(("FP32", "INT8"), "f32", "EPYC")
    assert avx2.info.params == ()
    assert avx2().supports(OpenVinoBackend()) == (
        "f32: OpenVINO's default on EPYC: the base route computes in it; bf16: EPYC does "
        "not compute BF16 natively (OPTIMIZATION_CAPABILITIES: FP32, INT8); f16: EPYC does "
        "not compute FP16 natively (OPTIMIZATION_CAPABILITIES: FP32, INT8)")


def test_the_backend_keeps_the_contract(registry: Registry, tmp_path: Path) -> None:
    from routetune.testing import check_backend

    check_backend(registry, "openvino", matmul_chain(tmp_path / "m.onnx", depth=2, width=32,
                                                     batch=4), tmp_path / "work")



def test_int8_qdq_runs_in_int8_on_openvino(tmp_path: Path) -> None:
    # ONNX Runtime's quantizer writes Q/DQ pairs; OpenVINO's ONNX frontend reads them as
    # FakeQuantize, and its CPU plugin runs the quantized layers in INT8
    import openvino as ov

    import routetune

    model = conv_bn(tmp_path / "m.onnx", batch=4)
    result = routetune.tune(model, backend="openvino", routes=["int8-qdq"], seasonings=[],
                            accuracy="rel_l2<=0.2", output=tmp_path / "out", min_time_s=0.1,
                            busy_machine="ignore", keep="all", in_process=True)
    trial = next(t for t in result.trials if t.route == "int8-qdq")
    assert trial.status == "ok", trial.reason
    assert trial.passes[-1]["stats"]["quantized_nodes"] >= 1, trial.passes
    compiled = ov.Core().compile_model(str(tmp_path / "out" / trial.artifact), "CPU")
    precisions = {op.get_rt_info()["runtimePrecision"].astype(str)
                  for op in compiled.get_runtime_model().get_ops()}
    assert precisions & {"i8", "u8"}, precisions  # some layers compute in INT8
