"""Tune the three PP-OCR models with the CLI's defaults and report the figures.

Usage: python benchmarks/ppocr_cpu.py [--out DIR] [--models ppocr-det,ppocr-rec,ppocr-cls]

For each model it prints the size of the route space, the number of trials, the tuning
wall time, the base route's and the winner's p50 (re-measured in the confirmation after the
search), the speed-up, and the winning route. A second table shows, for every seasoning,
the speed-up of the one-step route that holds it alone over the base route, as measured
during the search: which ONNX Runtime options matter on these models.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import onnx
import onnxruntime as ort

import routetune
from routetune.plugin_manager import load_registry
from routetune.routes.route import parse_route
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/bench"))
    parser.add_argument("--models", default="ppocr-det,ppocr-rec,ppocr-cls")
    args = parser.parse_args()
    registry = load_registry()
    rows, effects = [], {}
    for name in args.models.split(","):
        started = time.perf_counter()
        result = tune(RunSpec(example=name, output=args.out / name, fresh=True), registry)
        wall = time.perf_counter() - started
        measured = [t for t in result.trials if t.latency]
        last = result.confirmations[-1] if result.confirmations else None  # the one held,
        base, win = ((last.base_latency, last.latency) if last  # or the last tried
                     else (result.base.latency, result.base.latency))
        rows.append({
            "model": name, "space": result.space_size, "trials": len(measured),
            "wall_s": round(wall, 1), "base_p50_ms": round(base.p50, 3),
            "winner_p50_ms": round(win.p50, 3), "speedup": round(base.p50 / win.p50, 3),
            "winner": result.winner.route,
        })
        for t in measured:
            route = parse_route(t.route)
            if len(route) == 1:
                effects.setdefault(t.route, {})[name] = round(t.speedup, 3)
    print(f"routetune {routetune.__version__}, onnxruntime {ort.__version__}, onnx "
          f"{onnx.__version__}, Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}")
    print("\n| model | space | trials | wall s | base p50 ms | winner p50 ms | speed-up | winner |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['space']} | {r['trials']} | {r['wall_s']} | "
              f"{r['base_p50_ms']} | {r['winner_p50_ms']} | {r['speedup']:.2f}x | "
              f"`{r['winner']}` |")
    models = [r["model"] for r in rows]
    print("\nOne-step routes, speed-up over the base route (search measurement):\n")
    print("| route | " + " | ".join(models) + " |")
    print("|---|" + "---|" * len(models))
    for route in sorted(effects):
        cells = [f"{effects[route].get(m, float('nan')):.2f}x" for m in models]
        print(f"| `{route}` | " + " | ".join(cells) + " |")
    (args.out / "benchmark.json").write_text(json.dumps({"rows": rows, "effects": effects},
                                                        indent=2))


if __name__ == "__main__":
    main()
