"""The GPU benchmark: tune on ONNX Runtime's CUDA provider, then compare with PyTorch.

Usage, on a machine with a CUDA GPU, onnxruntime-gpu, CuPy and torch (+ torchvision):

    python benchmarks/gpu.py [--out DIR] [--models resnet50,bert,ppocr-det,...]
                             [--budget-s 240] [--min-time 0.2] [--beam-width 3]
                             [--max-depth 3] [--seasonings a,b] [--search beam]
                             [--in-process] [--fresh] [--no-baselines] [--batch 32]

Stored trials are reused (resume) unless ``--fresh``: a first call may tune with
``--no-baselines`` and a second, in the same output directory, time everything.

For each model, in one process:

1. ``routetune tune`` with the ``onnxruntime-cuda`` backend, every applicable seasoning
   (none hand-picked), beam search, accuracy ``cos>=0.9999,rel_l2<=0.01`` against the
   FP32 model on the CPU, and a time budget per model (``--search`` picks another
   strategy; ``--in-process`` makes builds and timings take turns).
2. One interleaved timing loop (`measure_side_by_side`) of: the ORT CUDA base route and
   routetune's winner (device compute time, I/O bound on the device, CUDA events), the
   same two host to host (copies included), and, for models built here from PyTorch,
   torch eager FP32 and FP16 and ``torch.compile(mode="max-autotune-no-cudagraphs")``
   FP16, with its compile time.

Models: ``resnet50``, ``mobilenetv3`` (Large), ``convnext`` (Tiny) and ``efficientnet``
(B0) (torchvision, random weights, batch 32 or ``--batch N``, 3×224×224, channels_last
for torch),
``bert`` (a BERT-base-sized encoder: 12 layers, hidden 768, 12 heads, FFN
3072, vocabulary 30522; random weights; batch 8, sequence 128), ``hf-bert`` (a Hugging
Face ``BertModel``, BERT-base config, random weights, batch 8 × 128 with an attention mask
that pads the last 28 tokens; TorchScript exporter), and the PP-OCR examples
(``ppocr-det``, ``ppocr-rec``, ``ppocr-cls``; ONNX only). It prints one table of ratios
over the ORT CUDA base route and writes ``benchmark.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from routetune.backend import Runner

ACCURACY = "cos>=0.9999,rel_l2<=0.01"

CNNS = {"resnet50": "resnet50", "mobilenetv3": "mobilenet_v3_large",
        "convnext": "convnext_tiny", "efficientnet": "efficientnet_b0"}
"""The torchvision CNNs by benchmark name (random weights, seeded; ``--batch``, 3x224x224)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/gpu-bench"))
    parser.add_argument("--models", default="resnet50,bert,ppocr-det,ppocr-rec,ppocr-cls")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--beam-width", type=int, default=3)
    parser.add_argument("--max-depth", type=int, default=3)
    parser.add_argument("--seasonings", default="",
                        help="restrict the space to these (comma-separated); all by default")
    parser.add_argument("--search", default="beam", help="the search strategy")
    parser.add_argument("--in-process", action="store_true",
                        help="builds and timings take turns in this process")
    parser.add_argument("--fresh", action="store_true", help="ignore stored trials")
    parser.add_argument("--memory", default=None,
                        help="the route memory file, or off (default: routetune's own)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="tune only; time nothing side by side (a later run resumes)")
    parser.add_argument("--batch", type=int, default=32,
                        help="batch size of the CNNs (resnet50, mobilenetv3, convnext, "
                             "efficientnet); the other models keep their own shapes")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    import onnxruntime as ort

    from routetune.plugin_manager import load_registry
    from routetune.plugins.cuda import cuda_versions
    from routetune.timing.measure import MeasureSettings

    registry = load_registry()
    settings = MeasureSettings(warmup=10, min_runs=30, min_time_s=args.min_time)
    report: dict[str, Any] = {"machine": {**cuda_versions(), "onnxruntime": ort.__version__,
                                          "python": platform.python_version()},
                              "batch": args.batch, "models": {}}
    for name in args.models.split(","):
        report["models"][name] = bench_model(name, args, registry, settings)
        (args.out / "benchmark.json").write_text(json.dumps(report, indent=2))
        print_model(name, report["models"][name])
    print(json.dumps(report["machine"]))


def bench_model(name: str, args: argparse.Namespace, registry: Any, settings: Any
                ) -> dict[str, Any]:
    """Tune one model, then time everything side by side; figures by row name."""
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import tune

    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    torch_model, model_path, inputs = build_model(name, out, args.batch)
    opts = RunSpec(model=model_path, example=None if model_path else name,
                   output=out / "tune", backend="onnxruntime-cuda", fresh=args.fresh,
                   search=args.search, in_process=args.in_process,
                   **({"beam_width": args.beam_width} if args.search == "beam" else {}),
                   max_depth=args.max_depth,
                   seasonings=tuple(args.seasonings.split(",")) if args.seasonings else None,
                   accuracy=ACCURACY, inputs=inputs, measure=settings,
                   time_budget_s=args.budget_s, memory=args.memory)
    started = time.perf_counter()
    result = tune(opts, registry)
    tuning_s = time.perf_counter() - started
    record = json.loads(result.files["run"].read_text())
    row = {"winner": result.winner.route, "reason": result.winner_reason,
           "memory": record["search"]["memory"],
           "tuning_s": round(tuning_s, 1), "trials": len(result.trials),
           "search": args.search, "builds": builds(result.trials),
           "stopped": result.stopped, "accuracy": result.winner.accuracy,
           "confirmed": [{"route": c.route, "speedup": c.paired.value if c.paired else None,
                          "ci": [c.paired.ci_low, c.paired.ci_high] if c.paired else None}
                         for c in result.confirmations]}
    if not args.no_baselines:
        row.update(time_all(result, torch_model, _feeds(name, inputs), settings))
    return row


def build_model(name: str, out: Path, batch: int = 32
                ) -> tuple[Any, Path | None, Path | None]:
    """(torch module or None, ONNX path or None for an example, inputs dir or None).

    `batch` applies to the CNNs only.
    """
    import torch

    if name.startswith("ppocr"):
        return None, None, None
    torch.manual_seed(0)
    if name in CNNS:
        import torchvision

        module = getattr(torchvision.models, CNNS[name])(weights=None).eval()
        sets = [{"x": np.random.default_rng(i).standard_normal((batch, 3, 224, 224))
                 .astype(np.float32)} for i in range(4)]
    elif name == "bert":
        module = Encoder().eval()
        sets = [{"ids": np.random.default_rng(i).integers(0, 30522, (8, 128))}
                for i in range(4)]
    elif name == "hf-bert":
        module = HFBert()
        mask = np.concatenate([np.ones((8, 100), np.int64), np.zeros((8, 28), np.int64)], 1)
        sets = [{"input_ids": np.random.default_rng(i).integers(0, 30522, (8, 128)),
                 "attention_mask": mask} for i in range(4)]
    else:
        raise SystemExit(f"--models: unknown model '{name}'")
    path = out / f"{name}.onnx"
    example = tuple(torch.from_numpy(v) for v in sets[0].values())
    with torch.no_grad():
        try:  # the TorchScript exporter; torch >= 2.9 defaults to the dynamo one
            torch.onnx.export(module, example, str(path), input_names=list(sets[0]),
                              output_names=["y"], opset_version=17, dynamo=False)
        except Exception as e:  # noqa: BLE001 - fall back to the other exporter
            print(f"TorchScript export failed ({e}); trying dynamo=True")
            torch.onnx.export(module, example, str(path), input_names=list(sets[0]),
                              output_names=["y"], opset_version=17, dynamo=True)
    inputs = out / "inputs"
    inputs.mkdir(exist_ok=True)
    for i, feed in enumerate(sets):
        np.savez(inputs / f"set{i}.npz", **feed)
    return module, path, inputs


def builds(trials: Any) -> int:
    """How many of `trials` built an engine (not skipped, applicable)."""
    return sum(t.build_ms is not None and t.status not in ("skipped", "not-applicable")
               for t in trials)


def HFBert() -> Any:  # noqa: N802
    """A Hugging Face ``BertModel`` (BERT-base config, random weights, no pooler).

    Called with ``(input_ids, attention_mask)``, both int64 ``[batch, seq]``; returns the
    last hidden state, float32 ``[batch, seq, 768]``.
    """
    import torch
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(), add_pooling_layer=False).eval()

    class Wrapped(torch.nn.Module):  # keywords: positions differ between versions
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask
                             ).last_hidden_state

    return Wrapped().eval()


