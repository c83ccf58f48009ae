"""Guard rails on how the package is put together: what core may import, and clean imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
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
            "heavy = sorted(m for m in ('onnx', 'pydantic', 'pebble', 'routetune.run.tuning')\n"
            "               if m in sys.modules)\n"
            "import routetune.run.tuning\n"
            "print(heavy, routetune.tune.__module__, callable(routetune.tune))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "routetune.api", "True"]


def test_ray_is_imported_only_for_the_ray_executor() -> None:
    # The CLI, a tuning run's modules and even the Ray executor's own modules import no
    # Ray: only connecting to a cluster (`ray_cluster.connect`, --executor ray) does.
    code = ("import sys\n"
            "import routetune.cli, routetune.run.tuning, routetune.execution.local_pool\n"
            "import routetune.plugins.ray.pool, routetune.plugins.ray.tasks\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]"]


ROOT = Path(__file__).parents[1]
PACKAGES = {"core": "routetune", "passes": "routetune.passes", "plugins": "routetune.plugins"}
LONG_LINES = 400
"""A module longer than this may hold more than one concept: a warning, and a question
for its review (split it by concept, not by count)."""
MAX_LINES = 600
"""A module longer than this holds more than one concept: a failure."""


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    out = {}
    for folder, top in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((top, *parts))] = path
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle found by depth-first search, each once."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_module_imports_itself_through_others_even_lazily() -> None:
    """Module by module, lazy imports (inside functions) included: no circle."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        deps = {m for m, _ in runtime_imports(path.read_text()) if m in mods and m != name}
        # a package's __init__ importing its submodules, and a module importing its own
        # package (initialised before any of its modules), are how packages work
        graph[name] = {d for d in deps
                       if not d.startswith(name + ".") and not name.startswith(d + ".")}
    assert len(graph) > 60 and sum(map(len, graph.values())) > 150
    assert cycles(graph) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_modules_over_400_lines_are_named_and_none_is_over_600() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    long = {name: n for name, n in sorted(sizes.items()) if n > LONG_LINES}
    if long:
        warnings.warn(f"modules over {LONG_LINES} lines (one concept each?): {long}",
                      stacklevel=1)
    assert {name: n for name, n in long.items() if n > MAX_LINES} == {}


def test_the_type_checker_sees_the_package_as_python_imports_it() -> None:
    """``mypy`` checks .typecheck/routetune: links to every entry of core/, and to passes/
    and plugins/ (pyproject's [tool.mypy]); a module added to core/ needs its link."""
    tree = ROOT / ".typecheck" / "routetune"
    links = {p.name: p for p in tree.iterdir()}
    wanted = {p.name for p in (ROOT / "core").iterdir() if p.name != "__pycache__"}
    assert set(links) == wanted | {"passes", "plugins"}, (
        f"ln -s ../../core/NAME .typecheck/routetune/ for: {sorted(wanted - set(links))}")
    for name, link in links.items():
        target = {"passes": ROOT / "passes", "plugins": ROOT / "plugins"}.get(
            name, ROOT / "core" / name)
        assert link.is_symlink() and link.resolve() == target.resolve(), name


# Layers: core's packages and top-level modules import one way ------------------------

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("errors", "options", "signals", "logs", "stash", "digests",
                     "libraries", "install")),
    ("the model and its inputs", ("model/", "feeds/")),
    ("the plugin contract", ("seasoning", "backend", "option_seasoning", "hookspecs",
                             "registry", "plugin_manager")),
    ("routes and timing", ("routes/", "timing/")),
    ("records", ("records/", "refinement")),
    ("judging and reports", ("judging/", "reporting/")),
    ("one candidate's work", ("candidate/",)),
    ("execution", ("execution/",)),
    ("the search", ("search/",)),
    ("a run", ("run/",)),
    ("front ends and tools", ("cli", "memory_cli", "api", "display", "testing", "conformance",
                              "__main__")),
)
"""Core's rooms from the ground up (README, "The map"): a room imports only rooms of its
own layer or below, and no rooms import each other in a circle. A room is a subpackage
(``records/``) or a module at the top of the package (``registry``); the package's face
(``routetune/__init__.py``) is the public API, not a room."""


def runtime_imports(source: str) -> list[tuple[str, int]]:
    """The modules a source file imports when it runs, with their lines: module-level
    imports and those inside functions (lazy ones), not those under ``if TYPE_CHECKING:``
    (annotations, which Python never runs). ``from P import name`` gives ``P.name``
    too, for when ``name`` is a module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.module, child.lineno))
                found.extend((f"{child.module}.{a.name}", child.lineno) for a in child.names)
            visit(child)

    visit(ast.parse(source))
    return found


def room_of(module: str) -> str | None:
    """The room of a core module (``routetune.records.trial`` -> ``records/``); None for
    the face, a plugin or a pass."""
    parts = module.split(".")
    if parts[0] != "routetune" or len(parts) == 1 or parts[1] in ("plugins", "passes"):
        return None
    return parts[1] + "/" if (CORE / parts[1]).is_dir() else parts[1]


def room_imports() -> dict[tuple[str, str], list[str]]:
    """Room A -> room B: where A's modules import B's (``module:line``), at run time."""
    mods = modules()
    out: dict[tuple[str, str], list[str]] = {}
    for name, path in mods.items():
        source = room_of(name)
        if source is None:
            continue
        for imported_name, line in runtime_imports(path.read_text()):
            target = room_of(imported_name)
            if target is not None and target != source and (
                    imported_name in mods or imported_name.rpartition(".")[0] in mods):
                out.setdefault((source, target), []).append(f"{name}:{line}")
    return out


def test_core_rooms_import_each_other_in_no_circle() -> None:
    edges = room_imports()
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    assert len(graph) > 20 and len(edges) > 100  # the rooms that import another
    assert cycles(graph) == []


def test_every_import_runs_down_the_layers() -> None:
    layer = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}
    rooms = {room for pair in room_imports() for room in pair}
    assert rooms - set(layer) == set(), "give each new room a layer in LAYERS"
    upward = sorted(f"{source} ({LAYERS[layer[source]][0]}) -> {target} "
                    f"({LAYERS[layer[target]][0]}): {', '.join(where[:3])}"
                    for (source, target), where in room_imports().items()
                    if layer[target] > layer[source])
    assert upward == []


def test_the_layer_check_reads_lazy_imports_and_leaves_annotations_out() -> None:
    source = ("from typing import TYPE_CHECKING\n"
              "from routetune.errors import UsageError\n"
              "if TYPE_CHECKING:\n"
              "    from routetune.run.run_spec import RunSpec\n"
              "def f():\n"
              "    from routetune.records import store\n")
    assert runtime_imports(source) == [
        ("typing", 1), ("typing.TYPE_CHECKING", 1), ("routetune.errors", 2),
        ("routetune.errors.UsageError", 2), ("routetune.records", 6),
        ("routetune.records.store", 6)]
    assert [room_of(m) for m in ("routetune.records.store", "routetune.registry",
                                 "routetune", "routetune.plugins.ray.pool")] == [
        "records/", "registry", None, None]
