"""Paired timing in a real search: a candidate that cannot win is timed no further."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from graphs import wasteful
from quick import quick_spec

from routetune.display import racing_line
from routetune.plugin_manager import load_registry
from routetune.records.trial import Trial
from routetune.run.tuning import TuneResult, tune
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo
from routetune.timing.measure import MeasureSettings
from routetune.timing.race import EARLY_PAIRS, RACE_PAIRS

WASTE_DEPTH = 40
"""MatMul+Tanh layers `AddWaste` adds (the base model has one): about 40x the work."""


class AddWaste(Seasoning):
    """Adds ``y + 0 * tanh-MatMul-chain(y)`` on the first output: exact, and far slower."""

    info = SeasoningInfo(name="add-waste", stage="graph", summary="add a heavy x*0 branch")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Rename the output's producer's tensor, and add the branch and the Add."""
        graph = state.graph
        y = graph.outputs[0]
        producer = y.inputs[0]
        y.inputs.clear()
        live = gs.Variable("y_live", dtype=np.float32, shape=y.shape)
        producer.outputs.append(live)
        rng = np.random.default_rng(3)
        prev = live
        for i in range(WASTE_DEPTH):
            width = y.shape[-1]
            w = gs.Constant(f"waste_w{i}", (rng.standard_normal((width, width))
                                             / np.sqrt(width)).astype(np.float32))
            m, t = (gs.Variable(f"waste_{k}{i}", dtype=np.float32) for k in "mt")
            graph.nodes += [gs.Node("MatMul", f"waste_matmul{i}", inputs=[prev, w], outputs=[m]),
                            gs.Node("Tanh", f"waste_tanh{i}", inputs=[m], outputs=[t])]
            prev = t
        waste = gs.Variable("waste_y", dtype=np.float32)
        zero = gs.Constant("waste_zero", np.zeros(1, np.float32))
        graph.nodes += [gs.Node("Mul", "waste_times_zero", inputs=[prev, zero], outputs=[waste]),
                        gs.Node("Add", "waste_add", inputs=[live, waste], outputs=[y])]
        graph.toposort()
        return PassResult(True, {"added": WASTE_DEPTH})


def run(tmp_path: Path, race: bool) -> TuneResult:
    registry = load_registry()
    registry.add_seasoning(AddWaste)
    settings = MeasureSettings(min_runs=5, min_time_s=0.3, race=race)
    result = tune(quick_spec(model=wasteful(tmp_path / "m.onnx", depth=1),
                             output=tmp_path / "out", seasonings=("add-waste", "ort-opt-level"),
                             search="exhaustive", max_depth=1, measure=settings), registry)
    assert result.winner is None or result.winner.route != "add-waste"
    return result


def test_a_far_slower_candidate_leaves_the_race_after_three_pairs(tmp_path: Path) -> None:
    result = run(tmp_path, race=True)
    slow = {t.route: t for t in result.trials}["add-waste"]
    assert slow.status == "ok" and slow.paired is not None
    assert slow.paired.pairs == EARLY_PAIRS < MeasureSettings().min_blocks
    assert slow.raced is not None and slow.raced >= 1.03  # --min-speedup, or a leader's
    assert slow.paired.ci_high < slow.raced
    # the stored figure is the race's, with its t interval, as the note gives it
    assert any(f"{slow.paired.value:.3f}x [{slow.paired.ci_low:.3f}, {slow.paired.ci_high:.3f}]"
               in n for n in slow.notes), (slow.paired, slow.notes)
    assert any(n.startswith(f"out of the race after {EARLY_PAIRS} paired blocks")
               and f"first 3 far below {slow.raced:.3g}x (" in n and "so it cannot win" in n
               and "a t interval: 3 blocks give no distribution-free one" in n
               and "t-test" in n for n in slow.notes), slow.notes
    assert slow.other_latency is None
    assert racing_line(result).startswith("racing: ")
    assert "out of the race (timed 3 or 7 paired blocks, not built on)" in racing_line(result)


def test_without_racing_only_a_hopeless_candidate_stops_early(tmp_path: Path) -> None:
    trials = {t.route: t for t in run(tmp_path, race=False).trials}
    slow = trials["add-waste"]
    # the early look at 3, or, where a loaded machine spreads the first 3 ratios beyond
    # its t-test (CI under pytest-xdist: 0.007-0.03x), the sign test's at 6 ratios
    assert slow.paired is not None and slow.paired.pairs in (EARLY_PAIRS, RACE_PAIRS + 1)
    assert any("below 0.5x (half the base route's speed)" in n for n in slow.notes)
    for route, trial in trials.items():  # ties with the base route: timed in full
        if route not in ("base", "add-waste") and trial.status == "ok":
            assert trial.paired is not None and trial.paired.pairs >= 10
            assert not any("out of the race" in n for n in trial.notes)


