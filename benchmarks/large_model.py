"""Models over 2 GiB (external data): wall time and peak memory of ``routetune tune``.

Usage:

    python benchmarks/large_model.py [--out DIR] [--layers 10] [--width 8192]

Writes a stack of ``--layers`` MatMuls of ``width x width`` float32 weights (256 MiB
each at the default width, 2.5 GiB in all), with Relu between them and one constant
``Transpose`` of the first weight (so that ``fold-constants`` has a 256 MiB tensor to
fold), as ``DIR/model/big.onnx`` plus ``big.onnx.data``. The data file is generated
layer by layer (never held whole); weights are N(0, 1/width), so activations stay near
1 and FP16 holds them.

Then it runs the real ``routetune tune`` command on it, on ONNX Runtime's CPU provider,
with the seasonings ``fold-constants`` and ``fp16`` (routes up to depth 2), and records:

- wall time of the command (s);
- peak RSS of the whole process tree (routetune and its workers), sampled from
  ``/proc`` every 0.1 s, and each process's peak RSS (the kernel's ``VmHWM``);
- each trial's status and reason, and the size of ``artifacts/models`` (the candidate
  models and their shared weights store) and of ``winner.onnx`` + ``winner.onnx.data``.

The target (real-models issue, kind 4) is a peak RSS at most 3x the model's size.
Results are printed and written to ``DIR/large_model.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper


def make_model(path: Path, layers: int, width: int) -> int:
    """Write the MatMul stack and its data file; the data's size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_name(path.name + ".data")
    rng = np.random.default_rng(0)
    initializers, nodes, offset = [], [], 0
    with open(data, "wb") as f:
        for i in range(layers):
            w = (rng.standard_normal((width, width), dtype=np.float32)
                 / np.float32(np.sqrt(width)))
            raw = w.tobytes()
            tensor = TensorProto(name=f"W{i}", data_type=TensorProto.FLOAT, dims=[width, width])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", str(offset)),
                               ("length", str(len(raw)))):
                tensor.external_data.add(key=key, value=value)
            f.write(raw)
            offset += len(raw)
            del w, raw
            initializers.append(tensor)
    x = "x"
    nodes.append(helper.make_node("Transpose", ["W0"], ["W0t"], name="t0", perm=[1, 0]))
    for i in range(layers):
        weight = "W0t" if i == 0 else f"W{i}"
        nodes.append(helper.make_node("MatMul", [x, weight], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "matmul_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return offset


def tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def memory(pid: int) -> tuple[int, int] | None:
    """A process's RSS and peak RSS (``VmRSS``, ``VmHWM``) in bytes; None once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def run(command: list[str]) -> dict[str, Any]:
    """Run `command`; wall time (s), peak tree RSS and each process's peak RSS (bytes).

    The tree's RSS is sampled every 0.1 s; each process's peak is the kernel's
    ``VmHWM`` (exact), read until the process ends, by pid: the run's
    ``artifacts/timeline.jsonl`` says which pid built and which measured.
    """
    peak, peaks = 0, {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            total = 0
            for pid in tree(proc.pid):
                seen = memory(pid)
                if seen is not None:
                    total += seen[0]
                    peaks[pid] = max(peaks.get(pid, 0), seen[1])
            peak = max(peak, total)
            stop.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    output = proc.communicate()[0]
    stop.set()
    sampler.join()
    wall = time.perf_counter() - t0
    return {"rc": proc.returncode, "wall_s": wall, "peak_tree_rss": peak,
            "peak_process_rss": max(peaks.values(), default=0),
            "process_peaks": {str(pid): b for pid, b in
                              sorted(peaks.items(), key=lambda kv: -kv[1])},
            "output_tail": output[-3000:]}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("large-model-bench"))
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--min-time", default="0.5", help="seconds of timing per candidate")
    args = parser.parse_args()
    model = args.out / "model" / "big.onnx"
    t0 = time.perf_counter()
    size = make_model(model, args.layers, args.width)
    made_s = time.perf_counter() - t0
    out = args.out / "run"
    command = [sys.executable, "-m", "routetune", "tune", str(model), "--output", str(out),
               "--fresh", "--seasonings", "fold-constants,fp16", "--max-depth", "2",
               "--min-time", args.min_time]
    result = run(command)
    trials = []
    store = out / "trials.sqlite"
    if store.exists():
        with sqlite3.connect(store) as conn:
            trials = [dict(zip(("route", "status", "reason"), row, strict=True))
                      for row in conn.execute("SELECT route, status, reason FROM trials")]
    winner = out / "winner.onnx"
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "model_bytes": size, "layers": args.layers, "width": args.width,
        "generate_s": made_s, "command": command[1:], **result,
        "peak_tree_rss_x_model": result["peak_tree_rss"] / size,
        "peak_process_rss_x_model": result["peak_process_rss"] / size,
        "trials": trials,
        "artifacts_models_bytes": folder_bytes(out / "artifacts" / "models")
        if (out / "artifacts" / "models").exists() else 0,
        "winner_bytes": sum(p.stat().st_size for p in (winner, winner.with_name(
            "winner.onnx.data")) if p.exists()),
        "winner_checks": _check(winner),
    }
    (args.out / "large_model.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "output_tail"}, indent=2))
    print(result["output_tail"])


def _check(winner: Path) -> str:
    """Whether the written winner passes the full checker, read by path with its data."""
    if not winner.exists():
        return "no winner.onnx"
    try:
        onnx.checker.check_model(str(winner), full_check=True)
    except Exception as e:  # noqa: BLE001 - recorded, the benchmark goes on
        return f"checker: {e}"[:300]
    return "onnx.checker passes (full_check, by path)"


if __name__ == "__main__":
    main()
