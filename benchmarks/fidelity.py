"""Fidelity: does a verdict hold when the machine is measured again, quiet or busy?

Usage:

    python benchmarks/fidelity.py quiet [--out DIR] [--runs 5] [--examples ppocr-cls,ppocr-det]
    python benchmarks/fidelity.py load  [--out DIR] [--runs 5] [--modes wait,warn,ignore]
    python benchmarks/fidelity.py gpu   [--out DIR] [--runs 3]   # on a GPU machine

Every run is the real ``routetune tune`` command in a subprocess, with a fresh output
directory, over one stated space (`SPACE`, one-at-a-time: each seasoning and each
parameter value alone; the ONNX Runtime session options that react to contention,
``ort-no-spinning`` among them, are in it). Results go to ``DIR/<command>.json``.

- ``quiet``: `--runs` runs per example one after another on this machine. It reports
  each run's winner and its confirmed speed-up with its 95% interval, and whether the
  runs agree (the same winner, or the base route standing each time).
- ``load``: the main job's model (PP-OCRv4 det) with each ``--busy-machine`` mode while
  a load generator (`load`: a child process that keeps every core busy with a duty
  cycle redrawn every `PHASE_S` seconds from `DUTIES`) runs for the length of the
  search; the benchmark ends it. Then each shipped winner (a route other than the base)
  is re-measured against the base route on the quiet machine, with ``tune --recipe
  OUTDIR/winner.toml`` (a confirmation in a fresh process; its records go to
  ``OUTDIR/runs/<time>/``). A false win is a shipped winner whose quiet speed-up interval
  does not lie above 1. It reports the false wins per mode and how long ``wait`` waited.
- ``gpu``: the same two checks on ppocr-cls with ``--backend onnxruntime-cuda``, the
  load being a second process running a CuPy matmul loop on the same GPU.

The machine's load average is recorded before and after every run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SPACE = ("fuse-bn-into-conv,eliminate-noops,fold-constants,ort-no-spinning,ort-threads,"
         "ort-opt-level,ort-parallel")
"""The seasonings searched (one-at-a-time): the CPU session options and exact rewrites."""

GPU_SPACE = "fuse-bn-into-conv,fold-constants,ort-cuda-graph,ort-cuda-nhwc,ort-cuda-no-tf32"

PHASE_S = 8.0
"""Seconds each duty cycle of the load generator lasts."""

DUTIES = (0.0, 0.5, 1.0)
"""The load generator's duty cycles (fraction of each 100 ms a core spins)."""


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def spin(duties: list[float], seed: int) -> None:
    """One core's load: busy for duty x 100 ms of every 100 ms, redrawn every PHASE_S.

    Every core gets the same seed, so all cores change duty together.
    """
    rng = random.Random(seed)
    while True:
        duty = rng.choice(duties)
        end = time.time() + PHASE_S
        while time.time() < end:
            t0 = time.time()
            while time.time() - t0 < 0.1 * duty:
                pass
            time.sleep(max(0.0, 0.1 * (1 - duty)))


def start_load(seed: int) -> list[multiprocessing.Process]:
    procs = [multiprocessing.Process(target=spin, args=(list(DUTIES), seed), daemon=True)
             for i in range(os.cpu_count() or 1)]
    for p in procs:
        p.start()
    return procs


def gpu_load() -> subprocess.Popen[bytes]:
    code = ("import cupy as cp\na = cp.random.rand(8192, 8192, dtype=cp.float32)\n"
            "while True:\n    b = a @ a\n    cp.cuda.Device().synchronize()\n")
    return subprocess.Popen([sys.executable, "-c", code])


def tune(args: list[str], out: Path) -> dict[str, Any]:
    """Run ``routetune tune`` and read back what it decided."""
    before = loadavg()
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "routetune", "tune", *args, "--output",
                           str(out), "--fresh"], capture_output=True, text=True)
    wall = time.time() - t0
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"],
                "wall_s": wall}
    return summarise(out, wall, before)