def _pin_every_thread(cpus: set[int]) -> None:
    """Run every thread of this process (ONNX Runtime's pools too) on `cpus` only."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


ALL_CPUS = os.sched_getaffinity(0)


class TakeACore(Seasoning):
    """Renames the graph (a new engine, the same computation), and meanwhile takes every
    core but one from this process, as the VM's host took one of its two vCPUs away
    (docs/benchmarks.md): the machine is slower than it was, and nothing in /proc says
    so. With ``give_back_s``, a timer gives the cores back after that many seconds."""

    info = SeasoningInfo(name="take-a-core", stage="graph",
                         summary="take every core but one from the process")
    give_back_s: float | None = None

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        """Rename the graph, and pin every thread to the first core."""
        state.graph.name = f"{state.graph.name}-renamed"
        _pin_every_thread({min(ALL_CPUS)})
        if self.give_back_s is not None:
            threading.Timer(self.give_back_s, _pin_every_thread, (ALL_CPUS,)).start()
        return PassResult(True, {"renamed": 1})


def _slowed(tmp_path: Path, busy_machine: str, pace_ms: float | None = None
            ) -> dict[str, Trial]:
    """A search whose last candidate takes the core; the base route's engine in the
    search is opened before (by ``ort-opt-level``'s), with a thread for each core.
    `pace_ms`: the base route's pace from before the search (`tune`'s)."""
    registry = load_registry()
    registry.add_seasoning(TakeACore)
    try:
        result = tune(quick_spec(model=wasteful(tmp_path / "m.onnx", depth=40),
                                 output=tmp_path / "out",
                                 seasonings=("ort-opt-level", "take-a-core"),
                                 search="exhaustive", max_depth=1,
                                 busy_machine=busy_machine), registry, pace_ms=pace_ms)
    finally:
        _pin_every_thread(ALL_CPUS)
    assert result.winner is not None and result.winner.route == "base"
    return {t.route: t for t in result.trials}


@pytest.mark.serial
@pytest.mark.skipif(len(ALL_CPUS) < 2, reason="needs two cores to take one away")
def test_a_machine_slower_than_it_was_marks_the_trial_noisy(tmp_path: Path) -> None:
    trials = _slowed(tmp_path, "warn")
    assert not trials["base"].noisy
    slowed = trials["take-a-core"]
    assert "the base route ran " in slowed.noisy, slowed.noisy
    assert "its p50 earlier in this run" in slowed.noisy
    # blamed on the machine unless the host's own load was seen too (named first)
    assert "this machine is slower than it was" in slowed.noisy or slowed.noisy.startswith(
        "other processes used"), slowed.noisy
    assert slowed.conditions["attempts"] == 1 and slowed.conditions["waited_s"] == 0
    # the base route's figure over its pace, as `--busy-machine ignore` judges it
    assert slowed.conditions["pace_x"] > 1.3, slowed.conditions


@pytest.mark.serial
@pytest.mark.skipif(len(ALL_CPUS) < 2, reason="needs two cores to take one away")
def test_a_pace_slower_than_the_base_trial_gives_way_to_it(tmp_path: Path) -> None:
    """A pace from before the search (a side-by-side loop timed while the host had a
    vCPU away: here far slower than anything) is replaced by the search's own quiet base
    trial, so a core taken later still shows."""
    trials = _slowed(tmp_path, "warn", pace_ms=1e6)
    slowed = trials["take-a-core"]
    assert "its p50 earlier in this run" in slowed.noisy, slowed.noisy
    assert "(1e+06 ms)" not in slowed.noisy  # judged against the base trial's figure


@pytest.mark.serial
@pytest.mark.skipif(len(ALL_CPUS) < 2, reason="needs two cores to take one away")
def test_wait_times_the_base_route_until_it_is_back_to_its_pace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given back after the first measurement and the one through the noise (about 3 s)
    monkeypatch.setattr(TakeACore, "give_back_s", 5.0)
    (tmp_path / "1").mkdir(), (tmp_path / "2").mkdir()
    slowed = _slowed(tmp_path / "1", "wait")["take-a-core"]
    if slowed.noisy:  # once more: this VM's host may itself take a vCPU away for 2-50 s
        # right after the core is given back, which the pace rightly marks (1 in 7 here)
        slowed = _slowed(tmp_path / "2", "wait")["take-a-core"]
    assert not slowed.noisy, slowed.noisy  # measured again once the core was back
    assert slowed.conditions["through"] and slowed.conditions["attempts"] >= 3
    assert slowed.conditions["waited_s"] >= 2.0
