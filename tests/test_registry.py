"""The registry: the FP32 reference is a role a backend takes, not a backend's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from graphs import conv_bn
from plugin_packages import routetune

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
