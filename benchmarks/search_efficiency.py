"""Search efficiency on the GPU: exhaustive, beam (width 3) and mixed over one space.

Usage, on a machine with a CUDA GPU, onnxruntime-gpu, CuPy and torch (+ torchvision):

    python benchmarks/search_efficiency.py [--models resnet50,bert]
        [--strategies exhaustive,beam,mixed] [--out DIR] [--plan] [--min-time 0.2] [--resume]

For each model (built as in ``benchmarks/gpu.py``), one route space (`SPACES`: the
seasonings that matter on it, every parameter value, routes up to `MAX_DEPTH` steps) is
searched by each strategy in a folder of its own, so that each counts its own builds.
Every search runs in-process (``--in-process``): builds and timings take turns, so that
no build worker makes CUDA sessions while a candidate is timed.

Exhaustive measures every route. A strategy's winner is scored by what exhaustive
measured for the same route (one run, one set of conditions) as a fraction of the best
accurate route exhaustive measured: the target is within 3% (a fraction of at least
0.97), with at most 25% of exhaustive's builds for beam and 40% for mixed. ``--plan``
prints each strategy's planned trial count and exits, building nothing.

Writes ``search_efficiency.json`` into ``--out`` after each strategy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu import ACCURACY, build_model, builds  # noqa: E402

SPACES = {
    "resnet50": ("fp16", "ort-cuda-graph", "ort-cuda-nhwc", "ort-cuda-fuse-conv-bias",
                 "ort-cuda-conv-algo", "fuse-bn-into-conv"),
    "mobilenetv3": ("fp16", "ort-cuda-graph", "ort-cuda-nhwc", "ort-cuda-fuse-conv-bias",
                    "ort-cuda-conv-algo", "fuse-bn-into-conv"),
    "convnext": ("fp16", "ort-cuda-graph", "ort-cuda-nhwc", "ort-cuda-fuse-conv-bias",
                 "ort-cuda-conv-algo", "fuse-bn-into-conv"),
    "efficientnet": ("fp16", "ort-cuda-graph", "ort-cuda-nhwc", "ort-cuda-fuse-conv-bias",
                     "ort-cuda-conv-algo", "fuse-bn-into-conv"),
    "bert": ("fuse-attention", "ort-transformer-fusion", "fp16", "ort-cuda-graph",
             "ort-cuda-sdpa-kernel"),
}
"""The route space per model: the seasonings measured to matter on it (docs/benchmarks.md,
"Every CUDA provider option, alone, per model" and the fusion sections)."""

MAX_DEPTH = 4
BEAM_WIDTH = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/search-efficiency"))
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--strategies", default="exhaustive,beam,mixed")
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--plan", action="store_true", help="print planned trials, build nothing")
    parser.add_argument("--resume", action="store_true",
                        help="continue each strategy's stored trials (its wall_s then counts "
                             "only this part, and the row says resumed)")
    args = parser.parse_args()
    from routetune.plugin_manager import load_registry
    from routetune.timing.measure import MeasureSettings

    registry = load_registry()
    settings = MeasureSettings(warmup=10, min_runs=30, min_time_s=args.min_time)
    path = args.out / "search_efficiency.json"
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for name in args.models.split(","):
        (args.out / name).mkdir(parents=True, exist_ok=True)
        _, model, inputs = build_model(name, args.out / name)
        for strategy in args.strategies.split(","):
            row = run(registry, name, model, inputs, strategy, settings, args)
            report.setdefault(name, {})[strategy] = row
            print(name, strategy, json.dumps({k: v for k, v in row.items()
                                              if k != "trials"}), flush=True)
            if not args.plan:
                path.write_text(json.dumps(report, indent=2))
        if not args.plan and "exhaustive" in report.get(name, {}):
            score(report[name])
            path.write_text(json.dumps(report, indent=2))
            print(name, json.dumps({s: {k: r.get(k) for k in
                                        ("builds", "wall_s", "winner", "fraction_of_best",
                                         "builds_fraction")}
                                    for s, r in report[name].items()}), flush=True)


def run(registry: Any, name: str, model: Path | None, inputs: Path | None, strategy: str,
        settings: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Tune with one strategy; its trials by route, builds and wall time."""
    from routetune.run.preparation import prepare_run
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import plan, tune

    opts = RunSpec(model=model, output=args.out / name / strategy, backend="onnxruntime-cuda",
                   search=strategy, max_depth=MAX_DEPTH,
                   **({"beam_width": BEAM_WIDTH} if strategy == "beam" else {}),
                   seasonings=SPACES[name], accuracy=ACCURACY, inputs=inputs,
                   # exhaustive's table holds every route's full figure (no racing);
                   # it teaches no route memory (benchmarks/replay_search.py reads tables)
                   measure=(dataclasses.replace(settings, race=False)
                            if strategy == "exhaustive" else settings),
                   memory="off" if strategy == "exhaustive" else None,
                   in_process=True, fresh=not args.resume)
    if args.plan:
        prepared = prepare_run(opts, registry)
        strat = registry.strategy(strategy)(prepared.space, prepared.strategy_options)
        return {"space": prepared.space.size(), "planned": str(plan(strat, prepared, opts))}
    started = time.perf_counter()
    result = tune(opts, registry)
    wall = time.perf_counter() - started
    trials = {t.route: {"status": t.status, "speedup": t.speedup,
                        "ci": [t.paired.ci_low, t.paired.ci_high] if t.paired else None}
              for t in result.trials}
    confirmed = result.confirmed
    return {"space": result.space_size, "builds": builds(result.trials), "wall_s": round(wall, 1),
            "resumed": args.resume,
            "winner": result.winner.route,
            "confirmed": confirmed.paired.value if confirmed else 1.0,
            "trials": trials}


def score(rows: dict[str, Any]) -> None:
    """Each strategy's winner as exhaustive measured it, over exhaustive's best."""
    every = rows["exhaustive"]["trials"]
    accurate = {r: t["speedup"] for r, t in every.items()
                if t["status"] == "ok" and t["speedup"] is not None}
    best_route = max(accurate, key=accurate.__getitem__)
    for row in rows.values():
        found = accurate.get(row["winner"], 1.0 if row["winner"] == "base" else None)
        row["best_route"], row["best"] = best_route, accurate[best_route]
        row["as_exhaustive_measured"] = found
        row["fraction_of_best"] = None if found is None else round(found / accurate[best_route], 3)
        row["builds_fraction"] = round(row["builds"] / rows["exhaustive"]["builds"], 3)


if __name__ == "__main__":
    main()
