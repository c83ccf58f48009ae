"""ONNX Runtime integration: registers the ``onnxruntime`` backend."""

from __future__ import annotations

from routetune import hookimpl
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.registry import Registry


@hookimpl
def routetune_register_backends(registry: Registry) -> None:
    """Register the ONNX Runtime backend."""
    registry.add_backend(OnnxRuntimeBackend)
