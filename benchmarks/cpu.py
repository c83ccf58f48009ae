"""The CPU benchmark (issue 17): ONNX Runtime and OpenVINO in one search, against Olive.

Usage: python benchmarks/cpu.py [--out DIR] [--models ppocr-cls,ppocr-rec,ppocr-det]
                                [--backend onnxruntime,openvino] [--seasonings a,b]
                                [--min-time 0.5] [--time-budget S] [--loops 3]

For each PP-OCR example, in one process:

1. ``routetune tune --example NAME --backend onnxruntime,openvino --fresh``: each backend
   searched with its defaults (every applicable seasoning, beam search) under the
   example's task constraint, then both backends' winners timed side by side
   (`routetune.run.backends`). Its wall time is the tuning time.
2. ``--loops`` interleaved timing loops (`routetune.timing.measure.measure_blocks`, paired
   blocks in ABBA order), each in a fresh process, on **held-out** inputs (the example's
   generator at seed 1; the search calibrated and validated on seed 0) of: ONNX
   Runtime's defaults, Olive's best setting (``intra_op_num_threads=1``: what Olive 0.13
   found for these models, issue 17), OpenVINO's defaults, and routetune's winner. Every
   ratio is over ONNX Runtime's defaults, the loops' figures combined by
   `routetune.timing.measure.across_repeats` (one loop is not enough: docs/benchmarks.md).
3. The winner's outputs on the held-out inputs against the FP32 reference (ONNX
   Runtime's CPU provider, optimisations off), under the example's task constraint.

It prints one table and writes ``cpu.json`` (with the CPU, its flags and the load
average before and after) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from pathlib import Path
from typing import Any

OLIVE = {"onnxruntime.intra_op_num_threads": 1}
"""Olive 0.13's best setting for the PP-OCR models (issue 17: cls 1.278 -> 0.908 ms)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/cpu-bench"))
    parser.add_argument("--models", default="ppocr-cls,ppocr-rec,ppocr-det")
    parser.add_argument("--backend", default="onnxruntime,openvino")
    parser.add_argument("--seasonings", default="",
                        help="restrict the space (comma-separated); every one by default")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="routetune's --time-budget (s), for each backend's search")
    parser.add_argument("--min-time", type=float, default=0.5,
                        help="seconds per engine in the side-by-side loop, at least")
    parser.add_argument("--loops", type=int, default=3,
                        help="held-out loops, each in a fresh process, combined")
    args = parser.parse_args()
    import onnxruntime as ort
    import openvino as ov

    import routetune
    from routetune.plugin_manager import load_registry
    from routetune.run.runinfo import cpu_flags

    registry = load_registry()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": {"cpu": registry.backend("onnxruntime")(None).device(),
                    "cores": os.cpu_count(), "flags": cpu_flags(),
                    "python": platform.python_version(), "routetune": routetune.__version__,
                    "onnxruntime": ort.__version__, "openvino": ov.__version__,
                    "load_before": os.getloadavg()},
        "models": {}}
    for name in args.models.split(","):
        row = bench(name, args, registry)
        report["models"][name] = row
        (args.out / "cpu.json").write_text(json.dumps(report, indent=2, default=str))
        print(name, json.dumps({k: v for k, v in row.items() if k != "rows"}), flush=True)
        for label, figure in row["rows"].items():
            print(f"  {label:40s} {figure}", flush=True)
    report["machine"]["load_after"] = os.getloadavg()
    (args.out / "cpu.json").write_text(json.dumps(report, indent=2, default=str))


