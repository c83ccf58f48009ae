from __future__ import annotations

from pathlib import Path

import pytest

from routetune.plugin_manager import load_registry
from routetune.registry import Registry


@pytest.fixture
def registry() -> Registry:
    """A fresh registry of the installed plugins (tests may add to it)."""
    return load_registry()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where example models are cached: $ROUTETUNE_CACHE, or a session temp dir."""
    import os

    env = os.environ.get("ROUTETUNE_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("routetune-cache")
