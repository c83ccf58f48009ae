"""Built-in build seasonings: backend options, one module per backend."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.build import ort_session
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the ONNX Runtime session seasonings."""
    for cls in ort_session.SEASONINGS:
        registry.add_seasoning(cls)
