"""Pip-install a test plugin package from tests/thirdparty/ into the test environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

THIRDPARTY = Path(__file__).parent / "thirdparty"


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=300)


@contextmanager
def installed(name: str, workdir: Path) -> Iterator[None]:
    """Install tests/thirdparty/`name` (no deps, no index), and uninstall it afterwards."""
    source = workdir / name  # builds leave files behind: build a copy
    shutil.copytree(THIRDPARTY / name, source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        pip("uninstall", "-y", name)


def routetune(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m routetune ARGS`` in a subprocess; its completed process."""
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})
