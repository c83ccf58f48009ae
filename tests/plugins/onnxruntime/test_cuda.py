"""The onnxruntime-cuda backend on a real GPU (skipped, with the reason, elsewhere)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import conv_bn, kv_decoder, matmul_chain, shared_dim
from quick import quick_spec

from routetune.feeds.decoder import DecoderSettings, phase_sets, signature
from routetune.model.loading import prepare
from routetune.option_seasoning import FromParam
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.plugins.onnxruntime.cuda import (
    CUDA_NS,
    CUDA_OPTIONS,
    OnnxRuntimeCudaBackend,
)
from routetune.plugins.onnxruntime.cuda_options import CudaNhwc, flags_beyond_catalog, unaccounted
from routetune.plugins.onnxruntime.cuda_provider import provider_defaults
from routetune.registry import Registry
from routetune.run.tuning import tune
from routetune.seasoning import RouteContext, RouteState
from routetune.timing.measure import MeasureSettings, measure, measure_side_by_side

CUDA = OnnxRuntimeCudaBackend()
WHY = CUDA.available()
gpu = pytest.mark.skipif(WHY is not None, reason=f"onnxruntime-cuda: {WHY}")
QUICK = MeasureSettings(warmup=3, min_runs=20, min_time_s=0.05)


def test_without_a_gpu_the_backend_and_its_seasonings_say_why() -> None:
    if WHY is None:
        pytest.skip("a GPU is here")
    assert "onnxruntime-gpu" in WHY or "CuPy" in WHY or "CUDA" in WHY
    assert CudaNhwc().supports(OnnxRuntimeBackend()) == "applies only to backends onnxruntime-cuda"


@gpu
@pytest.mark.gpu
def test_device_versions_and_provider_options_come_from_the_installed_stack() -> None:
    assert CUDA.device().startswith("cuda: ")
    versions = CUDA.versions()
    assert {"onnxruntime-cuda", "gpu", "cuda_driver", "cuda_runtime", "cupy"} <= set(versions)
    options = CUDA.options()
    assert options["onnxruntime.execution_provider"].default == "CUDAExecutionProvider"
    offered = {k.removeprefix(CUDA_NS) for k in options if k.startswith(CUDA_NS)}
    reported = provider_defaults()
    assert offered == (set(CUDA_OPTIONS) & set(reported)) | set(flags_beyond_catalog(reported))
    assert set(CUDA_OPTIONS) - set(reported) <= {  # newer than onnxruntime-gpu 1.31.1
        "enable_skip_layer_norm_strict_mode"}
    assert unaccounted(reported) == []  # each reported option: searched, a flag, or a reason
    assert options[CUDA_NS + "cudnn_conv_algo_search"].default == "EXHAUSTIVE"


def feeds(n: int, shape: tuple[int, ...]) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
            for i in range(n)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("graph", ["0", "1"])
def test_outputs_match_the_cpu_for_every_input_set(tmp_path: Path, graph: str) -> None:
    path = conv_bn(tmp_path / "m.onnx", batch=2)
    settings = CUDA.full_settings({CUDA_NS + "enable_cuda_graph": graph,
                                   CUDA_NS + "use_tf32": "0"})
    sets = feeds(3, (2, 3, 32, 32))
    with OnnxRuntimeBackend().reference(path) as cpu, CUDA.open(
            CUDA.build(path, settings, tmp_path)) as gpu_runner:
        for _ in range(2):  # a CUDA graph replays: later runs must still read each set
            for feed in sets:
                want, got = cpu.infer(feed)["y"], gpu_runner.infer(feed)["y"]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        calls = [gpu_runner.prepare(f) for f in sets]
        for call in calls:
            assert gpu_runner.timed(call) > 0


@gpu
@pytest.mark.gpu
def test_a_cuda_graph_per_shape_runs_a_decoders_growing_cache(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx")
    model = prepare(path)
    cache = signature(model.inputs, model.outputs, path)
    settings = CUDA.full_settings({CUDA_NS + "enable_cuda_graph": "1",
                                   CUDA_NS + "use_tf32": "0"})
    with OnnxRuntimeBackend().reference(path) as cpu, CUDA.open(
            CUDA.build(path, settings, tmp_path)) as gpu_runner:
        sets = phase_sets(cache, DecoderSettings(cache_tokens=9, generate_tokens=4), cpu.infer)
        for _ in range(2):  # each cache length replays its own graph, not another's
            for feed in sets:
                want, got = cpu.infer(feed), gpu_runner.infer(feed)
                for name in ("logits", "present.1.value"):
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
        assert len(gpu_runner._graphs) == 4
        assert all(gpu_runner.timed(gpu_runner.prepare(f)) > 0 for f in sets)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("graph", ["0", "1"])
def test_a_decoder_fused_with_its_kv_cache_runs_on_cuda_as_on_the_cpu(tmp_path: Path,
                                                                      graph: str) -> None:
    import onnx_graphsurgeon as gs

    from routetune.plugins.onnxruntime.attention_fusion import AttentionFusion

    source = Path(__file__).parents[2] / "data" / "attention" / "decoder_torchscript.onnx"
    state = RouteState(graph=gs.import_onnx(onnx.load(source)))
    assert AttentionFusion()(state, RouteContext(backend=CUDA)).modified
    path = tmp_path / "fused.onnx"
    onnx.save(gs.export_onnx(state.graph), path)
    model = prepare(source)
    cache = signature(model.inputs, model.outputs, source)
    settings = CUDA.full_settings({CUDA_NS + "enable_cuda_graph": graph,
                                   CUDA_NS + "use_tf32": "0"})
    with OnnxRuntimeBackend().reference(source) as cpu, CUDA.open(
            CUDA.build(path, settings, tmp_path)) as gpu_runner:
        sets = phase_sets(cache, DecoderSettings(cache_tokens=9, generate_tokens=3), cpu.infer)
        for feed in sets:  # the unfused model on the CPU against the fused one on CUDA
            want, got = cpu.infer(feed), gpu_runner.infer(feed)
            for name in ("logits", "present.0.key", "present.1.value"):
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.gpu
def test_a_failed_run_raises_without_onnx_runtimes_own_log_line(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = shared_dim(tmp_path / "m.onnx")  # a and b share N: sizes 2 and 3 cannot run
    feed = {"a": np.ones((2, 4), np.float32), "b": np.ones((3, 4), np.float32)}
    with CUDA.open(CUDA.build(path, CUDA.full_settings({}), tmp_path)) as runner:
        capfd.readouterr()
        with pytest.raises(Exception, match="Add"):
            runner.infer(feed)
    assert "onnxruntime" not in capfd.readouterr().err


@gpu
@pytest.mark.gpu
def test_device_compute_time_excludes_the_copies_that_end_to_end_time_includes(
        tmp_path: Path) -> None:
    path = matmul_chain(tmp_path / "m.onnx", depth=2, width=1024, batch=1024)
    runner = CUDA.open(CUDA.build(path, CUDA.full_settings({}), tmp_path))
    sets = feeds(2, (1024, 1024))
    device = measure(runner, sets, QUICK)
    end_to_end = measure(runner, sets, replace(QUICK, latency="end-to-end"))  # 4 MiB in, out
    assert runner.host_copies and device.p50 < end_to_end.p50
    base, again = measure_side_by_side([runner, runner], sets, QUICK)
    assert 0.5 < base.p50 / again.p50 < 2.0
    runner.close()


@gpu
@pytest.mark.gpu
def test_a_gpu_search_finds_fp16_and_records_the_device(registry: Registry,
                                                         tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx", depth=8, width=1024, batch=4096)
    opts = quick_spec(model=model, output=tmp_path / "out", backend="onnxruntime-cuda",
                      seasonings=("fp16", "ort-cuda-graph", "ort-cuda-no-tf32"),
                      search="exhaustive", accuracy="cos>=0.9999,rel_l2<=0.01", measure=QUICK,
                      in_process=False)
    result = tune(opts, registry)
    trials = {t.route: t for t in result.trials}
    assert trials["fp16"].status == "ok", trials["fp16"].reason
    assert trials["fp16"].speedup > 1.0  # FP16 tensor cores and half the memory traffic
    assert trials["base"].versions["gpu"] in result.base.device
    assert "fp16" in result.winner.route
    onnx.checker.check_model(onnx.load(result.files["model"]), full_check=True)


@gpu
@pytest.mark.gpu
def test_every_gpu_trial_records_both_latencies_and_its_device_memory(
        registry: Registry, tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx", depth=4, width=1024, batch=2048)
    for kind in ("device", "end-to-end"):
        opts = quick_spec(model=model, output=tmp_path / kind, backend="onnxruntime-cuda",
                          seasonings=("fp16",), search="exhaustive", max_depth=1,
                          accuracy="cos>=0.999,rel_l2<=0.01",
                          measure=replace(QUICK, latency=kind), in_process=False)
        trials = {t.route: t for t in tune(opts, registry).trials}
        assert set(trials) == {"base", "fp16"}
        for t in trials.values():
            assert t.status == "ok", t.reason
            assert t.latency_kind == kind and t.other_latency is not None
            assert t.device_memory_bytes > 4 << 20  # 4 MiB of FP16 weights at least
        base = trials["base"]  # 8 MiB in and 8 MiB out per run: the copies dominate
        device, host = ((base.latency, base.other_latency) if kind == "device"
                        else (base.other_latency, base.latency))
        assert device.p50 < host.p50, (kind, device.p50, host.p50)


@gpu
@pytest.mark.gpu
def test_bf16_precision_repair_ranks_its_nodes_on_the_gpu(registry: Registry,
                                                          tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "chain.onnx", depth=4, width=256, batch=64)
    opts = quick_spec(model=model, output=tmp_path / "out", backend="onnxruntime-cuda",
                      seasonings=(), routes=("bf16,precision-repair{count=2}",),
                      search="exhaustive", accuracy="cos>=0.9", measure=QUICK,
                      in_process=False)
    trials = {t.route: t for t in tune(opts, registry).trials}
    repaired = trials["bf16,precision-repair{count=2}"]
    assert repaired.status == "ok", repaired.reason  # was build-failed: no CPU bf16 kernels
    step = repaired.passes[-1]
    assert step["stats"]["ranked_on_device"] == 1 and 1 <= step["stats"]["kept_fp32"] <= 2
    assert "ranked on the device (the reference cannot run it" in step["note"]


@gpu
@pytest.mark.gpu
def test_nvml_reads_the_gpu_and_sees_another_process_computing_on_it() -> None:
    import subprocess
    import sys
    import time

    from routetune.timing.conditions import gpu_conditions

    quiet = gpu_conditions("0", set())
    assert "nvml" not in quiet, quiet  # nvidia-ml-py is in the gpu extra
    assert quiet["sm_mhz"] > 0 and quiet["temp_c"] > 0 and "util_pct" in quiet
    hog = subprocess.Popen([sys.executable, "-c",
                            "import cupy as cp\na = cp.random.rand(8192, 8192, dtype=cp.float32)"
                            "\nwhile True:\n    b = a @ a\n    cp.cuda.Device().synchronize()"])
    try:
        time.sleep(4)
        busy = gpu_conditions("0", set())
    finally:
        hog.kill()
        hog.wait()
    assert busy["util_pct"] >= 50 and "GPU 0" in busy["busy"], busy


@gpu
@pytest.mark.gpu
def test_the_cuda_backend_and_its_option_seasonings_keep_the_contract(
        registry: Registry, tmp_path: Path) -> None:
    """routetune.testing on the real CUDA provider: the backend builds, runs and refuses
    an unknown option in one line; each provider-option seasoning is offered exactly
    when the installed provider knows its options, and none sets a key the backend
    never accepts."""
    from routetune.option_seasoning import check_option_keys
    from routetune.plugins.onnxruntime.cuda_options import SEASONINGS
    from routetune.testing import check_backend

    check_backend(registry, "onnxruntime-cuda", matmul_chain(tmp_path / "m.onnx", depth=2,
                                                             width=64, batch=8),
                  tmp_path / "work")
    check_option_keys(registry, CUDA)
    known = CUDA.options()
    for cls in SEASONINGS:
        why = cls().why_not(None, CUDA)
        assert (why is None) == all(key in known for key in cls.sets), (cls.info.name, why)


def test_every_provider_option_is_searched_left_out_with_a_reason_or_a_flag() -> None:
    """The catalog's rules on a provider's report (a newer provider's, made up here: the
    installed one is checked against them on a GPU, below)."""
    from routetune.plugins.onnxruntime.cuda_options import (
        LEFT_OUT,
        SEARCHED,
        SEASONINGS,
        flags_beyond_catalog,
        unaccounted,
    )

    assert not set(SEARCHED) & set(LEFT_OUT) and all(LEFT_OUT.values())
    for cls in SEASONINGS:  # each seasoning sets options of the catalog, to known values
        for key, value in cls.sets.items():
            name = key.removeprefix(CUDA_NS)
            assert name in SEARCHED, name
            assert isinstance(value, FromParam) or value in SEARCHED[name][0], (name, value)
    newer = {"prefer_nhwc": "0", "device_id": "0", "fuse_conv_bias": "0",
             "use_fancy_kernels": "1", "new_pool_size": "1024"}
    assert flags_beyond_catalog(newer) == {"use_fancy_kernels": "1"}
    assert unaccounted(newer) == ["new_pool_size"]


def test_ort_cuda_flag_flips_a_new_providers_flag_and_says_why_when_there_is_none() -> None:
    from routetune.plugins.onnxruntime.cuda_options import cuda_flag_seasoning

    cls = cuda_flag_seasoning({"prefer_nhwc": "0", "use_fancy_kernels": "1", "x_mode": "0"})
    assert cls.info.param("option").choices == ("use_fancy_kernels", "x_mode")
    for option, flipped in (("use_fancy_kernels", "0"), ("x_mode", "1")):
        state = RouteState(graph=None)  # type: ignore[arg-type]  # a build step: no graph
        cls({"option": option})(state, RouteContext(backend=CUDA))
        assert state.settings == {CUDA_NS + option: flipped}
    none = cuda_flag_seasoning({"prefer_nhwc": "0"})
    assert none().supports(CUDA) == ("the installed CUDA provider has no 0/1 option beyond "
                                     "routetune's catalog")
    assert none().supports(OnnxRuntimeBackend()) == (
        "applies only to backends onnxruntime-cuda")


def test_option_seasonings_for_some_operators_say_which_are_missing(tmp_path: Path) -> None:
    import onnx_graphsurgeon as gs

    from routetune.plugins.onnxruntime.cuda_options import CudaFuseConvBias, CudaSdpaKernel

    conv = gs.import_onnx(onnx.load(conv_bn(tmp_path / "c.onnx")))
    chain = gs.import_onnx(onnx.load(matmul_chain(tmp_path / "m.onnx", depth=2, width=8)))
    assert CudaFuseConvBias().applicable(conv, CUDA) is None
    assert CudaFuseConvBias().applicable(chain, CUDA) == "no Conv in the model"
    assert CudaSdpaKernel().applicable(conv, CUDA) == (
        "no Attention or GroupQueryAttention or MultiHeadAttention or PackedAttention or "
        "PackedMultiHeadAttention in the model")


def fp16_stem(path: Path) -> Path:
    """ResNet-50's stem in FP16: x f16[32,3,224,224] -> Conv(64, 7×7, stride 2, bias) -> y."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((64, 3, 7, 7)) * 0.1)
                                     .astype(np.float16), "W"),
             numpy_helper.from_array(rng.standard_normal(64).astype(np.float16), "B")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], strides=[2, 2], pads=[3, 3, 3, 3])],
        "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [32, 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [32, 64, 112, 112])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@gpu
