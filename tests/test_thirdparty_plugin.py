"""A real third-party plugin distribution, pip-installed where the command finds it.

`plugin_packages.installed` installs it into a folder of its own, on the ``PYTHONPATH``
of the commands run here, so that tests running at the same time never see it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from command import routetune_script
from graphs import conv_bn
from plugin_packages import installed
from quick import QUICK_FLAGS

DEMO: dict[str, str] = {}
"""The environment under which a process sees routetune-demo (`demo_installed`)."""


@pytest.fixture(scope="module")
def demo_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with installed("routetune-demo", tmp_path_factory.mktemp("demo")) as env:
        DEMO.update(env)
        yield
        DEMO.clear()


def routetune(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m routetune ARGS`` with routetune-demo installed."""
    return routetune_script(*args, **DEMO, **env)


def test_third_party_seasoning_is_listed(demo_installed: None) -> None:
    done = routetune("seasonings")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "demo-single-thread" in line)
    assert "demo (routetune-demo 0.1.0)" in row


def test_third_party_seasoning_takes_part_in_a_search(demo_installed: None, tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    done = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output",
                     str(tmp_path / "out"), "--seasonings", "demo-single-thread",
                     "--search", "exhaustive", *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr
    store = sqlite3.connect(tmp_path / "out" / "trials.sqlite")
    status = dict(store.execute("SELECT route, status FROM trials").fetchall())
    assert status == {"base": "ok", "demo-single-thread": "ok"}
    table = done.stdout.split("accurate routes")[1].split("trials:")[0]
    assert "demo-single-thread" in table  # in the summary of the accurate routes


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


def test_a_ctrl_c_while_a_plugin_imports_stops_as_a_ctrl_c(demo_installed: None) -> None:
    """onnxruntime's extension turns a KeyboardInterrupt in its initialisation into an
    ImportError: a Ctrl-C at start-up was told as a plugin that failed to load (exit 2)."""
    done = routetune("seasonings", ROUTETUNE_DEMO_BREAK="ctrl-c")
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == ("routetune: interrupted (Ctrl-C); every finished trial is "
                                   "stored; run the same command to resume")


@pytest.mark.parametrize(("mode", "says"), [
    ("hook", "plugin 'demo' (routetune-demo 0.1.0) is not a valid routetune plugin: unknown "
             "hook 'routetune_register_seasonnings'"),
    ("register", "plugin 'demo' (routetune-demo 0.1.0) failed while registering its "
                 "seasonings: KeyError: 'demo-single-thread'"),
])
def test_a_plugin_that_breaks_in_registration_is_one_line_naming_it(
        demo_installed: None, mode: str, says: str) -> None:
    done = routetune("seasonings", ROUTETUNE_DEMO_BREAK=mode)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"routetune: error: {says}"), lines[0]
    assert lines[0].endswith("disable it with ROUTETUNE_DISABLE_PLUGINS=demo")


def test_tracing_prints_each_hook_call_with_its_plugin(demo_installed: None) -> None:
    done = routetune("seasonings", ROUTETUNE_TRACE_PLUGINS="1")
    assert done.returncode == 0, done.stderr
    traced = [line for line in done.stderr.splitlines() if line.startswith("routetune: hook")]
    assert "routetune: hook routetune_register_seasonings -> demo" in traced
    assert "routetune: hook routetune_register_backends -> onnxruntime" in traced
    assert len(traced) >= 8  # one line per plugin and hook it implements


def test_the_kit_tests_the_module_it_is_given_not_the_installed_one(
        demo_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """registry_with(module, "demo") replaces the installed plugin named demo, and the
    installed module itself under another name is registered once, under that name."""
    import types

    monkeypatch.syspath_prepend(DEMO["PYTHONPATH"].split(os.pathsep)[0])
    import routetune_demo

    from routetune import SeasoningInfo, hookimpl
    from routetune.testing import registry_with

    module = types.ModuleType("replacement")

    @hookimpl
    def routetune_register_seasonings(registry) -> None:  # noqa: ANN001
        from routetune.seasoning import Seasoning

        class Replacement(Seasoning):
            info = SeasoningInfo(name="replacement", stage="graph", summary="stand-in")

        registry.add_seasoning(Replacement)

    module.routetune_register_seasonings = routetune_register_seasonings  # type: ignore[attr-defined]
    registry = registry_with(module, "demo")
    assert "replacement" in registry.seasonings and "demo-single-thread" not in registry.seasonings
    assert registry.seasonings["replacement"].plugin == "demo"
    again = registry_with(routetune_demo, "demo2")
    assert again.seasonings["demo-single-thread"].plugin == "demo2"


def test_disabling_a_plugin_that_is_not_installed_warns(demo_installed: None) -> None:
    done = routetune("seasonings", ROUTETUNE_DISABLE_PLUGINS="demo,nosuch")
    assert done.returncode == 0
    assert ("routetune: warning: ROUTETUNE_DISABLE_PLUGINS names nosuch, not an installed "
            "plugin") in done.stderr
    assert "demo-single-thread" not in done.stdout
