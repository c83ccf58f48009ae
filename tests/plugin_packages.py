"""Pip-install a test plugin package from tests/thirdparty/ where a test's processes see it.

`installed` pip-installs it into a folder of its own (``pip install --target``), and
hands back the environment under which a process finds it (``PYTHONPATH``), as a user
who keeps plugins outside the environment would. Nothing else sees it: under ``pytest
-n``, the tests on other workers search with every installed seasoning and must not meet
seasonings made to crash. `installed_in_the_environment` installs into this venv itself,
for a Ray cluster's nodes, which start before a test's environment is known; only a test
that runs alone (``serial``) may use it.
"""

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


def _source(name: str, workdir: Path) -> Path:
    source = workdir / name  # builds leave files behind: build a copy
    shutil.copytree(THIRDPARTY / name, source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    return source


@contextmanager
def installed(name: str, workdir: Path) -> Iterator[dict[str, str]]:
    """Install tests/thirdparty/`name` (no deps, no index) into ``workdir/site``.

    Yields:
        The environment variables under which a process sees it: ``PYTHONPATH`` with
        ``workdir/site`` first. This process does not see it unless a test puts that
        folder on ``sys.path``.
    """
    site = workdir / "site"
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--target",
               str(site), str(_source(name, workdir)))
    assert done.returncode == 0, done.stderr
    yield {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH"))
                                         if p)}


@contextmanager
def installed_in_the_environment(name: str, workdir: Path) -> Iterator[None]:
    """Install tests/thirdparty/`name` into this venv, and uninstall it afterwards."""
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index",
               str(_source(name, workdir)))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        pip("uninstall", "-y", name)
