"""Paired timing: a candidate far slower than the base route is timed no further."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs
from graphs import wasteful
from quick import quick_spec

from routetune.candidate.pairing import HOPELESS_PAIRS, HOPELESS_SPEEDUP, hopeless
from routetune.plugin_manager import load_registry
from routetune.run.tuning import tune
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo
from routetune.timing.measure import Block, MeasureSettings

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


def blocks(ratios: list[float]) -> list[Block]:
    """Base and candidate blocks in ABBA order; candidate block k runs at `ratios[k]`x."""
    out = [Block(1, 1.0, 3)]
    for ratio in ratios:
        out += [Block(0, 1.0 / ratio, 3), Block(1, 1.0, 3)]
    return out


def test_hopeless_needs_every_pair_below_the_bound_and_enough_pairs() -> None:
    assert hopeless(blocks([0.1] * (HOPELESS_PAIRS - 1))) is None  # too few pairs yet
    found = hopeless(blocks([0.1] * HOPELESS_PAIRS))
    assert found is not None and found.pairs == HOPELESS_PAIRS
    assert found.ci_high < HOPELESS_SPEEDUP
    assert hopeless(blocks([0.1] * (HOPELESS_PAIRS - 1) + [0.6])) is None  # one pair above
    assert hopeless(blocks([0.9] * 20)) is None  # slower, but not hopeless


def test_a_far_slower_candidate_stops_after_six_pairs_and_the_rest_are_timed_in_full(
        tmp_path: Path) -> None:
    registry = load_registry()
    registry.add_seasoning(AddWaste)
    settings = MeasureSettings(min_runs=5, min_time_s=0.3)
    result = tune(quick_spec(model=wasteful(tmp_path / "m.onnx", depth=1),
                             output=tmp_path / "out", seasonings=("add-waste", "fold-constants"),
                             search="exhaustive", max_depth=1, measure=settings), registry)
    trials = {t.route: t for t in result.trials}
    slow, other = trials["add-waste"], trials["fold-constants"]
    assert slow.status == "ok" and slow.paired is not None
    assert slow.paired.pairs == HOPELESS_PAIRS < settings.min_blocks
    assert slow.paired.ci_high < HOPELESS_SPEEDUP
    assert any(n.startswith(f"timing stopped after {HOPELESS_PAIRS} paired blocks")
               and "it cannot win" in n for n in slow.notes), slow.notes
    assert slow.other_latency is None
    assert other.status == "ok" and other.paired is not None
    assert other.paired.pairs >= settings.min_blocks
    assert not any("timing stopped" in n for n in other.notes)
    assert result.winner is None or result.winner.route != "add-waste"
