"""The registry: the FP32 reference is a role a backend takes, not a backend's name;
lazy seasonings are made only when used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from command import routetune_script as routetune
from graphs import conv_bn

from routetune.backend import Backend
from routetune.errors import PluginError, UsageError
from routetune.registry import Registry


class _Plain(Backend):
    name = "plain"


class _Other(Backend):
    name = "other"


def test_one_backend_takes_the_reference_role() -> None:
    registry = Registry()
    with pytest.raises(UsageError, match="no backend takes the FP32 reference role"):
        registry.reference_backend()
    registry.add_backend(_Plain, reference=True)
    assert registry.reference_backend() is _Plain
    with pytest.raises(PluginError, match="'other' .* and backend 'plain' .* both take the "
                                          "FP32 reference role"):
        registry.add_backend(_Other, reference=True)


def test_installed_reference_is_onnxruntime_cpu(registry: Registry) -> None:
    assert registry.reference == "onnxruntime"
    assert registry.reference_backend().name == "onnxruntime"


def test_without_a_reference_backend_tune_is_one_line_exit_2(tmp_path: Path) -> None:
    """With ONNX Runtime's plugin disabled, any backend's run names the missing role
    (it used to fail with "unknown backend 'onnxruntime'"), and writes nothing."""
    model = conv_bn(tmp_path / "m.onnx")
    done = routetune("tune", str(model), "--backend", "tensorrt", "--output",
                     str(tmp_path / "out"), ROUTETUNE_DISABLE_PLUGINS="onnxruntime")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("routetune: error")]
    assert len(errors) == 1 and "FP32 reference role" in errors[0], done.stderr
    assert "ROUTETUNE_DISABLE_PLUGINS" in errors[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_option_seasoning_with_a_misspelled_key_fails_before_the_search(
        registry: Registry, tmp_path: Path) -> None:
    """A plugin's option seasoning is data; a key its backend never accepts is a typo,
    found when a run starts on that backend (one line naming seasoning and plugin), not
    mid-search. A key the installed version lacks is only not applicable."""
    from routetune.option_seasoning import check_option_keys, option_seasoning
    from routetune.seasoning import SeasoningInfo

    typo = option_seasoning("Typo", SeasoningInfo(
        name="ort-typo", stage="build", summary="misspelled", backends=frozenset(
            {"onnxruntime"})), {"onnxruntime.intra_op_num_thread": 1}, "A typo.")
    cpu = registry.backend("onnxruntime")()
    check_option_keys(registry, cpu)  # the built-ins' keys are all known
    registry._current = "typo-plugin"
    registry.add_seasoning(typo)
    with pytest.raises(PluginError, match="seasoning 'ort-typo' of plugin 'typo-plugin' sets "
                                          "option 'onnxruntime.intra_op_num_thread', which "
                                          "backend 'onnxruntime' does not have"):
        check_option_keys(registry, cpu)
    assert "does not know onnxruntime.intra_op_num_thread" in typo().why_not(None, cpu)
    # CUDA provider options are known to the onnxruntime-cuda backend whatever is installed
    cuda = registry.backend("onnxruntime-cuda")()
    assert "onnxruntime.cuda.prefer_nhwc" in cuda.option_keys()


LAZY_CHECK = """
import sys
from pathlib import Path
from routetune.timing.measure import MeasureSettings
from routetune.plugin_manager import load_registry
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune
registry = load_registry()
assert not registry.seasonings["trt-build-route"].made
tune(RunSpec(model=Path(sys.argv[1]), output=Path(sys.argv[2]), shapes="x:1x3x32x32",
             seasonings=("fuse-bn-into-conv",), in_process=True, busy_machine="ignore",
             measure=MeasureSettings(warmup=1, min_runs=3, min_time_s=0.01)), registry)
loaded = sorted(m for m in sys.modules if m.startswith("tensorrt"))
assert not loaded, loaded
assert not registry.seasonings["trt-build-route"].made
print("no tensorrt")
"""


def test_a_cpu_run_never_imports_tensorrt(tmp_path: Path) -> None:
    # Reading TensorRT's build-route knobs imports TensorRT (0.3 s) and creates a
    # builder; the seasoning is registered lazily, so a run on ONNX Runtime, whose
    # workers load the same registry, does neither.
    done = subprocess.run([sys.executable, "-c", LAZY_CHECK, str(conv_bn(tmp_path / "m.onnx")),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no tensorrt"


def test_a_lazy_seasoning_is_made_on_first_use_and_checked(registry: Registry) -> None:
    from routetune.plugins.tensorrt.knobs import TrtTf32

    made: list[str] = []

    def make() -> type:
        made.append("once")
        return registry.seasoning("trt-tf32")

    fresh = Registry()
    fresh.add_lazy_seasoning("trt-tf32", {"tensorrt"}, make)
    assert not fresh.offered_for("trt-tf32", "onnxruntime") and made == []
    assert fresh.offered_for("trt-tf32", "tensorrt") and made == []
    assert fresh.seasoning("trt-tf32") is TrtTf32 and fresh.seasoning("trt-tf32") is TrtTf32
    assert made == ["once"]
    wrong = Registry()
    wrong.add_lazy_seasoning("trt-x", {"tensorrt"}, lambda: TrtTf32)
    with pytest.raises(PluginError, match="made lazy seasoning 'trt-x' as .*TrtTf32"):
        wrong.seasoning("trt-x")
    with pytest.raises(PluginError, match="is registered by both"):
        wrong.add_lazy_seasoning("trt-x", {"tensorrt"}, lambda: TrtTf32)
