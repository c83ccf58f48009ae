"""The trained decoder's decode step in torch, for comparison with routetune's (issue 40).

Usage, on a machine with a CUDA GPU and torch, after ``benchmarks/decoder.py
--save-weights`` wrote DIR:

    python benchmarks/decoder_torch.py --dir DIR --out torch.json \
        [--modes eager-fp32,eager-fp16,compile-fp16] [--compile-mode reduce-overhead]

The same weights (DIR/decoder.pt) and the same step as the ONNX model's decode-step
sets: batch 1, one byte against a cache of DIR's ``--cache`` (512), taken from
DIR/decode/set-K.npz. Modes:

- ``eager-fp32``: the module as trained, float32, TF32 off (torch's default);
- ``eager-fp16``: ``module.half()`` (``inv_freq`` kept in float32, as Hugging Face's
  Llama keeps it; rotary tables and mask cast to float16: ``build(follow_dtype=True)``);
- ``compile-fp16``: that module under ``torch.compile(mode=--compile-mode)`` with static
  shapes; the input tensors are marked static addresses
  (``torch._dynamo.mark_static_address``) and each set is copied into them in place, so
  a CUDA graph (``reduce-overhead``, ``max-autotune``) replays on them without copying
  them first. The first call's wall time (compile included) and the next two (graph
  recording) are written as ``first_calls_s``.

Each mode: 30 untimed calls, then ``--calls`` calls (300) timed one by one between two
CUDA events on the current stream (p50, p10, p90), and 200 calls back to back between
one pair (ms per call); tokens/s is 1000 / p50. Accuracy over every set, against
eager FP32's logits: mean KL(FP32 || mode) of the next-byte distributions (nats), the
greedy agreement (top-1), and the largest |logit difference|. ``--device cpu`` runs the
same at wall-clock time, for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder import Config, build  # noqa: E402


def load_sets(folder: Path, layers: int) -> list[list[np.ndarray]]:
    """Each decode set as ``[input_ids, attention_mask, past_0_key, past_0_value, ...]``."""
    names = ["input_ids", "attention_mask"] + [f"past_key_values.{i}.{kv}"
                                               for i in range(layers)
                                               for kv in ("key", "value")]
    out = []
    for path in sorted(folder.glob("set-*.npz"), key=lambda p: int(p.stem.split("-")[1])):
        with np.load(path, allow_pickle=False) as z:
            out.append([z[n] for n in names])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default="eager-fp32,eager-fp16,compile-fp16")
    parser.add_argument("--compile-mode", default="reduce-overhead")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    import torch

    info = json.loads((args.dir / "decoder.json").read_text())
    config = Config(**info["config"])
    state = torch.load(args.dir / "decoder.pt", map_location="cpu", weights_only=True)
    sets = load_sets(args.dir / "decode", config.layers)
    dev = args.device
    cuda = dev == "cuda"
    results: dict[str, Any] = {
        "model": {"size": info.get("size"), "parameters": info["parameters"],
                  "cache": info["cache"], "sets": len(sets)},
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "calls": args.calls, "modes": {}}
    print(f"torch {torch.__version__} on {results['gpu'] or 'cpu'}; "
          f"{info['parameters']:,} parameters, cache {info['cache']}, {len(sets)} sets",
          flush=True)

    def now() -> Any:
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def gap(a: Any, b: Any) -> float:
        if cuda:
            b.synchronize()
            return float(a.elapsed_time(b))
        return (b - a) * 1000.0

    reference: list[torch.Tensor] = []
    for mode in args.modes.split(","):
        half = mode.endswith("fp16")
        model = build(config, follow_dtype=half)
        model.load_state_dict(state)
        model.eval()
        if half:
            inv_freq = model.inv_freq.clone()
            model.half()
            model.inv_freq = inv_freq  # rotary angles in float32, as trained
        model.to(dev)
        dtype = torch.float16 if half else torch.float32
        static = [torch.tensor(a, device=dev, dtype=torch.int64 if a.dtype == np.int64
                               else dtype) for a in sets[0]]  # copies, never the sets'
        row: dict[str, Any] = {"dtype": str(dtype)}
        call_model: Any = model
        if mode.startswith("compile"):
            for t in static:
                torch._dynamo.mark_static_address(t)
            call_model = torch.compile(model, mode=args.compile_mode, dynamic=False)
            row["compile_mode"] = args.compile_mode

        def call(m: Any = call_model, inputs: list[Any] = static) -> Any:
            with torch.inference_mode():
                return m(*inputs)

        first = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize()
            first.append(round(time.perf_counter() - t0, 3))
        row["first_calls_s"] = first
        for _ in range(30):
            call()
        times = []
        for _ in range(args.calls):
            a = now()
            call()
            times.append(gap(a, now()))
        a = now()
        for _ in range(200):
            call()
        row["back_to_back_ms"] = round(gap(a, now()) / 200, 4)
        p50 = float(np.median(times))
        row.update(p50_ms=round(p50, 4), p10_ms=round(float(np.percentile(times, 10)), 4),
                   p90_ms=round(float(np.percentile(times, 90)), 4),
                   tokens_per_s=round(1000.0 / p50, 1))
        # accuracy over every set, each copied into the same (static) input tensors
        logits = []
        for feed in sets:
            for t, a in zip(static, feed, strict=True):
                t.copy_(torch.from_numpy(a).to(dev, t.dtype))
            logits.append(call()[0][0, -1].float().clone())
        if not reference:
            reference = logits
        kl, top1, worst = [], [], 0.0
        for ref, got in zip(reference, logits, strict=True):
            p = torch.log_softmax(ref, -1)
            q = torch.log_softmax(got, -1)
            kl.append(float((p.exp() * (p - q)).sum()))
            top1.append(int(ref.argmax()) == int(got.argmax()))
            worst = max(worst, float((ref - got).abs().max()))
        row.update(mean_kl_vs_eager_fp32=kl and float(np.mean(kl)),
                   top1_vs_eager_fp32=float(np.mean(top1)), max_abs_logit_diff=worst,
                   finite=bool(all(torch.isfinite(x).all() for x in logits)))
        results["modes"][mode] = row
        print(f"{mode}: p50 {row['p50_ms']:.4f} ms (p10 {row['p10_ms']:.4f}, p90 "
              f"{row['p90_ms']:.4f}), back to back {row['back_to_back_ms']:.4f} ms, "
              f"{row['tokens_per_s']} tokens/s; first calls {first} s; KL "
              f"{row['mean_kl_vs_eager_fp32']:.3g}, top1 {row['top1_vs_eager_fp32']}",
              flush=True)
        del model, call_model, static, call
        if cuda:
            torch.cuda.empty_cache()
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # after each mode
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
