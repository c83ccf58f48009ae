"""Tune each example model with the precision seasonings only and report what won.

Usage: python benchmarks/precision_cpu.py [--out DIR] [--models ppocr-det,...]
                                          [--accuracy EXPR]

For each model: an exhaustive search over ``fp16``, ``bf16``, ``int8-qdq``,
``fp8-qdq`` and ``precision-repair`` on the ONNX Runtime CPU provider, with the given
accuracy constraint (the CLI's default unless set). It prints the FP32 base route's p50,
the best accurate route's p50 (both from the final side-by-side re-measurement when a
route other than the base was best), which precision won, every precision route's
verdict, and what the range analysis did before anything was built: nodes it kept in
FP32, and candidates it made identical to another (skipped, never built or measured).
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
from routetune.display import verdict_text
from routetune.judging.accuracy import DEFAULT_ACCURACY
from routetune.plugin_manager import load_registry
from routetune.records.trial import Trial
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune

SEASONINGS = ("fp16", "bf16", "int8-qdq", "fp8-qdq", "precision-repair")
RANGE_KEEPS = ("kept_data_max", "kept_init_range", "kept_partial_sums")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/precision-bench"))
    parser.add_argument("--models", default="ppocr-det,ppocr-rec,ppocr-cls,silero-vad")
    parser.add_argument("--accuracy", default=DEFAULT_ACCURACY)
    args = parser.parse_args()
    registry = load_registry()
    rows, verdicts = [], []
    for name in args.models.split(","):
        started = time.perf_counter()
        result = tune(RunSpec(example=name, output=args.out / name, fresh=True,
                              seasonings=SEASONINGS, search="exhaustive",
                              accuracy=args.accuracy), registry)
        wall = time.perf_counter() - started
        last = result.confirmations[-1] if result.confirmations else None  # the one held,
        base, best = ((last.base_latency, last.latency) if last  # or the last tried
                     else (result.base.latency, result.base.latency))
        kept = sum(int(p.get("stats", {}).get(k, 0)) for t in result.trials
                   if t.route == "fp16" for p in t.passes for k in RANGE_KEEPS)
        unbuilt = [t for t in result.trials if t.status == "skipped"
                   and t.reason.startswith("same model")
                   and any(not p.get("modified", True) for p in t.passes)]
        measured = [t for t in result.trials if t.latency]
        accurate = [t for t in measured if t.status == "ok" and t.route != "base"]
        rows.append({
            "model": name, "trials": len(measured), "wall_s": round(wall, 1),
            "base_p50_ms": round(base.p50, 3), "best_p50_ms": round(best.p50, 3),
            "speedup": round(result.winner_speedup, 3), "winner": result.winner.route,
            "winner_reason": result.winner_reason, "accurate_precision_routes": len(accurate),
            "fp16_nodes_kept_by_range": kept, "unbuilt_by_range": len(unbuilt),
            "build_and_measure_s_saved": round(len(unbuilt) * _mean_cost(measured), 1),
        })
        for t in result.trials:
            verdicts.append({"model": name, "route": t.route, "status": t.status,
                             "speedup": round(t.speedup, 3) if t.speedup else None,
                             "verdict": verdict_text(t, registry)[:240]})
    print(f"routetune {routetune.__version__}, onnxruntime {ort.__version__}, onnx "
          f"{onnx.__version__}, Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}; accuracy {args.accuracy}")
    print("\n| model | trials | wall s | FP32 base p50 ms | best accurate p50 ms | speed-up "
          "| winner | FP16 nodes kept FP32 by range | candidates not built |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['trials']} | {r['wall_s']} | {r['base_p50_ms']} | "
              f"{r['best_p50_ms']} | {r['speedup']:.2f}x | `{r['winner']}` | "
              f"{r['fp16_nodes_kept_by_range']} | {r['unbuilt_by_range']} "
              f"(~{r['build_and_measure_s_saved']} s) |")
    print("\n| model | route | status | speed-up | verdict |\n|---|---|---|---|---|")
    for v in verdicts:
        speed = f"{v['speedup']:.2f}x" if v["speedup"] else ""
        print(f"| {v['model']} | `{v['route']}` | {v['status']} | {speed} | {v['verdict']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmark.json").write_text(json.dumps({"rows": rows, "verdicts": verdicts},
                                                        indent=2))


def _mean_cost(trials: list[Trial]) -> float:
    """Mean seconds a built trial spent on build plus timing (its runs × p50), roughly."""
    costs = [(t.build_ms or 0) / 1e3 + t.latency.n * t.latency.p50 / 1e3 * 2
             for t in trials if t.latency]
    return sum(costs) / len(costs) if costs else 0.0


if __name__ == "__main__":
    main()
