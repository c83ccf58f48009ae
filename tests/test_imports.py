"""Guard rails on how the package is put together: what core may import, and clean imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).parents[1] / "core"
OUTSIDE_CORE = ("routetune.plugins", "routetune.passes")
"""Packages core must not import: they plug into core through entry points, not the
other way round, so a user can disable or replace any of them."""


def imported(source: str) -> set[str]:
    """The module names a source file imports (absolute imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_core_imports_no_plugin_and_no_pass() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 40
    found = sorted(f"{f.relative_to(CORE)}: {name}" for f in files
                   for name in imported(f.read_text())
                   if name.startswith(OUTSIDE_CORE))
    assert found == []


def test_the_check_sees_a_forbidden_import() -> None:
    assert imported("from routetune.plugins.onnxruntime import backend\n") >= {
        "routetune.plugins.onnxruntime"}
    assert imported("import routetune.passes.graph\n") == {"routetune.passes.graph"}


def test_every_module_imports_without_a_warning() -> None:
    # -W error: a DeprecationWarning or any other warning at import is a failure.
    code = ("import importlib, pkgutil\n"
            "names = []\n"
            "for top in ('routetune', 'routetune.passes', 'routetune.plugins'):\n"
            "    package = importlib.import_module(top)\n"
            "    names += [m.name for m in pkgutil.walk_packages(package.__path__, top + '.')\n"
            "              if not m.name.endswith('__main__')]\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "print(len(set(names)))\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) > 60  # core, search, passes and plugins were walked


def test_import_routetune_loads_no_tuner_and_tune_is_the_function() -> None:
    # Start-up time (benchmarks/startup.py): `import routetune` must not pull in ONNX,
    # the recipe schema or the worker pool; `routetune.tune` loads them on first use,
    # and stays the function even after the module that runs a tuning is imported.
    code = ("import sys, routetune\n"
            "heavy = sorted(m for m in ('onnx', 'pydantic', 'pebble', 'routetune.tuning')\n"
            "               if m in sys.modules)\n"
            "import routetune.tuning\n"
            "print(heavy, routetune.tune.__module__, callable(routetune.tune))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "routetune.api", "True"]