def summarise(records: Path, wall: float, before: list[float]) -> dict[str, Any]:
    run = json.loads((records / "run.json").read_text())
    result = run["result"]
    confirmed = result.get("confirmed")
    return {"winner": result["winner"], "reason": result["reason"],
            "confirmed": confirmed and {k: confirmed[k] for k in (
                "speedup", "speedup_ci", "p50_ms", "base_p50_ms")},
            "search": result.get("search"), "confirmations": [
                {"route": c["route"], "search": c["search_speedup"],
                 "confirmed": c["paired"]["value"], "ci": [c["paired"]["ci_low"],
                                                           c["paired"]["ci_high"]]}
                for c in result.get("confirmations", [])],
            "noisy": run["conditions"]["noisy"], "measured": run["conditions"]["measured"],
            "waited_s": run["conditions"]["waited_s"], "wall_s": round(wall, 1),
            "loadavg_before": before, "loadavg_after": loadavg()}


def remeasure(out: Path) -> dict[str, Any]:
    """Re-measure a shipped winner against the base route, in place (records dated)."""
    before = loadavg()
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "routetune", "tune", "--recipe",
                           str(out / "winner.toml"), "--busy-machine", "ignore"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-300:]}
    dated = sorted((out / "runs").iterdir())[-1]
    got = summarise(dated, time.time() - t0, before)
    c = got["confirmations"]
    got["false_win"] = not c or c[0]["ci"][0] <= 1.0
    return got


def quiet(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for example in args.examples.split(","):
        rows[example] = []
        for i in range(args.runs):
            got = tune(["--example", example, "--search", "one-at-a-time", "--seasonings",
                        SPACE], args.out / f"quiet-{example}-{i}")
            print(example, i, json.dumps(got), flush=True)
            rows[example].append(got)
    agree = {ex: len({r.get("winner") for r in runs}) == 1 for ex, runs in rows.items()}
    return {"runs": rows, "same_winner_every_run": agree}


def load(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for mode in args.modes.split(","):
        rows[mode] = []
        for i in range(args.runs):
            out = args.out / f"load-{mode}-{i}"
            procs = start_load(seed=1000 * i + len(mode))
            try:
                got = tune(["--example", "ppocr-det", "--search", "one-at-a-time",
                            "--seasonings", args.space, "--busy-machine", mode], out)
            finally:
                for p in procs:
                    p.kill()
                    p.join()
            time.sleep(3)
            if got.get("winner") not in (None, "base"):
                got["quiet_recheck"] = remeasure(out)
            print(mode, i, json.dumps(got), flush=True)
            rows[mode].append(got)
    false_wins = {m: sum(bool(r.get("quiet_recheck", {}).get("false_win")) for r in runs)
                  for m, runs in rows.items()}
    waited = {m: [r.get("waited_s") for r in runs] for m, runs in rows.items()}
    return {"runs": rows, "false_wins": false_wins, "waited_s": waited,
            "load": {"duties": DUTIES, "phase_s": PHASE_S, "cores": os.cpu_count()}}


def gpu(args: argparse.Namespace) -> dict[str, Any]:
    base = ["--example", "ppocr-cls", "--backend", "onnxruntime-cuda", "--search",
            "one-at-a-time", "--seasonings", GPU_SPACE, "--accuracy",
            "cos>=0.9999,rel_l2<=0.01"]
    rows: dict[str, list[dict[str, Any]]] = {"quiet": []}
    for i in range(args.runs if args.quiet_runs is None else args.quiet_runs):
        got = tune(base, args.out / f"gpu-quiet-{i}")
        print("quiet", i, json.dumps(got), flush=True)
        rows["quiet"].append(got)
    for mode in filter(None, args.modes.split(",")):
        rows[mode] = []
        for i in range(args.runs):
            out = args.out / f"gpu-load-{mode}-{i}"
            hog = gpu_load()
            time.sleep(3)
            try:
                got = tune([*base, "--busy-machine", mode], out)
            finally:
                hog.kill()
                hog.wait()
            if got.get("winner") not in (None, "base"):
                got["quiet_recheck"] = remeasure(out)
            print(mode, i, json.dumps(got), flush=True)
            rows[mode].append(got)
    return {"runs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("quiet", "load", "gpu"))
    parser.add_argument("--out", type=Path, default=Path("fidelity-out"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--examples", default="ppocr-cls,ppocr-det")
    parser.add_argument("--modes", default="wait,warn,ignore")
    parser.add_argument("--space", default=SPACE,
                        help="load: the seasonings searched (one at a time)")
    parser.add_argument("--quiet-runs", type=int, default=None,
                        help="gpu: quiet runs (default: --runs)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result = {"command": args.command, "machine": {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "python": platform.python_version()}, "loadavg_at_start": loadavg(),
        **globals()[args.command](args)}
    result["wall_s"] = round(time.time() - started, 1)
    (args.out / f"{args.command}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
