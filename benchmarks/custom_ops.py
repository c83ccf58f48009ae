"""A real model with custom operators, tuned end to end on the CPU (README "Custom operators").

The PP-OCR direction classifier (the ``ppocr-cls`` example, a trained MobileNetV3) with
onnxruntime-extensions' own image pre-processing in front of it, as that package's
``tools.pre_post_processing`` writes it for deployment: PNG bytes in, the
``ai.onnx.contrib::DecodeImage`` custom operator, then BGR to RGB, a resize to 48x192,
scaling to [-1, 1] and NCHW, as PaddleOCR's classifier expects. The input sets are
rendered text lines (every second one upside down), each saved as PNG bytes.

The same search runs three times, side by side: against the live FP32 reference (ONNX
Runtime with the library registered), against that reference saved as ``.npz`` files
(``--reference-outputs``), and, to show the refusal, without the library.

    python benchmarks/custom_ops.py --out /tmp/custom-ops [--sets 16]

Writes ``summary.json`` and each run's folder under ``--out``; prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_extensions
from onnxruntime_extensions.tools.pre_post_processing import (
    ChannelsLastToChannelsFirst,
    ConvertImageToBGR,
    ImageBytesToFloat,
    Normalize,
    PrePostProcessor,
    Resize,
    ReverseAxis,
    Unsqueeze,
    create_named_value,
)

from routetune.feeds.examples import fetch
from routetune.feeds.sample_inputs import text_lines

SEASONINGS = "fp16,int8-qdq,fold-constants,ort-opt-level,ort-threads,ort-no-spinning"


def with_pre_processing(model: Path, out: Path) -> Path:
    """The classifier behind onnxruntime-extensions' image decoding and PaddleOCR's
    classifier pre-processing (resize to 48x192, (x / 255 - 0.5) / 0.5, NCHW)."""
    proto = onnx.load(model)
    inputs = [create_named_value("image", onnx.TensorProto.UINT8, ["num_bytes"])]
    pipeline = PrePostProcessor(inputs, onnx_opset=16)
    pipeline.add_pre_processing([
        ConvertImageToBGR(),                       # ai.onnx.contrib::DecodeImage
        ReverseAxis(axis=2, dim_value=3, name="BGR_to_RGB"),
        Resize((48, 192), layout="HWC", policy="not_larger"),
        ImageBytesToFloat(),                        # x / 255
        Normalize([(0.5, 0.5)] * 3, layout="HWC"),  # (x - 0.5) / 0.5
        ChannelsLastToChannelsFirst(),
        Unsqueeze([0]),
    ])
    onnx.save(pipeline.run(proto), out)
    return out


def png_inputs(folder: Path, count: int) -> None:
    """``count`` rendered text lines as PNG bytes, one ``.npz`` input set each."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, line in enumerate(text_lines(0, count, 4.0, flip_every=2)):
        data = io.BytesIO()
        line.image.convert("RGB").resize((192, 48)).save(data, format="PNG")
        np.savez(folder / f"set{i:03d}.npz",
                 image=np.frombuffer(data.getvalue(), dtype=np.uint8))


def save_reference(model: Path, inputs: Path, folder: Path) -> None:
    """The FP32 reference, as routetune runs it (CPU, optimisations off, the library)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(inputs.glob("*.npz")):
        outputs = session.run(None, dict(np.load(f, allow_pickle=False)))
        np.savez(folder / f.name, **dict(zip(names, outputs, strict=True)))


def tune(model: Path, inputs: Path, out: Path, *flags: str) -> dict:
    """One ``routetune tune`` in a subprocess: its wall time, exit code and verdicts."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "routetune", "tune", str(model),
                           "--inputs", str(inputs), "--output", str(out), "--fresh",
                           "--seasonings", SEASONINGS, "--max-depth", "2",
                           "--accuracy", "top1>=0.99", *flags],
                          capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    row: dict = {"flags": list(flags), "exit": done.returncode, "wall_s": round(wall, 1)}
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or [""])[-1]
        return row
    winner = json.loads((out / "winner.json").read_text())
    from routetune.records.store import TrialStore

    store = TrialStore.open(out / "trials.sqlite")
    try:
        trials = {t.route: {"status": str(t.status), "speedup": t.speedup,
                            "reason": t.reason[:160], "accuracy": {
                                f"{o}:{m}": v for o, per in t.accuracy.items()
                                for m, v in per.items()}}
                  for t in store.trials()}
    finally:
        store.close()
    row.update(winner=winner["route"], winner_speedup=winner.get("speedup"),
               trials=trials, summary=[line for line in done.stdout.splitlines()
                                       if line.startswith(("winner:", "reference:"))])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sets", type=int, default=16)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = with_pre_processing(fetch("ppocr-cls"), out / "cls_with_decode.onnx")
    custom = sorted({f"{n.domain}:{n.op_type}" for n in onnx.load(model).graph.node
                     if n.domain not in ("", "ai.onnx")})
    png_inputs(out / "inputs", args.sets)
    save_reference(model, out / "inputs", out / "reference")
    library = ("--custom-op-library", "onnxruntime-extensions")
    runs = {
        "live reference": tune(model, out / "inputs", out / "live", *library),
        "saved reference (.npz)": tune(model, out / "inputs", out / "saved", *library,
                                       "--reference-outputs", str(out / "reference")),
        "without the library": tune(model, out / "inputs", out / "without"),
    }
    summary = {"model": "ppocr-cls behind onnxruntime-extensions' DecodeImage pre-processing",
               "custom_ops": custom, "sets": args.sets, "seasonings": SEASONINGS,
               "machine": platform.processor() or platform.machine(),
               "onnxruntime": ort.__version__,
               "onnxruntime_extensions": onnxruntime_extensions.__version__, "runs": runs}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"custom ops in the model: {', '.join(custom)}")
    for name, row in runs.items():
        print(f"{name:24s} exit {row['exit']}  {row['wall_s']:6.1f} s  "
              f"winner {row.get('winner', '-')}  {row.get('error', '')}")
        for route, t in sorted(row.get("trials", {}).items()):
            print(f"    {route:40s} {t['status']:16s} {t['speedup'] or 0:5.2f}x  "
                  f"{t['reason'][:90]}")


if __name__ == "__main__":
    main()
