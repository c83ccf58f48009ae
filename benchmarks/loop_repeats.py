"""Is one paired loop enough? Consecutive loops of the same two engines, in one process.

Usage: python benchmarks/loop_repeats.py [--out DIR] [--model ppocr-cls] [--loops 4]
                                         [--processes 2] [--min-time 0.5]

For each process (`--processes`, each a fresh ``python`` run one after another), two
pairs of engines are opened on the example's validation inputs (seed 1), each with its
backend's defaults:

- ``A/B``: ONNX Runtime's CPU provider (the base) and OpenVINO's CPU plugin;
- ``A/A``: two ONNX Runtime sessions of the same model (the truth is 1.0x).

Each pair is timed in `--loops` consecutive loops of paired blocks
(`routetune.timing.measure.measure_blocks`, `MeasureSettings` as a confirmation uses:
30 blocks at least), and each loop's paired speed-up and 95% interval are printed.
If one loop's interval covered what the next loop measures, consecutive loops'
intervals would overlap. The combined figure of `routetune.timing.measure.across_repeats`
is printed for each process. The CPU load average and steal time are recorded.

Writes ``loop_repeats.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def steal_ticks() -> int:
    """CPU steal time so far, in clock ticks (``/proc/stat``), or -1 where unknown."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return -1


def one_process(model_name: str, loops: int, min_time_s: float) -> dict[str, Any]:
    """Both pairs, `loops` loops each, in this process."""
    from dataclasses import asdict

    from routetune.feeds.examples import fetch, load_inputs
    from routetune.plugin_manager import load_registry
    from routetune.timing.measure import (
        MeasureSettings,
        Speedup,
        across_repeats,
        measure_blocks,
        paired_speedup,
    )

    registry = load_registry()
    model, feeds = Path(fetch(model_name)), load_inputs(model_name, seed=1)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "routetune-loop-repeats"
    workdir.mkdir(parents=True, exist_ok=True)

    def opened(name: str) -> Any:
        backend = registry.backend(name)(None)
        return backend.open(backend.build(model, backend.full_settings({}), workdir))

    settings = MeasureSettings(warmup=5, min_runs=30, min_time_s=min_time_s, min_blocks=30)
    out: dict[str, Any] = {}
    for pair, names in (("A/B onnxruntime/openvino", ("onnxruntime", "openvino")),
                        ("A/A onnxruntime/onnxruntime", ("onnxruntime", "onnxruntime"))):
        runners = [opened(n) for n in names]
        each = []
        for _ in range(loops):
            steal = steal_ticks()
            latencies, blocks = measure_blocks(runners, feeds, settings)
            p = paired_speedup(blocks, 1, 0)
            each.append({"speedup": asdict(p), "base_p50_ms": latencies[0].p50,
                         "other_p50_ms": latencies[1].p50,
                         "steal_ticks": steal_ticks() - steal, "load1": os.getloadavg()[0]})
            print(f"  {pair}: {p.value:.2f}x [{p.ci_low:.2f}, {p.ci_high:.2f}]  p50 "
                  f"{latencies[0].p50:.3f} / {latencies[1].p50:.3f} ms", flush=True)
        for r in runners:
            r.close()
        combined = across_repeats([Speedup(**e["speedup"]) for e in each])
        print(f"  {pair}, combined: {combined.value:.2f}x [{combined.ci_low:.2f}, "
              f"{combined.ci_high:.2f}]", flush=True)
        out[pair] = {"loops": each, "combined": asdict(combined)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/loop-repeats"))
    parser.add_argument("--model", default="ppocr-cls")
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.model, args.loops, args.min_time)))
        return
    import onnxruntime
    import openvino

    report: dict[str, Any] = {"model": args.model, "cores": os.cpu_count(),
                              "onnxruntime": onnxruntime.__version__,
                              "openvino": openvino.__version__,
                              "load_before": os.getloadavg(), "started": time.ctime(),
                              "processes": []}
    for k in range(args.processes):
        print(f"process {k + 1}", flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", "--model", args.model,
                               "--loops", str(args.loops), "--min-time", str(args.min_time)],
                              capture_output=True, text=True, check=True)
        lines = done.stdout.strip().splitlines()
        print("\n".join(lines[:-1]), flush=True)
        report["processes"].append(json.loads(lines[-1]))
    report["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loop_repeats.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