def bench(name: str, args: argparse.Namespace, registry: Any) -> dict[str, Any]:
    """Tune one example on both backends, then time the four engines side by side."""
    from routetune.feeds.examples import fetch, get_example, load_inputs
    from routetune.judging.accuracy import check_accuracy, parse_accuracy
    from routetune.run.backends import tune_backends
    from routetune.run.run_spec import RunSpec
    from routetune.timing.measure import across_repeats, paired_speedup

    example = get_example(name)
    model = fetch(name)
    started = time.perf_counter()
    seasonings = tuple(args.seasonings.split(",")) if args.seasonings else None
    result = tune_backends(RunSpec(example=name, backend=args.backend, fresh=True,
                                   seasonings=seasonings, output=args.out / name,
                                   time_budget_s=args.time_budget), registry)
    tuning_s = time.perf_counter() - started
    held_out = load_inputs(name, seed=1)
    winner_json = json.loads((result.outdir / "winner.json").read_text())
    engines = {
        "onnxruntime defaults": ("onnxruntime", model, {}),
        "Olive's best (intra_op_num_threads=1)": ("onnxruntime", model, OLIVE),
        "openvino defaults": ("openvino", model, {}),
        f"routetune: {result.winner.name}": (winner_json["backend"],
                                             result.outdir / "winner.onnx",
                                             winner_json["settings"]),
    }
    labels = list(engines)
    jobs = [(b, str(path), options) for b, path, options in engines.values()]
    loops = []
    for _ in range(args.loops):  # each loop in a fresh process (docs/benchmarks.md,
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # "One loop is not enough")
            loops.append(pool.apply(held_out_loop, (name, jobs, args.min_time,
                                                    str(args.out / name))))
    rows = {}

    def over(i: int, base: int) -> Any:
        return across_repeats([paired_speedup(blocks, i, base) for _, blocks, _ in loops])

    for i, label in enumerate(labels):
        p = over(i, 0)
        p50 = sorted(lat[i] for lat, _, _ in loops)[len(loops) // 2]
        rows[label] = (f"p50 {p50:.3f} ms, {p.value:.2f}x [{p.ci_low:.2f}, {p.ci_high:.2f}]"
                       f" ({len(loops)} loops: " + ", ".join(
                           f"{paired_speedup(b, i, 0).value:.2f}x" for _, b, _ in loops) + ")")
    reference_backend = registry.backend("onnxruntime")(None)
    with reference_backend.reference(model) as ref:
        references = [ref.infer(feed) for feed in held_out]
    outputs = loops[0][2]
    constraint = parse_accuracy(example.accuracy or "", registry, list(references[0]))
    verdict = check_accuracy(constraint, registry, outputs, references)
    winner_p = over(len(labels) - 1, 0)
    olive_p = over(len(labels) - 1, 1)
    return {
        "tuning_s": round(tuning_s, 1), "time_budget_s": args.time_budget,
        "trials": {r.base.backend: len(r.trials) for r in result.runs},
        "winner": result.winner.name, "reason": result.reason,
        "speedup_over_ort": round(winner_p.value, 3),
        "speedup_ci": [round(winner_p.ci_low, 3), round(winner_p.ci_high, 3)],
        "over_olive": round(olive_p.value, 3),
        "over_olive_ci": [round(olive_p.ci_low, 3), round(olive_p.ci_high, 3)],
        "held_out": {"sets": len(held_out), "constraint": constraint.text,
                     "passed": verdict.passed, "reason": verdict.reason},
        "rows": rows,
    }


def held_out_loop(name: str, jobs: list[tuple[str, str, dict[str, Any]]], min_time_s: float,
                  workdir: str) -> tuple[list[float], list[Any], list[dict[str, Any]]]:
    """Open the engines and time them in one interleaved loop on the held-out inputs.

    Runs in a fresh process. Returns each engine's p50 (ms), the loop's blocks, and the
    last engine's outputs on every held-out input set.
    """
    from routetune.feeds.examples import load_inputs
    from routetune.plugin_manager import load_registry
    from routetune.timing.measure import MeasureSettings, measure_blocks

    registry = load_registry()
    held_out = load_inputs(name, seed=1)
    runners = []
    for backend_name, path, options in jobs:
        backend = registry.backend(backend_name)(None)
        settings = backend.full_settings(options)
        runners.append(backend.open(backend.build(Path(path), settings, Path(workdir))))
    settings = MeasureSettings(warmup=5, min_runs=30, min_time_s=min_time_s, min_blocks=30)
    try:
        latencies, blocks = measure_blocks(runners, held_out, settings)
        outputs = [runners[-1].infer(feed) for feed in held_out]
    finally:
        for runner in runners:
            runner.close()
    return [lat.p50 for lat in latencies], blocks, outputs


if __name__ == "__main__":
    main()
