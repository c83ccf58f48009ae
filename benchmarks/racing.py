"""Racing against timing every candidate in full: the main job, side by side in one run.

Usage:

    python benchmarks/racing.py [--out DIR] [--rounds 2] [--example ppocr-det]
                                [--time-budget 120]

Each round runs the real ``routetune tune --example EXAMPLE --fresh`` twice, once with
``--no-race`` (every candidate timed in full; only one below 0.5x stops early, the rule
before racing) and once with ``--race`` (the default), the order alternating between
rounds so that a drift of the machine favours neither. Both have the same time budget,
so the figures to compare are what each did with it: trials measured, seconds of
measurement per trial (from ``artifacts/timeline.jsonl``), the confirmations' seconds,
the candidates out of the race, and the verdict. Results go to ``DIR/racing.json``; the
machine's load average is recorded before and after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def phases(outdir: Path) -> dict[str, float]:
    """Seconds spent per phase kind (build, measure, confirm, outputs) in a run's timeline."""
    spent: dict[str, float] = {}
    for line in (outdir / "artifacts" / "timeline.jsonl").read_text().splitlines():
        event = json.loads(line)
        spent[event["phase"]] = spent.get(event["phase"], 0.0) + event["end"] - event["start"]
    return {k: round(v, 1) for k, v in spent.items()}


def one(example: str, race: bool, budget: float, outdir: Path) -> dict[str, Any]:
    """Run the main job once; what it did with its budget."""
    import sqlite3

    flag = "--race" if race else "--no-race"
    cmd = [sys.executable, "-m", "routetune", "tune", "--example", example, "--fresh",
           "--output", str(outdir), "--time-budget", str(budget), flag]
    before = loadavg()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-500:]}")
    record = json.loads((outdir / "run.json").read_text())
    rows = sqlite3.connect(outdir / "trials.sqlite").execute(
        "SELECT status, measurement FROM trials").fetchall()
    measured = [r for r in rows if r[0] in ("ok", "accuracy-failed")]
    notes = [" ".join(json.loads(r[1])["notes"]) if r[1] else "" for r in rows]
    raced = sum("out of the race" in n for n in notes)
    figure_only = sum("timed for" in n for n in notes)
    spent = phases(outdir)
    return {"race": race, "wall_s": round(wall, 1), "trials": len(rows),
            "measured": len(measured), "out_of_race": raced,
            "accuracy_failed_figure_only": figure_only,
            "measure_s": spent.get("measure", 0.0), "build_s": spent.get("build", 0.0),
            "confirm_s": spent.get("confirm", 0.0),
            "measure_s_per_trial": round(spent.get("measure", 0.0) / max(len(measured), 1), 2),
            "confirmations": len(record["result"]["confirmations"]),
            "winner": record["result"]["winner"], "reason": record["result"]["reason"],
            "waited_s": record["conditions"]["waited_s"],
            "noisy": record["conditions"]["noisy"],
            "loadavg_before": before, "loadavg_after": loadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("racing-bench"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--example", default="ppocr-det")
    parser.add_argument("--time-budget", type=float, default=120.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(args.rounds):
        for race in ((False, True) if k % 2 == 0 else (True, False)):
            name = f"{'race' if race else 'no-race'}-{k}"
            run = one(args.example, race, args.time_budget, args.out / name)
            runs.append(run)
            print(json.dumps({"run": name, **{key: run[key] for key in (
                "wall_s", "measured", "out_of_race", "measure_s_per_trial", "confirm_s",
                "winner", "waited_s")}}), flush=True)
    doc = {"example": args.example, "time_budget_s": args.time_budget,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version()},
           "runs": runs}
    (args.out / "racing.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
