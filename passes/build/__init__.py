"""Built-in build seasonings: backend options, one module per backend."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.build import ort_cuda, ort_session, trt
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the ONNX Runtime session, CUDA provider and TensorRT builder seasonings.

    ``trt-build-route`` is registered by the TensorRT plugin, which reads its knobs.
    """
    for cls in ort_session.SEASONINGS + ort_cuda.SEASONINGS + trt.SEASONINGS:
        registry.add_seasoning(cls)
