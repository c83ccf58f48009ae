"""OpenVINO integration: the ``openvino`` CPU backend and its properties as seasonings.

The CPU properties routetune searches are build seasonings (`properties`), named
``ov-...``; ``nncf-int8`` quantizes with NNCF (`nncf_quantize`), ``nncf-int4`` compresses
MatMul weights to int4 with it (`nncf_weights`); ``ov-precision`` is
registered lazily, since its choices come from the CPU's
capabilities as OpenVINO reports them. Without the openvino package the backend is
registered but unavailable, with the install line, and nothing else changes.
"""

from __future__ import annotations

from routetune import hookimpl
from routetune.plugins.openvino import properties
from routetune.plugins.openvino.backend import OpenVinoBackend
from routetune.plugins.openvino.nncf_quantize import NncfInt8
from routetune.plugins.openvino.nncf_weights import NncfInt4
from routetune.registry import Registry


@hookimpl
def routetune_register_backends(registry: Registry) -> None:
    """Register the ``openvino`` backend."""
    registry.add_backend(OpenVinoBackend)


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the CPU properties, ``nncf-int8``, ``nncf-int4``, ``ov-precision`` (lazily)."""
    for cls in properties.SEASONINGS:
        registry.add_seasoning(cls)
    registry.add_seasoning(NncfInt8)
    registry.add_seasoning(NncfInt4)
    registry.add_lazy_seasoning("ov-precision", properties.OV, properties.make_precision)
