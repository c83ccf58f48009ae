"""Worker benchmarks: the tuner's own overhead, parallel builds, one measurer per GPU.

Usage:

    python benchmarks/workers.py overhead [--out DIR] [--trials 50] [--example ppocr-cls]
    python benchmarks/workers.py build-workers [--out DIR] [--repeats 2] [--trials 24]
    python benchmarks/workers.py gpus [--out DIR] [--repeats 2] [--ray]  # 2+ GPUs, onnxruntime-gpu

Each runs the real ``routetune tune`` command in a subprocess, with a fresh output
directory per run, and reads back what it wrote: the trial store and the phase timeline
(``artifacts/timeline.jsonl``: every build and measure phase with its start and end as
the worker saw them). Results are printed and written to ``DIR/<command>.json``.

- ``overhead``: a beam search of `--trials` trials of a bundled example (default: the
  PP-OCR direction classifier, the smallest) on this CPU, default measurement
  settings. Overhead = wall time of the command minus the time some worker spent in a
  build, measure or final-timing phase (the union of the timeline's intervals). It
  includes Python start-up, model preparation, the FP32 reference outputs, worker
  start-up, scheduling and the reports: everything but building, measuring and checking.
- ``build-workers``: a search whose builds dominate (INT8 Q/DQ with calibration, FP16
  conversion and graph rewrites of the PP-OCR recognizer, 0.2 s of timing per
  candidate), with ``--build-workers 1`` and ``2`` in alternation (1, 2, 1, 2 …). It
  reports the wall-time ratio, that the winners agree, and the median width of the
  95% confidence intervals of the trials' relative p50 in each configuration (builds
  never overlap measurement on a CPU, so parallel builds must not widen them).
- ``gpus``: ResNet-50 (torchvision, random weights, batch 32) on ``onnxruntime-cuda``,
  the 16 routes of {fp16, ort-cuda-nhwc, ort-cuda-graph, ort-cuda-no-tf32}, searched
  exhaustively with ``CUDA_VISIBLE_DEVICES=0`` and with every GPU, in alternation. It
  reports the wall-time ratio, the winners, and how long two measuring workers ran at
  once (from the timeline). With ``--ray``, a third configuration in the alternation:
  ``--executor ray`` on every GPU, on a one-machine Ray cluster started for it with as
  many CPUs as the local pool has build workers (``ray start --head --num-cpus 4``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GPU_SEASONINGS = "fp16,ort-cuda-nhwc,ort-cuda-graph,ort-cuda-no-tf32"
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
"""Ray's command line, also where Ray is installed with ``pip --target`` (no ``ray`` script)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["overhead", "build-workers", "gpus"])
    parser.add_argument("--out", type=Path, default=Path("workers-bench"))
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--example", default="ppocr-cls", help="overhead: the model")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ray", action="store_true", help="gpus: also --executor ray")
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="gpus: seconds of timing per candidate (routetune's default: 1)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"overhead": overhead, "build-workers": build_workers, "gpus": gpus}[
        args.command](args)
    result["machine"] = machine()
    path = args.out / {"gpus": f"gpus-{args.min_time:g}s.json",
                       "overhead": f"overhead-{args.example}.json"}.get(
        args.command, f"{args.command}.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def tune(out: Path, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``routetune tune`` into a fresh `out`; its wall time, trials and timeline."""
    started, started_at = time.perf_counter(), time.time()
    done = subprocess.run([sys.executable, "-m", "routetune", "tune", "--output", str(out),
                           "--fresh", *flags], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall, ended_at = time.perf_counter() - started, time.time()
    if done.returncode != 0:
        raise SystemExit(f"routetune tune failed ({done.returncode}): {done.stderr[-2000:]}")
    timeline = [json.loads(line) for line in
                (out / "artifacts" / "timeline.jsonl").read_text().splitlines()]
    with sqlite3.connect(out / "trials.sqlite") as conn:
        rows = conn.execute("SELECT route, status, latency, base_latency FROM trials").fetchall()
    trials = [{"route": r, "status": s, "latency": json.loads(lat) if lat else None,
               "base_latency": json.loads(base) if base else None} for r, s, lat, base in rows]
    winner = json.loads((out / "winner.json").read_text())["route"]
    return {"wall_s": wall, "timeline": timeline, "trials": trials, "winner": winner,
            "started_at": started_at, "ended_at": ended_at}


def busy_s(timeline: list[dict[str, Any]]) -> float:
    """Seconds in which at least one worker ran a phase (union of the intervals)."""
    total, end = 0.0, float("-inf")
    for e in sorted(timeline, key=lambda e: e["start"]):
        if e["end"] > end:
            total += e["end"] - max(e["start"], end)
            end = e["end"]
    return total


def overlap_s(timeline: list[dict[str, Any]], phase: str) -> float:
    """Seconds in which two or more `phase` phases ran at once."""
    edges = sorted([(e["start"], 1) for e in timeline if e["phase"] == phase]
                   + [(e["end"], -1) for e in timeline if e["phase"] == phase])
    total, running, last = 0.0, 0, 0.0
    for t, step in edges:
        if running >= 2:
            total += t - last
        running, last = running + step, t
    return total


def ci_widths(trials: list[dict[str, Any]]) -> list[float]:
    """Per measured trial: the 95% CI width of its p50, relative to its base p50."""
    return [(t["latency"]["ci_high"] - t["latency"]["ci_low"]) / t["base_latency"]["p50"]
            for t in trials if t["latency"] and t["base_latency"]]


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    run = tune(args.out / f"overhead-{args.example}", "--example", args.example, "--search",
               "beam", "--max-trials", str(args.trials))
    busy = busy_s(run["timeline"])
    first = min(e["start"] for e in run["timeline"])
    last = max(e["end"] for e in run["timeline"])
    phases = [e["end"] - e["start"] for e in run["timeline"]]
    row = {
        "trials": len(run["trials"]), "wall_s": round(run["wall_s"], 2),
        "in_phases_s": round(busy, 2), "overhead_s": round(run["wall_s"] - busy, 2),
        "overhead_share": round((run["wall_s"] - busy) / run["wall_s"], 4),
        "gaps_between_phases_s": round((last - first) - busy, 2),
        "before_first_phase_s": round(first - run["started_at"], 2),
        "after_last_phase_s": round(run["ended_at"] - last, 2), "model": args.example,
        "phases": len(phases), "median_phase_s": round(statistics.median(phases), 3),
        "winner": run["winner"],
    }
    print(json.dumps(row, indent=2))
    return row


def build_workers(args: argparse.Namespace) -> dict[str, Any]:
    flags = ["--example", "ppocr-rec", "--seasonings",
             "int8-qdq,fp16,fold-constants,fuse-bn-into-conv,eliminate-noops",
             "--search", "exhaustive", "--max-depth", "2", "--max-trials", str(args.trials),
             "--min-time", "0.2", "--min-runs", "10"]
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for i in range(args.repeats):
        for n in (1, 2):
            run = tune(args.out / f"build-{n}-{i}", *flags, "--build-workers", str(n))
            runs[n].append(run)
            print(f"--build-workers {n}, run {i}: {run['wall_s']:.1f} s, {len(run['trials'])} "
                  f"trials, winner {run['winner']}")
    pairs = [runs[2][i]["wall_s"] / runs[1][i]["wall_s"] for i in range(args.repeats)]
    result = {
        "wall_s": {n: [round(r["wall_s"], 2) for r in rs] for n, rs in runs.items()},
        "ratio_2_over_1": [round(p, 3) for p in pairs],
        "speedup_median": round(1 / statistics.median(pairs), 3),
        "winners": {n: [r["winner"] for r in rs] for n, rs in runs.items()},
        "trials": len(runs[1][0]["trials"]),
        "build_overlap_s": {n: [round(overlap_s(r["timeline"], "build"), 1) for r in rs]
                            for n, rs in runs.items()},
        "median_ci_width": {n: round(statistics.median(
            w for r in rs for w in ci_widths(r["trials"])), 4) for n, rs in runs.items()},
        "build_s": {n: [round(sum(e["end"] - e["start"] for e in r["timeline"]
                                  if e["phase"] == "build"), 1) for r in rs]
                    for n, rs in runs.items()},
    }
    print(json.dumps(result, indent=2))
    return result


def gpus(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from gpu import build_model  # the GPU benchmark's ResNet-50 export

    _, model, inputs = build_model("resnet50", args.out)
    count = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
                .stdout.splitlines())
    all_gpus = ",".join(str(i) for i in range(count))
    flags = [str(model), "--inputs", str(inputs), "--backend", "onnxruntime-cuda",
             "--seasonings", GPU_SEASONINGS, "--search", "exhaustive", "--max-depth", "4",
             "--max-trials", "16", "--min-time", str(args.min_time),
             "--accuracy", "cos>=0.9999,rel_l2<=0.01"]
    runs: dict[str, list[dict[str, Any]]] = {"0": [], all_gpus: []}
    if args.ray:
        runs["ray"] = []
        started = subprocess.run([*RAY_CLI, "start", "--head", "--num-cpus", "4",
                                  "--include-dashboard=false", "--disable-usage-stats"],
                                 capture_output=True, text=True,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        if started.returncode:
            raise SystemExit(f"ray start failed: {started.stderr[-2000:]}")
    for i in range(args.repeats):
        for visible in runs:
            extra, env = ["--build-workers", "4"], {"CUDA_VISIBLE_DEVICES": visible}
            if visible == "ray":  # every GPU; builds: the cluster's 4 CPUs
                extra = ["--executor", "ray", "--ray-address", "auto"]
                env = {"RAY_AUTH_MODE": "disabled"}
            run = tune(args.out / f"gpus-{visible.replace(',', '')}-{args.min_time:g}s-{i}",
                       *flags, *extra, env=env)
            runs[visible].append(run)
            by_gpu = {}
            for e in run["timeline"]:
                if e["phase"] == "measure":
                    by_gpu[e["gpu"]] = by_gpu.get(e["gpu"], 0) + 1
            print(f"CUDA_VISIBLE_DEVICES={visible}, run {i}: {run['wall_s']:.1f} s, "
                  f"{len(run['trials'])} trials, winner {run['winner']}, measure phases "
                  f"per GPU {by_gpu}, two measuring at once "
                  f"{overlap_s(run['timeline'], 'measure'):.1f} s")
    if args.ray:
        subprocess.run([*RAY_CLI, "stop"], capture_output=True)
    one, many = runs["0"], runs[all_gpus]
    pairs = [many[i]["wall_s"] / one[i]["wall_s"] for i in range(args.repeats)]
    result = {
        "gpus": count, "min_time_s": args.min_time,
        "ray_over_local": [round(runs["ray"][i]["wall_s"] / many[i]["wall_s"], 3)
                           for i in range(args.repeats)] if args.ray else None,
        "wall_s": {k: [round(r["wall_s"], 2) for r in v] for k, v in runs.items()},
        "ratio_many_over_one": [round(p, 3) for p in pairs],
        "winners": {k: [r["winner"] for r in v] for k, v in runs.items()},
        "measure_overlap_s": {k: [round(overlap_s(r["timeline"], "measure"), 1) for r in v]
                              for k, v in runs.items()},
        "measure_s": {k: [round(sum(e["end"] - e["start"] for e in r["timeline"]
                                    if e["phase"] == "measure"), 1) for r in v]
                      for k, v in runs.items()},
        "trials": {k: [len(r["trials"]) for r in v] for k, v in runs.items()},
    }
    print(json.dumps(result, indent=2))
    return result


def machine() -> dict[str, Any]:
    """CPU, GPUs and versions of this machine."""
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout \
        if os.path.exists("/usr/bin/nvidia-smi") else ""
    import onnxruntime

    return {"cpu": cpu, "cores": os.cpu_count(), "gpus": gpus.strip().splitlines(),
            "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "date": time.strftime("%Y-%m-%d")}


if __name__ == "__main__":
    main()