@pytest.mark.gpu
def test_a_provider_failure_at_a_run_is_the_trials_not_a_move_to_the_cpu(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """cuDNN's frontend found no plan for ResNet-50's FP16 stem convolution with its bias
    fused in NCHW (HEURISTIC_QUERY_FAILED, H100, onnxruntime-gpu 1.31.1, 2026-12-06), and
    ONNX Runtime's Python session then moved itself to the CPU provider and ran there:
    a figure of another engine. Whether this cuDNN fails here or not, the run either
    raises or runs on the CUDA provider; it never falls back."""
    path = fp16_stem(tmp_path / "stem.onnx")
    settings = CUDA.full_settings({CUDA_NS + "fuse_conv_bias": "1", CUDA_NS + "prefer_nhwc": "0"})
    feed = {"x": np.ones((32, 3, 224, 224), np.float32)}
    with CUDA.open(CUDA.build(path, settings, tmp_path)) as runner:
        capfd.readouterr()
        try:
            runner.infer(feed)
        except Exception as e:  # noqa: BLE001 - a provider failure is the trial's to record
            assert "CUDNN" in str(e) or "EP" in str(e), e
        assert runner.session.get_providers()[0] == "CUDAExecutionProvider"
    assert "Falling back" not in capfd.readouterr().out
