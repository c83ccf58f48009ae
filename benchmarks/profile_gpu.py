"""Where a GPU engine's time goes: ONNX Runtime's profiler on a route, by operator.

Usage, on a machine with a CUDA GPU, onnxruntime-gpu, CuPy and torch (+ torchvision):

    python benchmarks/profile_gpu.py [--out DIR] [--model resnet50|bert]
                                     [--route fp16,ort-cuda-nhwc]

It builds the model as `benchmarks/gpu.py` does, makes the route's candidate model with
``routetune tune`` (the route pinned, nothing searched), then runs that model on ONNX
Runtime's CUDA provider, with the route's provider options, under ONNX Runtime's own
profiler (``SessionOptions.enable_profiling``; CUDA graph capture is left out, since the
profiler sees no node inside a replayed graph). Per operator type it sums the node
times of 20 runs (ms per run) and counts the nodes; it also counts the layout Transposes
and Casts that the provider or the route added. The question it answers is where the
gap to ``torch.compile`` lies (issue 16): compute kernels, or the glue between them.
Writes ``profile.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu import build_model  # noqa: E402 - benchmarks/ is not a package

RUNS = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/profile-gpu"))
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--route", default="fp16,ort-cuda-nhwc")
    args = parser.parse_args()
    import numpy as np
    import onnxruntime as ort

    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import tune
    from routetune.timing.measure import MeasureSettings

    out = args.out / args.model
    out.mkdir(parents=True, exist_ok=True)
    _, path, inputs = build_model(args.model, out)
    assert path is not None and inputs is not None
    report: dict[str, Any] = {}
    for route in ("base", args.route):
        result = tune(RunSpec(model=path, inputs=inputs, output=out / "tune",
                              backend="onnxruntime-cuda", seasonings=("fp16",),
                              routes=() if route == "base" else (route,),
                              search="exhaustive", max_depth=0, accuracy="cos>=0.999",
                              keep="all", measure=MeasureSettings(min_runs=5, min_time_s=0.1)))
        trial = next(t for t in result.trials if t.route == route)
        options = {k.removeprefix("onnxruntime.cuda."): v for k, v in trial.settings.items()
                   if k.startswith("onnxruntime.cuda.")}
        options["enable_cuda_graph"] = "0"
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(out / route.replace(",", "+"))
        session = ort.InferenceSession(str(out / "tune" / str(trial.artifact)), so,
                                       providers=[("CUDAExecutionProvider", options)])
        feed = dict(np.load(sorted(inputs.glob("*.npz"))[0], allow_pickle=False))
        for _ in range(5 + RUNS):
            session.run(None, feed)
        report[route] = summarise(Path(session.end_profiling()), RUNS)
        report[route]["trial_p50_ms"] = trial.latency.p50 if trial.latency else None
        print_profile(route, report[route])
    (args.out / f"profile-{args.model}.json").write_text(json.dumps(report, indent=1))


def summarise(trace: Path, runs: int) -> dict[str, Any]:
    """Per operator type: ms per run and node count, from the last `runs` runs."""
    events = json.loads(trace.read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len({e["name"] for e in nodes})
    last = nodes[-per_run * runs:] if per_run else []
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in last:
        entry = by_op[e["args"].get("op_name", "?")]
        entry[0] += e["dur"] / 1000 / runs
        entry[1] += 1 / runs
    total = sum(v[0] for v in by_op.values())
    return {"nodes_per_run": per_run, "node_ms_per_run": total,
            "by_op": {op: {"ms": round(v[0], 4), "nodes": round(v[1]),
                           "share": round(v[0] / total, 4) if total else 0.0}
                      for op, v in sorted(by_op.items(), key=lambda kv: -kv[1][0])}}


def print_profile(route: str, row: dict[str, Any]) -> None:
    print(f"\n### {route}: {row['nodes_per_run']} nodes, {row['node_ms_per_run']:.3f} ms of "
          f"node time per run (trial p50 {row['trial_p50_ms']})")
    for op, v in list(row["by_op"].items())[:12]:
        print(f"  {op:28s} {v['ms']:8.3f} ms  {v['share']:6.1%}  {v['nodes']:4d} nodes")


if __name__ == "__main__":
    main()
