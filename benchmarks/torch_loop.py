"""Why `torch.compile` ran slower inside `benchmarks/gpu.py`'s loop than alone (issue 41).

Usage, on a machine with a CUDA GPU, onnxruntime-gpu and torch (+ torchvision):

    python benchmarks/torch_loop.py [--out DIR] [--rounds 20] [--sessions 4]

One process. ResNet-50 (torchvision, seeded random weights), batch 32, 3×224×224, FP16,
channels_last, ``torch.compile(mode="max-autotune-no-cudagraphs")``, timed by CUDA
events (one call per event pair, as `benchmarks/gpu.py` times it), in four conditions
one after another:

1. alone;
2. in blocks that alternate with ONNX Runtime CUDA sessions of the same model (FP32
   export), `--sessions` of them open at once as in `gpu.py`'s loop (base, winner, each
   also host to host), ONNX Runtime's default session options (intra-op thread pool of
   one thread per core, spinning after each run);
3. the same with the sessions' spinning off (``session.intra_op.allow_spinning=0``);
4. alone again (drift).

Each condition: `--rounds` rounds of a block of 15 calls per engine, torch's first call
of each block not counted (as `routetune.timing.measure.measure_blocks` does). Prints
torch's p50 per condition and the ratio to alone, and writes ``torch_loop.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/torch-loop"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=4)
    args = parser.parse_args()
    import onnxruntime as ort
    import torch
    import torchvision

    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = torchvision.models.resnet50(weights=None).eval()
    x = np.random.default_rng(0).standard_normal((32, 3, 224, 224)).astype(np.float32)
    path = args.out / "resnet50.onnx"
    with torch.no_grad():
        torch.onnx.export(module, (torch.from_numpy(x),), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    fp16 = module.cuda().half().to(memory_format=torch.channels_last)
    compiled = torch.compile(fp16, mode="max-autotune-no-cudagraphs")
    xt = torch.from_numpy(x).cuda().half().to(memory_format=torch.channels_last)

    def torch_call() -> None:
        with torch.inference_mode():
            compiled(xt)

    started = time.perf_counter()
    torch_call()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - started

    def timed(call: Any) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def session(spinning: bool) -> Any:
        so = ort.SessionOptions()
        if not spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(path), so, providers=["CUDAExecutionProvider"])
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
        binding.bind_output("y", "cuda")

        def run() -> None:
            sess.run_with_iobinding(binding)
        return sess, run

    def condition(runs: list[Any]) -> list[float]:
        """Torch's single-call times (ms) in blocks alternating with `runs` (ABBA)."""
        for _ in range(10):
            torch_call()
            for r in runs:
                r()
        torch.cuda.synchronize()
        out: list[float] = []
        for k in range(args.rounds):
            order = [torch_call, *runs] if k % 2 == 0 else [*runs, torch_call][::-1]
            for call in order:
                if call is torch_call:
                    times = [timed(torch_call) for _ in range(15)]
                    out += times[1:]
                else:
                    for _ in range(15):
                        call()
                    torch.cuda.synchronize()
        return out

    results: dict[str, Any] = {"machine": {"torch": torch.__version__,
                                           "onnxruntime": ort.__version__,
                                           "gpu": torch.cuda.get_device_name(0),
                                           "cpus": os.cpu_count(),
                                           "python": platform.python_version()},
                               "compile_s": round(compile_s, 1), "conditions": {}}
    rows: list[tuple[str, list[float]]] = [("alone", condition([]))]
    for spinning in (True, False):
        sessions = [session(spinning) for _ in range(args.sessions)]
        label = (f"with {args.sessions} ORT CUDA sessions, "
                 f"spinning {'on (default)' if spinning else 'off'}")
        rows.append((label, condition([run for _, run in sessions])))
        del sessions
    rows.append(("alone again", condition([])))
    alone = float(np.median(rows[0][1]))
    print(f"\nResNet-50 b32 FP16 torch.compile (compile {compile_s:.0f} s), CUDA events, "
          f"{args.rounds} rounds of 14 counted calls\n")
    print("| condition | torch p50 ms | p90 ms | vs alone |\n|---|---|---|---|")
    for label, times in rows:
        p50, p90 = float(np.median(times)), float(np.percentile(times, 90))
        results["conditions"][label] = {"p50_ms": round(p50, 3), "p90_ms": round(p90, 3),
                                        "n": len(times), "vs_alone": round(p50 / alone, 3)}
        print(f"| {label} | {p50:.3f} | {p90:.3f} | {p50 / alone:.2f}x |")
    (args.out / "torch_loop.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
