"""What ONNX Runtime's transformer optimizer fuses in today's exports, and what it buys.

Usage, on a machine with a CUDA GPU, onnxruntime-gpu, CuPy, torch, torchvision and
transformers:

    python benchmarks/transformer_fusion.py [--out DIR] [--models encoder,hf-bert,vit]

For each model, ``routetune tune`` on the ``onnxruntime-cuda`` backend with
``--search exhaustive`` over ``ort-transformer-fusion``, routetune's own
``fuse-attention``, ``fp16`` and ``ort-cuda-graph``, alone and combined (accuracy
``cos>=0.9999,rel_l2<=0.01`` against FP32): the fused-operator counts that the fusion
seasonings record in the trial, and each route's speed-up over the base route timed
alongside. Models: ``encoder`` (`benchmarks/gpu.py`'s BERT-base-sized encoder, b8×128,
TorchScript exporter), ``hf-bert`` (a Hugging Face ``BertModel``, BERT-base config, random
weights, b8×128 with an attention mask; the TorchScript exporter) and ``vit``
(torchvision ``vit_b_16``, random weights, b8). Writes ``transformer_fusion.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gpu import ACCURACY, build_model  # noqa: E402 - benchmarks/ is not a package


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/transformer-fusion"))
    parser.add_argument("--models", default="encoder,hf-bert,vit")
    parser.add_argument("--min-time", type=float, default=0.2)
    args = parser.parse_args()
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import tune
    from routetune.timing.measure import MeasureSettings

    report: dict[str, Any] = {}
    for name in args.models.split(","):
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        path, inputs = export(name, out)
        result = tune(RunSpec(model=path, inputs=inputs, output=out / "tune",
                              backend="onnxruntime-cuda", search="exhaustive", max_depth=4,
                              seasonings=("ort-transformer-fusion", "fuse-attention",
                                          "fp16", "ort-cuda-graph"),
                              space={"ort-transformer-fusion": {"model_type": ("auto",)}},
                              accuracy=ACCURACY, keep="winner",
                              measure=MeasureSettings(warmup=10, min_runs=30,
                                                      min_time_s=args.min_time)))
        rows = {}
        for t in result.trials:
            fusions = [p for p in t.passes if p.get("step", "").startswith(
                ("ort-transformer-fusion", "fuse-attention"))]
            rows[t.route] = {"status": str(t.status), "reason": t.reason[:200],
                             "speedup": t.speedup,
                             "ci": [t.paired.ci_low, t.paired.ci_high] if t.paired else None,
                             "p50_ms": t.latency.p50 if t.latency else None,
                             "fused": {p["step"]: p["stats"] for p in fusions} or None,
                             "note": "; ".join(p.get("note", "") for p in fusions) or None}
        report[name] = {"winner": result.winner.route, "reason": result.winner_reason,
                        "confirmed": [{"route": c.route,
                                       "speedup": c.paired.value if c.paired else None,
                                       "ci": [c.paired.ci_low, c.paired.ci_high]
                                       if c.paired else None}
                                      for c in result.confirmations],
                        "trials": rows}
        (args.out / "transformer_fusion.json").write_text(json.dumps(report, indent=1))
        print(f"\n### {name}: winner {result.winner.route}")
        for route, r in rows.items():
            print(f"{route:40s} {r['status']:16s} speed-up {r['speedup']} {r['ci']} "
                  f"fused {r['fused']} {r['note'] or ''}")


def export(name: str, out: Path) -> tuple[Path, Path]:
    """The ONNX model and its inputs folder for `name`."""
    if name in ("encoder", "hf-bert"):
        _, path, inputs = build_model("bert" if name == "encoder" else name, out)
        assert path is not None and inputs is not None
        return path, inputs
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name == "vit":
        import torchvision

        module = torchvision.models.vit_b_16(weights=None).eval()
        torch.backends.mha.set_fastpath_enabled(False)  # the exporter knows no fused MHA
        sets = [{"x": rng.standard_normal((8, 3, 224, 224)).astype(np.float32)}
                for _ in range(4)]
    else:
        raise SystemExit(f"--models: unknown model '{name}'")
    path = out / f"{name}.onnx"
    example = tuple(torch.from_numpy(v) for v in sets[0].values())
    with torch.no_grad():
        torch.onnx.export(module, example, str(path), input_names=list(sets[0]),
                          output_names=["y"], opset_version=17, dynamo=False)
    inputs = out / "inputs"
    inputs.mkdir(exist_ok=True)
    for i, feed in enumerate(sets):
        np.savez(inputs / f"set{i}.npz", **feed)
    return path, inputs


if __name__ == "__main__":
    main()
