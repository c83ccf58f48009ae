"""Worker isolation with real subprocesses: seasonings that crash, hang and hog memory.

The routetune-chaos package (tests/thirdparty/routetune-chaos) is pip-installed into a
folder on the command's ``PYTHONPATH``, so the spawned workers load it from its entry
point like any third-party plugin, and no other test sees it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from command import routetune_script
from graphs import wasteful
from plugin_packages import installed
from quick import QUICK_FLAGS, quick_spec

from routetune.execution.local_pool import exit_text
from routetune.records.store import TrialStore
from routetune.records.trial import Trial

CHAOS = ("chaos-abort,chaos-segfault,chaos-hang,chaos-oom,chaos-exit,chaos-flaky,"
         "chaos-drop-waste")
TIMEOUT_S = 6


CHAOS_ENV: dict[str, str] = {}
"""The environment under which a process sees routetune-chaos (`chaos`)."""


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The chaos package installed, and the `wasteful` model it is made for."""
    with installed("routetune-chaos", tmp_path_factory.mktemp("chaos")) as env:
        CHAOS_ENV.update(env)
        yield wasteful(tmp_path_factory.mktemp("model") / "w.onnx")
        CHAOS_ENV.clear()


def routetune(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m routetune ARGS`` with routetune-chaos installed."""
    return routetune_script(*args, timeout=timeout, **CHAOS_ENV)


def chaos_search(model: Path, out: Path, *flags: str) -> tuple[str, dict[str, object]]:
    done = routetune("tune", str(model), "--output", str(out), "--seasonings", CHAOS,
                     "--search", "exhaustive", "--max-depth", "1", "--trial-timeout",
                     str(TIMEOUT_S), "--worker-memory", "3000", *QUICK_FLAGS, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    store = TrialStore.open(out / "trials.sqlite")
    try:
        trials = {t.route: t for t in store.trials()}
    finally:
        store.close()
    winner = json.loads((out / "winner.json").read_text())["route"]
    return winner, trials


@pytest.fixture(scope="module")
def one_build_worker(chaos: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[Path, str, dict[str, object]]:
    """The chaos search with one build worker: its folder, winner and trials."""
    out = tmp_path_factory.mktemp("one") / "out"
    return (out, *chaos_search(chaos, out, "--build-workers", "1"))


@pytest.mark.parametrize("build_workers", [1, 2])
@pytest.mark.slow
def test_each_misbehaving_candidate_is_one_recorded_trial(
        chaos: Path, one_build_worker: tuple[Path, str, dict[str, object]], tmp_path: Path,
        build_workers: int) -> None:
    out, winner, trials = one_build_worker
    if build_workers == 2:
        out = tmp_path / "out"
        winner, trials = chaos_search(chaos, out, "--build-workers", "2")
    expected = {
        "base": "ok", "chaos-drop-waste": "ok", "chaos-flaky": "ok",
        "chaos-flaky{variant=c}": "ok", "chaos-abort": "crashed", "chaos-segfault": "crashed",
        "chaos-oom": "crashed", "chaos-flaky{variant=b}": "crashed", "chaos-hang": "timed-out",
        "chaos-exit": "crashed",
    }
    assert {route: t.status for route, t in trials.items()} == expected
    reasons = {route: t.reason for route, t in trials.items()}
    assert "signal SIGABRT (exit code -6)" in reasons["chaos-abort"]
    assert "Fatal Python error: Aborted" in reasons["chaos-abort"]
    assert "signal SIGSEGV (exit code -11)" in reasons["chaos-segfault"]
    assert "Fatal Python error: Segmentation fault" in reasons["chaos-segfault"]
    assert "routetune_chaos" in reasons["chaos-segfault"]  # the innermost frame
    assert "out of memory (MemoryError" in reasons["chaos-oom"]
    assert "(limit: --worker-memory 3000 MiB; raise it)" in reasons["chaos-oom"]
    assert "SystemExit: 3" in reasons["chaos-exit"]
    # the stack the worker dumped before its timeout says where it hung
    assert "Timeout (" in reasons["chaos-hang"] and "in apply" in reasons["chaos-hang"]
    assert "RuntimeError: chaos-flaky: variant b is broken (at routetune_chaos/__init__.py:" \
        in reasons["chaos-flaky{variant=b}"]
    assert f"--trial-timeout {TIMEOUT_S} s" in reasons["chaos-hang"]
    assert winner == "chaos-drop-waste"
    timeline = [json.loads(line) for line in
                (out / "artifacts" / "timeline.jsonl").read_text().splitlines()]
    hang = next(e for e in timeline if e["route"] == "chaos-hang")
    assert TIMEOUT_S <= hang["end"] - hang["start"] < TIMEOUT_S + 10
    assert all(e["pid"] for e in timeline if e["phase"] in ("build", "measure"))
    builds = [e for e in timeline if e["phase"] == "build"]
    measures = [e for e in timeline if e["phase"] == "measure"]
    # on the CPU, no candidate is timed while anything builds
    assert not [(b["route"], m["route"]) for b in builds for m in measures
                if b["start"] < m["end"] and m["start"] < b["end"]]
    overlapping = [(a["route"], b["route"]) for a in builds for b in builds
                   if a is not b and a["start"] < b["end"] and b["start"] < a["end"]]
    assert bool(overlapping) == (build_workers == 2)  # the hang leaves time to overlap


@pytest.mark.slow
def test_a_resumed_chaos_search_redoes_nothing(
        chaos: Path, one_build_worker: tuple[Path, str, dict[str, object]]) -> None:
    out, _, first = one_build_worker  # resumed in place: the other tests read builds and
    timeline = out / "artifacts" / "timeline.jsonl"  # measures, which it adds none of

    def trial_phases() -> int:
        return sum(json.loads(line)["phase"] in ("build", "measure")
                   for line in timeline.read_text().splitlines())

    phases = trial_phases()
    winner, again = chaos_search(chaos, out)
    assert winner == "chaos-drop-waste"
    assert {r: t.status for r, t in again.items()} == {r: t.status for r, t in first.items()}
    assert trial_phases() == phases  # no trial ran again (only the final side-by-side)
    with sqlite3.connect(out / "trials.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_plugins_registered_in_process_are_refused_by_workers(tmp_path: Path) -> None:
    from graphs import conv_bn

    from routetune.errors import UsageError
    from routetune.plugin_manager import load_registry
    from routetune.run.tuning import tune
    from routetune.seasoning import PassResult, Seasoning, SeasoningInfo

    class Local(Seasoning):
        info = SeasoningInfo(name="local-only", stage="graph", summary="registered in-process")

        def apply(self, state, ctx) -> PassResult:  # noqa: ANN001
            return PassResult(False)

    registry = load_registry()
    registry.add_seasoning(Local)
    opts = quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "out",
                      shapes="x:1x3x32x32", seasonings=("local-only",), in_process=False)
    with pytest.raises(UsageError, match="local-only.*--in-process"):
        tune(opts, registry)


def test_exit_text_names_the_signal() -> None:
    assert exit_text(-11) == "signal SIGSEGV (exit code -11)"
    assert exit_text(3) == "exit code 3"
    assert exit_text(-200) == "exit code -200"


@pytest.mark.slow
def test_a_route_waits_for_the_build_of_its_prefix_and_reuses_its_model(tmp_path: Path) -> None:
    from graphs import conv_bn

    out = tmp_path / "out"
    done = routetune("tune", str(conv_bn(tmp_path / "m.onnx")), "--shapes", "x:1x3x32x32",
                     "--output", str(out), "--seasonings", "fp16,fold-constants,ort-threads",
                     "--search", "exhaustive", "--max-depth", "2", "--build-workers", "2",
                     *QUICK_FLAGS, "--keep", "all")
    assert done.returncode == 0, done.stderr[-3000:]
    timeline = [json.loads(line) for line in
                (out / "artifacts" / "timeline.jsonl").read_text().splitlines()]
    builds = {e["route"]: e for e in timeline if e["phase"] == "build"}
    for route, e in builds.items():
        if route.startswith("fp16,"):  # fp16's model steps are a prefix of these
            assert e["start"] >= builds["fp16"]["end"], route
    entries = [json.loads(p.read_text())
               for p in (out / "artifacts" / "prefixes").glob("*.json")]
    lowerings = [e["stash"]["precision.lowering"] for e in entries
                 if "precision.lowering" in e["stash"]]  # fp16's, for precision-repair
    assert lowerings and all(low["seasoning"] == "fp16" for low in lowerings)
    for low in lowerings:  # its FP32 graph travels as a kept model, not a pickle
        assert (out / "artifacts" / "models" / f"{low['model_sha256'][:16]}.onnx").exists()
    store = TrialStore.open(out / "trials.sqlite")
    try:
        trials = {t.route: t for t in store.trials()}
    finally:
        store.close()
    # the extending route starts from the shared model: the same fp16 pass record
    assert trials["fp16,ort-threads"].passes[0] == trials["fp16"].passes[0]


@pytest.mark.parametrize("executor", [(), ("--in-process",)])
@pytest.mark.slow
def test_past_the_time_budget_a_built_candidate_is_not_measured_and_a_resume_measures_it(
        chaos: Path, tmp_path: Path, executor: tuple[str, ...]) -> None:
    """Issue 16's GPU runs went 2-4x past ``--time-budget 60``: every candidate built
    before the deadline was still measured after it, one by one. ``chaos-slow`` builds for
    12 s: it starts before the 8 s deadline (once the base route is measured) and is built
    after it."""
    out = tmp_path / "out"
    flags = ("--seasonings", "chaos-slow", "--search", "exhaustive", "--max-depth", "1",
             *QUICK_FLAGS, *executor)
    done = routetune("tune", str(chaos), "--output", str(out), "--time-budget", "8", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["result"]["stopped"] == (
        "--time-budget 8 s reached; 1 built, not measured (measured on resume): chaos-slow")
    assert [t.route for t in stored(out)] == ["base"]
    timeline = out / "artifacts" / "timeline.jsonl"  # the pool's phases
    if timeline.exists():
        phases = [(e["phase"], e["route"]) for e in map(json.loads,
                                                         timeline.read_text().splitlines())]
        assert ("build", "chaos-slow") in phases and ("measure", "chaos-slow") not in phases

    again = routetune("tune", str(chaos), "--output", str(out), *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {t.route: t.status for t in stored(out)} == {"base": "ok", "chaos-slow": "ok"}
    assert json.loads((out / "run.json").read_text())["result"]["stopped"] is None


@pytest.mark.slow
def test_no_candidate_starts_when_less_time_is_left_than_the_longest_one_took(
        chaos: Path, tmp_path: Path) -> None:
    """On the H200 a BERT's transformer-optimizer build takes about 45 s; one started
    with 30 s of the budget left was built past the deadline and dropped, its build
    wasted. ``chaos-slow`` takes 12 s: once it is done (at 13 s or later), less than
    12 s of the 24 s budget is left, so the routes of depth 2 do not start."""
    out = tmp_path / "out"
    done = routetune("tune", str(chaos), "--output", str(out), "--time-budget", "24",
                     "--seasonings", "chaos-drop-waste,chaos-slow", "--search", "exhaustive",
                     "--max-depth", "2", *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = json.loads((out / "run.json").read_text())["result"]["stopped"]
    assert stopped.startswith("--time-budget 24 s nearly reached: ") and stopped.endswith(
        "s, any wait for quiet left out), so none more started"), stopped
    assert {t.route for t in stored(out)} == {"base", "chaos-drop-waste", "chaos-slow"}
    builds = [e["route"] for e in map(json.loads, (out / "artifacts" / "timeline.jsonl")
                                      .read_text().splitlines()) if e["phase"] == "build"]
    assert all("," not in route for route in builds), builds  # no depth-2 build started


@pytest.mark.parametrize("executor", [(), ("--in-process",)])
@pytest.mark.slow
def test_the_base_route_is_measured_even_when_the_time_budget_ends_during_its_build(
        chaos: Path, tmp_path: Path, executor: tuple[str, ...]) -> None:
    """A new user's ``--time-budget 1`` ended in a traceback: the base route, built
    past the deadline, was dropped like a candidate, and the verdict found no base."""
    out = tmp_path / "out"
    done = routetune("tune", str(chaos), "--output", str(out), "--seasonings",
                     "chaos-drop-waste", "--time-budget", "0.01", *QUICK_FLAGS, *executor)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert {t.route: t.status for t in stored(out)} == {"base": "ok"}
    assert json.loads((out / "run.json").read_text())["result"]["stopped"] == (
        "--time-budget 0.01 s reached")
    assert "winner: base" in " ".join(done.stdout.split())


def stored(out: Path) -> list[Trial]:
    """The trials in `out`'s store."""
    store = TrialStore.open(out / "trials.sqlite")
    try:
        return store.trials()
    finally:
        store.close()
