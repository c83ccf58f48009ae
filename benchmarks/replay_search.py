"""Replay a search strategy on an exhaustive run's stored trials, building nothing.

Usage (any machine; no GPU, no model):

    python benchmarks/replay_search.py --trials DIR/trials.sqlite
        --seasonings a,b,c [--max-depth 4] [--strategies beam,mixed] [--beam-width 3]

`benchmarks/search_efficiency.py` runs every strategy on the device, which costs device
time; when a strategy's own run is cut short (or lost), its choices can still be
scored on exhaustive's table. The strategy (the registered class, with its options) asks
for routes as in a real search, and is told, for each route, the trial that exhaustive
stored for it: the same measurement, so one run's conditions, not a second run's noise.
A seasoning that the run found not applicable (stored as skipped on its own) is left
out of the space, as the run left it out.

A route that exhaustive recorded as "same model and settings as route X" (equal
engines are measured once, issue 16) is counted as built when the replay has not yet
asked for X, since a live search would have built it then; it is told X's trial.
What the replay does not model: the loop's refinements after the strategy stops, and
the time budget. It prints, per strategy, the routes asked for, the engines built (the
base route's included, as `benchmarks/gpu.py`'s `builds` counts them), the winner, and
the winner's speed-up over exhaustive's best, as exhaustive measured both.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SAME = re.compile(r"same model and settings as route '([^']+)'")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=Path, required=True,
                        help="an exhaustive run's trials.sqlite (its -wal beside it, if any)")
    parser.add_argument("--seasonings", required=True)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--strategies", default="beam,mixed")
    parser.add_argument("--beam-width", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    from routetune.plugin_manager import load_registry
    from routetune.routes.composer import RouteSpace

    if not args.trials.is_file():
        sys.exit(f"--trials {args.trials}: no such file; give an exhaustive run's trials.sqlite")
    registry = load_registry()
    table = load(args.trials)
    # A seasoning the run found not applicable to the model (its one-step route stored
    # as skipped, not as an equal engine) was left out of that run's space.
    names = [n for n in args.seasonings.split(",") if n not in table or table[n].status != "skipped"
             or SAME.match(table[n].reason or "")]
    space = RouteSpace([registry.seasoning(n).info for n in names], args.max_depth)
    missing = [str(r) for r in space.routes() if str(r) not in table]
    if missing:
        sys.exit(f"--trials: {len(missing)} routes of the space have no stored trial "
                 f"(first: {missing[0]}); finish the exhaustive run with --resume")
    accurate = {r: t.speedup for r, t in table.items() if t.status == "ok" and t.speedup}
    best = max(accurate, key=accurate.__getitem__)
    exhaustive_builds = sum(built(t) for t in table.values())
    rows: dict[str, Any] = {"exhaustive": {"asked": space.size() - 1, "builds": exhaustive_builds,
                                           "winner": best, "speedup": accurate[best]}}
    for name in args.strategies.split(","):
        cls = registry.strategy(name)
        options = cls.Options(beam_width=args.beam_width) if name == "beam" else None
        rows[name] = replay(cls(space, options), table)
    for name, row in rows.items():
        row["builds_fraction"] = round(row["builds"] / exhaustive_builds, 3)
        row["fraction_of_best"] = round(accurate.get(row["winner"], 1.0) / accurate[best], 3)
        print(f"{name:10s} asked {row['asked']:3d}  built {row['builds']:3d} "
              f"({row['builds_fraction']:.0%} of exhaustive's {exhaustive_builds})  "
              f"winner {row['winner']} {row['speedup']:.2f}x "
              f"({row['fraction_of_best']:.1%} of the best)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def load(path: Path) -> dict[str, Any]:
    """The stored trials of `path` (a trials.sqlite), by route text."""
    from routetune.records.store import TrialStore

    with tempfile.TemporaryDirectory() as tmp:  # SQLite writes beside the file it reads
        copy = Path(tmp) / "trials.sqlite"
        shutil.copy(path, copy)
        store = TrialStore.open(copy)
        table = {t.route: t for t in store.trials()}
        store.close()
    return table


def built(trial: Any) -> bool:
    """Whether the trial built an engine (as `benchmarks/gpu.py`'s `builds` counts)."""
    return trial.build_ms is not None and trial.status not in ("skipped", "not-applicable")


def replay(strategy: Any, table: dict[str, Any]) -> dict[str, Any]:
    """Run `strategy`'s ask/tell on stored trials: routes asked, engines built, winner."""
    from routetune.judging.ranking import rank_key
    from routetune.routes.route import Route
    from routetune.search.strategy import Result

    strategy.tell(Route(), Result.of(table["base"]))
    asked, builds, told = 0, 1, {"base": table["base"]}
    while batch := strategy.ask():
        for route in batch:
            trial = table[str(route)]
            same = SAME.match(trial.reason or "")
            if same and same.group(1) not in told:  # a live search builds it here
                trial = table[same.group(1)]
            asked += 1
            builds += built(trial)
            told[str(route)] = trial
            strategy.tell(route, Result.of(trial))
    ok = [t for t in told.values() if t.status == "ok"]
    winner = min(ok, key=rank_key)
    return {"asked": asked, "builds": builds, "winner": winner.route,
            "speedup": winner.speedup or 1.0}


if __name__ == "__main__":
    main()
