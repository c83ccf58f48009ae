"""A real third-party plugin distribution, pip-installed into the test environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from graphs import conv_bn

DEMO = Path(__file__).parent / "thirdparty" / "routetune-demo"


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def demo_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    source = tmp_path_factory.mktemp("demo") / DEMO.name  # builds leave files behind
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("__pycache__"))
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        pip("uninstall", "-y", "routetune-demo")


def routetune(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


def test_third_party_seasoning_is_listed(demo_installed: None) -> None:
    done = routetune("seasonings")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "demo-single-thread" in line)
    assert "demo (routetune-demo 0.1.0)" in row


def test_third_party_seasoning_takes_part_in_a_search(demo_installed: None, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output",
                     str(tmp_path / "out"), "--seasonings", "demo-single-thread",
                     "--search", "exhaustive", "--min-runs", "3", "--min-time", "0.02")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "demo-single-thread" in line)
    assert " ok " in row


def test_disabled_plugin_is_not_loaded(demo_installed: None) -> None:
    done = routetune("seasonings", ROUTETUNE_DISABLE_PLUGINS="demo")
    assert done.returncode == 0
    assert "demo-single-thread" not in done.stdout


def test_broken_plugin_is_one_line_naming_it(demo_installed: None) -> None:
    done = routetune("seasonings", ROUTETUNE_DEMO_BREAK="1")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "routetune: error: plugin 'demo' (routetune-demo 0.1.0) failed to load: routetune_demo "
        "was told to break; disable it with ROUTETUNE_DISABLE_PLUGINS=demo")
