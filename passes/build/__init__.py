"""Built-in build seasonings: backend options, one module per backend."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.build import ort_cuda, ort_session
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the ONNX Runtime session and CUDA provider seasonings."""
    for cls in ort_session.SEASONINGS + ort_cuda.SEASONINGS:
        registry.add_seasoning(cls)
