"""The TensorRT API the backend uses exists in TensorRT 11.4, read from its real bindings.

PyPI's ``tensorrt-cu13-bindings==11.4.0.106`` (the test extra) holds TensorRT 11.4's
pybind extension, ``tensorrt_bindings/tensorrt.so``. It cannot be imported here (NVIDIA
serves ``libnvinfer`` from its own index only), so it is read as data: pybind keeps every
name it binds (classes, methods, properties, enum members, argument names given with
``py::arg``) as a C string in the file.

Which names the backend uses as TensorRT API: every attribute name and keyword argument
in plugins/tensorrt/ that TensorRT-RTX's module (installed, importable, the same API
family) also defines. Each must be in TensorRT 11.4's file.

Limits: a name is checked, not its class (``build_route`` on ``IBuilderConfig`` and a
``build_route`` elsewhere look alike), nor types, arity or argument order (pybind builds
signatures at run time; the file holds argument names only, which are checked for the
keywords the backend passes); names that only
TensorRT 11 has and TensorRT-RTX lacks are not found by the scan (they are listed in
`TENSORRT_ONLY` by hand); behaviour is not checked (that takes a GPU and the libraries).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from routetune.plugins.tensorrt.module import find_tensorrt

ROOT = Path(__file__).parents[3]
SPEC = importlib.util.find_spec("tensorrt_bindings")
needs_bindings = pytest.mark.skipif(
    SPEC is None or not SPEC.submodule_search_locations,
    reason="no tensorrt-cu13-bindings here (pip install -e '.[test]')")

TENSORRT_ONLY = {"all_build_routes", "build_route", "get_timing_cache", "create_timing_cache",
                 "set_timing_cache", "combine", "serialize"}
"""Names the backend uses on TensorRT 11 only (build routes, the timing cache), which the
scan cannot find through TensorRT-RTX."""

REMOVED = ("execute_async_v2", "get_binding_index", "build_engine", "set_binding_shape")
"""TensorRT 8/9 API that TensorRT 10 removed: not in 11.4, and not used by the backend."""


@cache
def bound_names() -> tuple[str, str]:
    """TensorRT 11.4's extension as text (its C strings end in NUL), and the Python the
    package adds on top of it (``nptype`` and ``volume`` are defined in Python)."""
    assert SPEC is not None and SPEC.submodule_search_locations
    package = Path(next(iter(SPEC.submodule_search_locations)))
    return ((package / "tensorrt.so").read_bytes().decode("latin-1"),
            (package / "__init__.py").read_text())


def bound(name: str) -> bool:
    """Whether `name` is bound: a string of the extension (alone, or the tail of a merged
    one: the linker stores ``"INPUT"`` inside ``"kINPUT"`` when one ends the other), or a
    function the package defines in Python."""
    extension, python = bound_names()
    return (re.search(re.escape(name) + r"\x00", extension) is not None
            or re.search(rf"^def {re.escape(name)}\(", python, re.MULTILINE) is not None)


def used_by_backend() -> tuple[set[str], set[tuple[str, str]]]:
    """Attribute names (``x.name``, ``getattr(x, "name")``) in plugins/tensorrt/, and the
    keyword arguments of method calls there, as (method, keyword)."""
    attributes: set[str] = set()
    keywords: set[tuple[str, str]] = set()
    for path in (ROOT / "plugins" / "tensorrt").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                attributes.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                keywords.update((node.func.attr, k.arg) for k in node.keywords if k.arg)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                attributes.add(node.args[1].value)
    return attributes, keywords


def rtx_api() -> set[str]:
    """Names TensorRT-RTX's module defines: its classes, their members, enum members."""
    found = find_tensorrt()
    if found.module is None or not found.rtx:
        pytest.skip(f"no TensorRT-RTX module to scan with: {found}")
    names = set(dir(found.module))
    for name in list(names):
        value = getattr(found.module, name)
        if isinstance(value, type):
            names |= set(dir(value))
    return {n for n in names if not n.startswith("_")}


@needs_bindings
def test_every_tensorrt_name_the_backend_uses_is_in_tensorrt_11_4() -> None:
    attributes, _ = used_by_backend()
    api = (attributes & rtx_api()) | (attributes & TENSORRT_ONLY)
    assert len(api) > 40  # the scan sees the backend: builder, config, engine, context
    assert {"execute_async_v3", "set_tensor_address", "build_serialized_network",
            "create_execution_context", "INPUT", "all_build_routes",
            "get_plugin_registry", "load_library"} <= api  # --plugin-library
    missing = sorted(name for name in api if not bound(name))
    assert not missing, f"not in TensorRT 11.4's bindings: {missing}"


@needs_bindings
def test_every_keyword_argument_passed_to_tensorrt_is_bound() -> None:
    """The backend passes TensorRT's arguments by position today; a keyword added to a
    TensorRT call (``execute_async_v3(stream_handle=...)``) must be 11.4's name."""
    _, keywords = used_by_backend()
    api = rtx_api() | TENSORRT_ONLY
    passed = {(method, k) for method, k in keywords if method in api}
    assert not [k for _, k in passed if not bound(k)], passed
    assert bound("stream_handle") and not bound("stream_handel")  # names are checkable


@needs_bindings
def test_the_check_can_fail_removed_api_is_absent_and_unused() -> None:
    attributes, _ = used_by_backend()
    for name in REMOVED:
        assert not bound(name), name  # TensorRT 10 removed it: the file does not bind it
        assert name not in attributes, f"the backend uses {name}, removed in TensorRT 10"
    assert not bound("execute_async_v9")  # a made-up name is not found
