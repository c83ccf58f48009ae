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
