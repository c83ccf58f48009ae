"""TensorRT integration: the ``tensorrt`` backend, its knobs and its build routes.

The builder knobs (`knobs`) and the ``trt-build-route`` seasoning (`build_route`).

Works with TensorRT 11 or TensorRT-RTX (`module.find_tensorrt`); without either the
backend is registered but unavailable, with the reason, and nothing else changes.
"""

from __future__ import annotations

from routetune import hookimpl
from routetune.plugins.tensorrt import knobs
from routetune.plugins.tensorrt.backend import TensorRtBackend, all_build_routes
from routetune.plugins.tensorrt.build_route import NAME, build_route_seasoning, parse_knobs
from routetune.plugins.tensorrt.module import find_tensorrt
from routetune.registry import Registry
from routetune.seasoning import Seasoning


@hookimpl
def routetune_register_backends(registry: Registry) -> None:
    """Register the ``tensorrt`` backend."""
    registry.add_backend(TensorRtBackend)


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register the builder knobs, and ``trt-build-route``.

    ``trt-build-route`` takes the installed TensorRT's build routes (maybe none); it is
    registered lazily (`_build_route`).
    """
    for cls in knobs.SEASONINGS:
        registry.add_seasoning(cls)
    registry.add_lazy_seasoning(NAME, {"tensorrt"}, _build_route)


def _build_route() -> type[Seasoning]:
    """``trt-build-route`` for the installed TensorRT's knobs.

    Made only when a run uses the ``tensorrt`` backend or names the seasoning: reading
    the knobs imports TensorRT and creates a builder config, which a run on another
    backend, and its workers, never do.
    """
    module = find_tensorrt()
    return build_route_seasoning(parse_knobs(all_build_routes(module)), str(module))
