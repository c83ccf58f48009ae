"""Each CUDA provider option's effect, per model: routetune's one-at-a-time search.

Usage, on a machine with a CUDA GPU, onnxruntime-gpu, CuPy and torch (+ torchvision):

    python benchmarks/cuda_options.py [--out DIR] [--models resnet50,bert,ppocr-det]
                                      [--bases fp32,fp16] [--min-time 0.2] [--fresh]

For each model and base pipeline (``fp32``: the model as it is; ``fp16``: routetune's
``fp16`` pinned in front), ``routetune tune`` on the ``onnxruntime-cuda`` backend with
``--search one-at-a-time`` over every ``ort-cuda-*`` seasoning offered: each option
alone, timed in paired blocks against the base pipeline alongside (the speed-up and its
95% interval are the search's, `routetune.timing.measure`), accuracy ``cos>=0.9999,
rel_l2<=0.01`` against the FP32 model. It prints one Markdown table per model (rows:
routes; columns: bases) and writes ``cuda_options.json``. The models are
`benchmarks/gpu.py`'s.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu import ACCURACY, build_model  # noqa: E402 - benchmarks/ is not a package

BASES = {"fp32": (), "fp16": ("fp16",)}
"""Base pipelines: the pinned prefix in front of every route."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/cuda-options"))
    parser.add_argument("--models", default="resnet50,bert,ppocr-det")
    parser.add_argument("--bases", default="fp32,fp16")
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--fresh", action="store_true", help="ignore stored trials")
    args = parser.parse_args()
    import onnxruntime as ort

    from routetune.plugin_manager import load_registry
    from routetune.plugins.cuda import cuda_versions
    from routetune.plugins.onnxruntime.cuda_provider import provider_defaults

    registry = load_registry()
    report: dict[str, Any] = {"machine": {**cuda_versions(), "onnxruntime": ort.__version__,
                                          "python": platform.python_version()},
                              "provider_options": provider_defaults(), "models": {}}
    path = args.out / "cuda_options.json"
    for name in args.models.split(","):
        report["models"][name] = {base: options_effect(name, base, args, registry)
                                  for base in args.bases.split(",")}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print_table(name, report["models"][name])
    print(json.dumps(report["machine"]))


def options_effect(name: str, base: str, args: argparse.Namespace, registry: Any
                   ) -> dict[str, Any]:
    """One one-at-a-time search of the CUDA options on `name` over base pipeline `base`."""
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import tune
    from routetune.timing.measure import MeasureSettings

    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    _, model_path, inputs = build_model(name, out)
    options = tuple(n for n in registry.seasonings if n.startswith("ort-cuda-"))
    opts = RunSpec(model=model_path, example=None if model_path else name,
                   output=out / base, backend="onnxruntime-cuda", fresh=args.fresh,
                   base=BASES[base], seasonings=options, search="one-at-a-time",
                   accuracy=ACCURACY, inputs=inputs, keep="winner",
                   measure=MeasureSettings(warmup=10, min_runs=30, min_time_s=args.min_time))
    result = tune(opts, registry)
    rows = {}
    for t in result.trials:
        rows[t.route] = {"status": str(t.status), "reason": t.reason,
                         "speedup": t.speedup,
                         "ci": [t.paired.ci_low, t.paired.ci_high] if t.paired else None,
                         "p50_ms": t.latency.p50 if t.latency else None,
                         "base_p50_ms": t.base_latency.p50 if t.base_latency else None}
    return {"winner": result.winner.route, "not_applicable": dict(result.not_applicable),
            "trials": rows}


def print_table(name: str, bases: dict[str, dict[str, Any]]) -> None:
    """A Markdown table: one row per route, one column per base pipeline."""
    routes = sorted({r for b in bases.values() for r in b["trials"]})
    print(f"\n### {name}\n")
    print("| route | " + " | ".join(f"over {b}" for b in bases) + " |")
    print("|---|" + "---|" * len(bases))
    for route in routes:
        cells = []
        for b in bases.values():
            t = b["trials"].get(route)
            if t is None:
                cells.append("")
            elif t["speedup"] is not None and t["ci"] and t["status"] == "ok":
                cells.append(f"{t['speedup']:.2f}x [{t['ci'][0]:.2f}, {t['ci'][1]:.2f}]")
            else:
                cells.append(f"{t['status']}: {t['reason'][:60]}")
        print(f"| `{route}` | " + " | ".join(cells) + " |")
    for base, b in bases.items():
        if b["not_applicable"]:
            print(f"\nnot applicable over {base}: " + "; ".join(
                f"{k}: {v}" for k, v in b["not_applicable"].items() if k.startswith("ort-cuda")))


if __name__ == "__main__":
    main()