def Encoder(width: int = 768, heads: int = 12, layers: int = 12, ffn: int = 3072,  # noqa: N802
            vocab: int = 30522) -> Any:
    """A post-LN encoder on token ids (random weights); the defaults are BERT-base's sizes.

    `tests/data/attention/make_models.py` exports a tiny one (width 32, 4 heads, 2 layers)
    as the ``fuse-attention`` fixture.
    """
    import torch
    from torch import nn

    head = width // heads

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.ffn = nn.Sequential(nn.Linear(width, ffn), nn.GELU(), nn.Linear(ffn, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (z.reshape(b, t, heads, head).transpose(1, 2)
                       for z in self.qkv(x).chunk(3, dim=-1))
            att = torch.softmax(q @ k.transpose(-1, -2) * head ** -0.5, dim=-1)
            x = self.ln1(x + self.proj((att @ v).transpose(1, 2).reshape(b, t, width)))
            return self.ln2(x + self.ffn(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(512, width)
            self.ln = nn.LayerNorm(width)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.ln(self.tok(ids) + self.pos(pos)[None])
            for layer in self.layers:
                x = layer(x)
            return x

    return Model()


def time_all(result: Any, torch_model: Any, feeds: list[dict[str, np.ndarray]],
             settings: Any) -> dict[str, Any]:
    """Every engine of the model in one interleaved loop; p50s in ms and ratios."""
    from routetune.plugin_manager import load_registry
    from routetune.timing.measure import measure_side_by_side

    backend = load_registry().backend("onnxruntime-cuda")()
    outdir = result.outdir
    engines = {"ort-cuda base": result.base}
    if result.winner is not result.base:
        engines["routetune winner"] = result.winner
    runners: dict[str, Runner] = {}
    for label, trial in engines.items():
        path = outdir / trial.artifact
        runners[label] = backend.open(backend.build(path, trial.settings, path.parent))
    for label in list(runners):
        runners[f"{label}, host to host"] = _end_to_end(runners[label])
    extra: dict[str, Any] = {}
    if torch_model is not None:
        extra = _torch_runners(torch_model, feeds, runners)
    names = list(runners)
    lat = measure_side_by_side([runners[n] for n in names], feeds, settings)
    base = lat[0].p50
    rows = {n: {"p50_ms": round(x.p50, 3), "ci_ms": [round(x.ci_low, 3), round(x.ci_high, 3)],
                "vs_base": round(base / x.p50, 3)} for n, x in zip(names, lat, strict=True)}
    for runner in runners.values():
        runner.close()
    return {"rows": rows, **extra}


def _feeds(name: str, inputs: Path | None) -> list[dict[str, np.ndarray]]:
    """The validation input sets the search used."""
    if inputs is not None:
        return [dict(np.load(f, allow_pickle=False)) for f in sorted(inputs.glob("*.npz"))]
    from routetune.feeds.examples import get_example

    example = get_example(name)
    return example.make_inputs(example.shapes, 0, 4)


def _end_to_end(runner: Any) -> Any:
    """The runner's host-to-host calls (copies included), timed by the wall clock."""
    class EndToEnd(Runner):
        def prepare(self, feed: Any) -> Any:
            return runner.prepare_end_to_end(feed)

    return EndToEnd()


class _TorchRunner(Runner):
    """A torch module on CUDA: inputs on the device, timed by CUDA events."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def prepare(self, feed: Any) -> Any:
        import torch

        args = [torch.from_numpy(np.asarray(v)).cuda() for v in feed.values()]
        if self.half:
            args = [a.half() if a.is_floating_point() else a for a in args]
        if self.channels_last:
            args = [a.to(memory_format=torch.channels_last) if a.dim() == 4 else a
                    for a in args]
        fn = self.fn

        def call() -> None:
            with torch.inference_mode():
                fn(*args)
        return call

    def timed(self, call: Any) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def close(self) -> None:
        pass

    half = False
    channels_last = False


def _torch_runners(module: Any, feeds: list[dict[str, np.ndarray]], runners: dict[str, Any]
                   ) -> dict[str, Any]:
    import copy

    import torch

    conv = any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    fp32 = module.cuda().eval()
    fp16 = copy.deepcopy(fp32).half()
    if conv:
        fp32 = fp32.to(memory_format=torch.channels_last)
        fp16 = fp16.to(memory_format=torch.channels_last)
    for label, fn, half in (("torch eager FP32", fp32, False), ("torch eager FP16", fp16, True)):
        r = _TorchRunner(fn)
        r.half, r.channels_last = half, conv
        runners[label] = r
    compiled = torch.compile(fp16, mode="max-autotune-no-cudagraphs")
    r = _TorchRunner(compiled)
    r.half, r.channels_last = True, conv
    started = time.perf_counter()
    r.prepare(feeds[0])()  # compiles
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - started
    runners["torch.compile max-autotune FP16"] = r
    return {"torch_compile_s": round(compile_s, 1)}


def print_model(name: str, row: dict[str, Any]) -> None:
    """One markdown table per model: p50 and the ratio over the ORT CUDA base route."""
    print(f"\n### {name}: winner `{row['winner']}` after {row['tuning_s']} s of tuning "
          f"({row['trials']} trials{'; ' + row['stopped'] if row['stopped'] else ''})"
          + (f"; torch.compile took {row['torch_compile_s']} s" if "torch_compile_s" in row
             else ""))
    print("\n| engine | p50 ms | 95% CI ms | speed-up over ORT CUDA base |\n|---|---|---|---|")
    for label, r in row.get("rows", {}).items():
        print(f"| {label} | {r['p50_ms']} | {r['ci_ms'][0]}–{r['ci_ms'][1]} | "
              f"{r['vs_base']:.2f}x |")


if __name__ == "__main__":
    main()
