"""A search over several backends: real ONNX Runtime and OpenVINO, side by side."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import onnx
import pytest
from command import routetune as routetune_here
from graphs import matmul_chain
from quick import QUICK_FLAGS, QUICK_KEYWORDS, quick_spec

import routetune
from routetune.options import check_keyword, options_of
from routetune.plugin_manager import load_registry
from routetune.records.trial import Trial
from routetune.run.backends import (
    BackendsResult,
    Contender,
    backend_names,
    pick,
    tune_backends,
    write,
)
from routetune.run.preparation import Prepared, prepare_run
from routetune.run.recipe import merge
from routetune.run.run_spec import RunSpec
from routetune.run.side_by_side import (
    base_floors,
    fresh_loop,
    loop_inputs,
    side_by_side,
    timed_loop,
)
from routetune.run.winner import WINNER_OUTPUTS, load_outputs
from routetune.timing.measure import Latency, Speedup
from routetune.timing.race import CLEAR_PAIRS, Bar

LAT = Latency(40, 1.0, 1.1, 1.2, 1.0, 0.95, 1.05)


def contender(backend: str, route: str, speedup: float, half: float = 0.02) -> Contender:
    trial = Trial(route, "m", route, backend, "cpu", "s", "ok", latency=LAT)
    return Contender(backend, trial, LAT, Speedup(speedup, speedup - half, speedup + half,
                                                  30, 0.005))


def test_the_fastest_clear_contender_wins_and_overlaps_are_named_a_tie() -> None:
    base = contender("onnxruntime", "base", 1.0)
    cands = [base, contender("onnxruntime", "ort-threads{intra_op=1}", 1.20),
             contender("openvino", "base", 1.50, half=0.05),
             contender("openvino", "ov-threads{threads=1}", 1.52, half=0.05)]
    winner, why = pick(cands, 1.03, {})
    assert winner is cands[3]
    assert "1.52x [1.47, 1.57] over onnxruntime: base" in why
    assert "openvino: base (a tie" in why and "ort-threads" not in why


def test_the_first_backends_base_route_stands_without_clear_evidence() -> None:
    base = contender("onnxruntime", "base", 1.0)
    unclear = contender("openvino", "base", 1.04, half=0.05)  # interval reaches 0.99
    winner, why = pick([base, unclear], 1.03, {})
    assert winner is base and "with 95% confidence" in why
    fast = contender("openvino", "base", 1.8)
    winner, why = pick([base, fast], 1.03, {"busy": "other processes used 1.9 of 2 cores"})
    assert winner is base and "busy" in why  # a busy machine crowns nothing
    assert pick([base, fast], 1.03, {"busy": "x"}, busy_machine="ignore")[0] is fast


@pytest.mark.parametrize(("value", "fix"), [
    ("onnxruntime,", "an empty backend name"),
    ("onnxruntime,onnxruntime", "'onnxruntime' is given twice"),
])
def test_a_bad_backend_list_is_one_line(value: str, fix: str) -> None:
    with pytest.raises(routetune.UsageError, match=fix):
        backend_names(value)


def test_an_unknown_backend_stops_before_any_search(tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=32, batch=4)
    done = routetune_here("tune", str(model), "--backend", "onnxruntime,no-such", "--output",
                          str(tmp_path / "out"))
    assert done.returncode == 2 and "unknown backend 'no-such'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # nothing searched, nothing made


@pytest.mark.slow
def test_two_backends_search_against_one_reference_and_meet_side_by_side(
        tmp_path: Path) -> None:
    model = matmul_chain(tmp_path / "m.onnx", depth=4, width=128, batch=16)
    out = tmp_path / "out"
    done = routetune_here("tune", str(model), "--backend", "onnxruntime,openvino",
                          "--seasonings", "ort-threads,ov-threads", "--search", "one-at-a-time",
                          "--output", str(out), *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "side by side, 1 loop of paired blocks: speed-up over onnxruntime: base" \
        in " ".join(done.stdout.split())  # the title wraps at the table's width
    summary = json.loads((out / "backends.json").read_text())
    contenders = summary["contenders"]
    assert contenders[0]["backend"] == "onnxruntime" and contenders[0]["route"] == "base"
    low, high = contenders[0]["ci"]
    assert low <= 1.0 <= high  # the first base route against itself
    assert {"onnxruntime", "openvino"} == {c["backend"] for c in contenders}
    assert all(c["speedup"] is not None for c in contenders), contenders
    winner = summary["winner"]
    assert (winner["backend"], winner["route"]) in {(c["backend"], c["route"])
                                                    for c in contenders}
    screen = summary["screen"]  # the base routes before the searches: one line each
    assert [line.split(":")[0] for line in screen] == ["onnxruntime", "openvino"], screen
    for name, line in zip(("onnxruntime", "openvino"), screen, strict=True):
        record = json.loads((out / name / "run.json").read_text())
        assert ("floor" in record["search"]) == ("no floor" not in line), (line, record)
    copied = json.loads((out / "winner.json").read_text())
    assert (copied["backend"], copied["route"]) == (winner["backend"], winner["route"])
    stored = {}
    for name in ("onnxruntime", "openvino"):  # each backend's run, in a folder of its own
        with sqlite3.connect(out / name / "trials.sqlite") as db:
            backends = {b for (b,) in db.execute("SELECT DISTINCT backend FROM trials")}
            stored[name] = db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        assert backends == {name} and stored[name] >= 2
        assert f"## {name}" in (out / "report.md").read_text()
    # the API resumes from the stores and answers with the same shape
    again = routetune.tune(model, backend="onnxruntime,openvino",
                           seasonings="ort-threads,ov-threads", search="one-at-a-time",
                           output=out, **QUICK_KEYWORDS)
    assert isinstance(again, BackendsResult)
    assert [r.base.backend for r in again.runs] == ["onnxruntime", "openvino"]
    assert not any(r.fresh for r in again.runs)  # every trial came from the store
    for name in ("onnxruntime", "openvino"):
        with sqlite3.connect(out / name / "trials.sqlite") as db:
            assert db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == stored[name]


@pytest.mark.slow
def test_a_base_route_that_wins_side_by_side_gets_its_own_winner_files(
        tmp_path: Path) -> None:
    """Its backend's search crowned another route: the base route's files are written.

    The side-by-side loop can find a backend's base route faster than the route its own
    search crowned (CI run 31: onnxruntime's ``ort-threads`` won its search, the base
    route won side by side, and winner.json named ``ort-threads``).
    """
    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=64, batch=8)
    registry = load_registry()
    declared = {o.name: o for o in options_of(RunSpec)}
    given = {"model": model, "backend": "onnxruntime,openvino", "search": "exhaustive",
             "seasonings": "ort-threads,ov-threads", "output": tmp_path / "out",
             "min_time_s": 0.02, "busy_machine": "warn"}  # three loops: the default
    spec = merge({k: check_keyword(declared[k], v) for k, v in given.items()}, "api",
                 registry)
    prepared: list[Prepared] = []
    result = tune_backends(spec, registry, on_start=lambda run, plan: prepared.append(run))
    ort = result.runs[0]
    other = next(t for t in ort.trials if t.route != "base" and t.status == "ok")
    base = result.contenders[0]
    assert base.trial is ort.base and base.outputs is not None
    crowned = dataclasses.replace(ort, winner=other)  # its own search crowned `other`
    staged = dataclasses.replace(result, runs=(crowned, *result.runs[1:]), winner=base,
                                 reason="the base route was fastest side by side")
    files = write(staged, prepared, spec)
    top = tmp_path / "out"
    written = json.loads((top / "winner.json").read_text())
    assert (written["backend"], written["route"]) == ("onnxruntime", "base")
    assert written["reason"] == "the base route was fastest side by side"
    assert onnx.load(top / "winner.onnx").graph.node  # the base model, standalone
    assert "base" in (top / "winner.toml").read_text()
    stored = load_outputs(files[WINNER_OUTPUTS])
    assert [set(o) for o in stored] == [set(o) for o in base.outputs]
    summary = json.loads(files["backends.json"].read_text())
    assert (summary["winner"]["backend"], summary["winner"]["route"]) == ("onnxruntime",
                                                                          "base")
    assert result.conditions["loops"] == 3  # --confirm-repeats' default: 3 fresh processes
    # two loops, each in a fresh process: every contender timed in both, combined
    contenders, conditions = side_by_side(prepared, result.runs, repeats=2)
    assert conditions["loops"] == 2 and "waited_s" in conditions
    assert [c.name for c in contenders] == [c.name for c in result.contenders]
    assert all(c.latency is not None and c.paired is not None for c in contenders)
    assert contenders[0].paired.ci_low <= 1.0 <= contenders[0].paired.ci_high
    assert contenders[0].outputs is not None  # from the first loop
    alone, _ = side_by_side(prepared, result.runs, repeats=1, in_process=True)
    assert [c.name for c in alone] == [c.name for c in contenders]


def test_a_backend_whose_base_route_is_slower_races_against_the_faster_one(
        tmp_path: Path) -> None:
    """The screen before the searches: one loop of the base routes side by side.

    Two prepared runs whose base routes differ sixteenfold in work (one and sixteen
    MatMul layers on the same input): the slower gets a floor, the lower end of the
    faster one's paired speed-up over it; the faster gets none.
    """
    registry = load_registry()
    runs = [prepare_run(quick_spec(model=matmul_chain(tmp_path / f"d{depth}.onnx",
                                                      depth=depth, width=128, batch=16),
                                   output=tmp_path / f"out{depth}"), registry)
            for depth in (1, 16)]
    screens, lines, _ = base_floors(runs, registry)
    fast, slow = (screen.floor for screen in screens)
    assert fast is None and "no other backend's base route is shown faster" in lines[0]
    assert slow is not None and slow.speedup > 3, lines  # sixteen layers against one
    assert slow.source.startswith("the lower end of onnxruntime's base route")
    assert f"race against {slow.speedup:.2f}x at least" in lines[1]
    # each search's base route pace: its p50 in the loop, the heavier one's above
    paces = [screen.pace_ms for screen in screens]
    assert paces[0] is not None and paces[1] is not None and 0 < 3 * paces[0] < paces[1]


def test_a_side_by_side_loop_ends_once_every_contender_is_decided(tmp_path: Path) -> None:
    """A loop of a base route and one sixteen times lighter, at a confirmation's length
    (30 blocks, 3 s): racing against --min-speedup, it ends once the lighter one has
    cleared in its first ten paired blocks; without a bar it runs its full length."""
    registry = load_registry()
    runs = [prepare_run(quick_spec(model=matmul_chain(tmp_path / f"d{depth}.onnx",
                                                      depth=depth, width=128, batch=16),
                                   output=tmp_path / f"out{depth}"), registry)
            for depth in (16, 1)]
    jobs = [(loop_inputs(run), tuple(run.base), None) for run in runs]
    settings = dataclasses.replace(runs[0].spec.measure, min_blocks=30, min_time_s=3.0,
                                   max_time_s=30.0)
    bar = Bar.min_speedup(1.03)
    early = timed_loop(jobs, settings, False, registry, bar)
    assert early.conditions["decided"] == 1.03
    rounds = len(early.blocks) // 2
    assert CLEAR_PAIRS <= rounds <= CLEAR_PAIRS + 1, rounds
    full = timed_loop(jobs, settings, False, registry)
    assert "decided" not in full.conditions and len(full.blocks) // 2 >= 30


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_a_side_by_side_loop_whose_process_is_killed_ends_with_why(tmp_path: Path) -> None:
    """The out-of-memory killer's SIGKILL to the loop's process: the loop ends, every
    engine failed with how its process ended, where it used to wait forever."""
    registry = load_registry()
    run = prepare_run(quick_spec(model=matmul_chain(tmp_path / "m.onnx", depth=4, width=64,
                                                    batch=8), output=tmp_path / "out"),
                      registry)
    jobs = [(loop_inputs(run), tuple(run.base), None)] * 2
    settings = dataclasses.replace(run.spec.measure, min_blocks=1000, min_time_s=600.0,
                                   max_time_s=600.0, max_runs=10**9)  # to be killed in
    ended: list = []
    looping = threading.Thread(target=lambda: ended.append(fresh_loop(jobs, settings, False)))
    looping.start()
    time.sleep(5)  # the loop's process is building and timing by now
    killed = 0
    for child in _children(os.getpid()):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                os.kill(child, signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):  # one that ended meanwhile
            continue
    assert killed, "the loop's process never started"
    looping.join(60)
    assert not looping.is_alive(), "the loop waited for its killed process"
    (loop,) = ended
    assert loop.timed == [] and set(loop.failed) == {0, 1}
    assert loop.failed[0].startswith("the side-by-side loop's process ended: signal SIGKILL")
    assert "out-of-memory killer" in loop.failed[0]
