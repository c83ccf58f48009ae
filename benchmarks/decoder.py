"""A small trained decoder with a KV cache, in ONNX, and its decode-step inputs (issue 40).

Usage (in a venv with torch; CI has no torch, so the model is made here and tuned by
``routetune`` anywhere):

    python benchmarks/decoder.py --out DIR [--steps 300] [--cache 512]
    python benchmarks/decoder.py --out DIR --size base --device cuda --steps 600 \
        --sets 16 --cache 512 --save-weights    # about 113 M parameters, on a GPU

No PyPI wheel ships a trained decoder in ONNX (``../shared/models.md``), so this file is
the recipe: a Llama-shaped decoder (RMSNorm, rotary position embedding, multi-head
attention with a KV cache, SwiGLU MLP; H. Touvron et al., "LLaMA", 2023) over bytes
(vocabulary 256), seeded (``torch.manual_seed(0)``) and trained for ``--steps`` AdamW
steps on this repository's own documentation (README.md and docs/*.md, about 0.3 MB
of English and figures; the last 10% held out), so that its next-byte distributions
are peaked as a trained model's are, not the near-uniform ones of random weights.

Three shapes (``--size``):

- ``small`` (the default): 6 layers, width 384, 6 heads, SwiGLU 1024, 10.8 M
  parameters; trained on the CPU by default, batch 8 of 128 bytes, lr 1e-3, cosine to 0.
- ``medium``: 8 layers, width 512, 8 heads, SwiGLU 1408 (25,960,960 parameters),
  the largest that trains on two CPU cores in minutes: batch 8 of 128 bytes, lr 8e-4
  after 20 warm-up steps, cosine to 0. Its weights (about 100 MB in FP32) no longer fit
  a CPU's caches, so a decode step is bound by memory as a real LLM's is.
- ``base``: 12 layers, width 768, 12 heads, SwiGLU 3072 (113.6 M parameters, the
  exact count is printed and written to ``decoder.json``); made for a GPU
  (``--device cuda``): batch 32 of 256 bytes, lr 6e-4 after 30 warm-up steps, cosine
  to 0.

``--device cuda`` trains on the GPU (float32 weights, TF32 matrix products); the model
then goes back to the CPU, in float32 with TF32 off, for everything after training, so
the export and the decode-step sets are made as on a CPU-only machine. ``--batch``,
``--seq``, ``--lr`` and ``--warmup`` override the size's training defaults. Written to
DIR:

- ``decoder.onnx``: exported by ``torch.onnx.export`` (TorchScript, opset 17) with the
  signature Hugging Face's exports use: inputs ``input_ids`` int64 ``[batch, seq]``,
  ``attention_mask`` int64 ``[batch, past + seq]``, ``past_key_values.{i}.key`` and
  ``.value`` float32 ``[batch, heads, past, head_dim]``; outputs ``logits`` float32
  ``[batch, seq, 256]`` and ``present.{i}.key``/``.value`` ``[batch, heads, past + seq,
  head_dim]``; every dimension but heads and head_dim dynamic.
- ``decode/set-K.npz``: validation input sets for one decode step at a cache of
  ``--cache`` tokens, one file per set as ``routetune tune --inputs decode/`` reads
  them: each set's cache is the FP32 model's own ``present`` after reading a
  ``--cache``-byte passage of held-out text (the last 10% of the corpus), and its
  ``input_ids`` the byte that follows.
- ``decoder.json``: the configuration, parameter count, the training settings, the
  training loss (first step, mean of the last 10) and the held-out loss (mean over
  non-overlapping windows of the held-out text), and versions.
- ``decoder.pt`` (``--save-weights``): the trained ``state_dict`` (float32), for timing
  the same weights in torch (``benchmarks/decoder_torch.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    """The decoder's shape: byte vocabulary, width, depth, heads, MLP width."""

    vocab: int = 256
    dim: int = 384
    layers: int = 6
    heads: int = 6
    ffn: int = 1024
    rope_theta: float = 10000.0


SIZES = {"small": Config(), "medium": Config(dim=512, layers=8, heads=8, ffn=1408),
         "base": Config(dim=768, layers=12, heads=12, ffn=3072)}
"""The decoder shapes ``--size`` offers: ``small`` 10.8 M parameters, ``medium`` 26.0 M,
``base`` 113.6 M."""

TRAINING = {"small": {"batch": 8, "seq": 128, "lr": 1e-3, "warmup": 0},
            "medium": {"batch": 8, "seq": 128, "lr": 8e-4, "warmup": 20},
            "base": {"batch": 32, "seq": 256, "lr": 6e-4, "warmup": 30}}
"""Each size's training defaults (``--batch``, ``--seq``, ``--lr``, ``--warmup``)."""


def corpus() -> bytes:
    """README.md and docs/*.md (not docs/results), in name order, as one byte string."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return b"\n\n".join(f.read_bytes() for f in files)


def build(config: Config, follow_dtype: bool = False) -> Any:
    """The torch module (seeded). Its forward takes ``(input_ids, attention_mask, *past)``.

    ``follow_dtype``: cast the rotary tables and the attention mask to the activations'
    type, so that the module runs in float16 in torch (``benchmarks/decoder_torch.py``;
    keep ``inv_freq`` in float32 there). Off for the export, whose graph stays as it was.
    """
    import torch
    from torch import nn

    head_dim = config.dim // config.heads

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(config.dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(config.dim, config.dim, bias=False)
            self.k = nn.Linear(config.dim, config.dim, bias=False)
            self.v = nn.Linear(config.dim, config.dim, bias=False)
            self.o = nn.Linear(config.dim, config.dim, bias=False)
            self.gate = nn.Linear(config.dim, config.ffn, bias=False)
            self.up = nn.Linear(config.dim, config.ffn, bias=False)
            self.down = nn.Linear(config.ffn, config.dim, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            b, s, _ = x.shape
            h = self.norm1(x)

            def heads(t: torch.Tensor) -> torch.Tensor:
                return t.view(b, s, config.heads, head_dim).transpose(1, 2)

            q = rotate(heads(self.q(h)), cos, sin)
            k = torch.cat((past_k, rotate(heads(self.k(h)), cos, sin)), dim=2)
            v = torch.cat((past_v, heads(self.v(h))), dim=2)
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + mask
            attn = torch.softmax(scores, dim=-1) @ v
            x = x + self.o(attn.transpose(1, 2).reshape(b, s, config.dim))
            h = self.norm2(x)
            x = x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
            return x, k, v

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(config.vocab, config.dim)
            self.blocks = nn.ModuleList(Block() for _ in range(config.layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(config.dim, config.vocab, bias=False)
            inv = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            s = input_ids.shape[1]
            total = attention_mask.shape[1]
            start = total - s  # the cache's length
            positions = torch.arange(start, total, device=input_ids.device).float()
            angles = positions[:, None] * self.inv_freq[None, :]
            cos = torch.cat((angles.cos(), angles.cos()), dim=-1)[None, None]
            sin = torch.cat((angles.sin(), angles.sin()), dim=-1)[None, None]
            # causal over the new tokens, open to every cached one the mask keeps
            rows = torch.arange(start, total, device=input_ids.device)[:, None]
            cols = torch.arange(total, device=input_ids.device)[None, :]
            allowed = (cols <= rows)[None, None] & (attention_mask[:, None, None, :] > 0)
            mask = torch.where(allowed, 0.0, -1e9)
            x = self.embed(input_ids)
            if follow_dtype:
                cos, sin, mask = cos.to(x.dtype), sin.to(x.dtype), mask.to(x.dtype)
            present = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
                present += [k, v]
            return (self.head(self.norm(x)), *present)

    torch.manual_seed(0)
    return Decoder()


def empty_past(config: Config, batch: int = 1, device: str = "cpu") -> list[Any]:
    """A cache of length 0 for every layer's key and value."""
    import torch

    shape = (batch, config.heads, 0, config.dim // config.heads)
    return [torch.zeros(shape, device=device) for _ in range(2 * config.layers)]


def train(model: Any, config: Config, data: bytes, steps: int, seq: int = 128,
          batch: int = 8, lr: float = 1e-3, warmup: int = 0, device: str = "cpu"
          ) -> list[float]:
    """AdamW (`lr`, linear warm-up over `warmup` steps, then cosine to 0) on random
    windows of `data`, on `device`; the loss at each step.

    With ``warmup=0`` the schedule is torch's ``CosineAnnealingLR`` over `steps`, as
    before ``--size`` existed; the random windows are drawn on the CPU from the same
    seed whatever the device.
    """
    import torch

    torch.manual_seed(0)
    tokens = torch.tensor(list(data), dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    schedule: Any
    if warmup:
        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    else:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    losses: list[Any] = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - seq - 1, (batch,))
        x = torch.stack([tokens[s:s + seq] for s in starts]).to(device)
        y = torch.stack([tokens[s + 1:s + seq + 1] for s in starts]).to(device)
        logits = model(x, torch.ones_like(x), *empty_past(config, batch, device))[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.detach())
    model.eval()
    return [float(v) for v in losses]  # one device sync at the end, not one per step


def heldout_loss(model: Any, config: Config, text: bytes, seq: int, device: str = "cpu",
                 batch: int = 16) -> float:
    """Mean next-byte loss (nats) over the non-overlapping `seq`-byte windows of `text`."""
    import torch

    tokens = torch.tensor(list(text), dtype=torch.long)
    windows = (len(tokens) - 1) // seq
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, windows, batch):
            rows = range(first, min(windows, first + batch))
            x = torch.stack([tokens[r * seq:(r + 1) * seq] for r in rows]).to(device)
            y = torch.stack([tokens[r * seq + 1:(r + 1) * seq + 1] for r in rows]).to(device)
            logits = model(x, torch.ones_like(x), *empty_past(config, len(rows), device))[0]
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, config.vocab), y.reshape(-1), reduction="sum"))
            count += y.numel()
    return total / max(count, 1)


def export(model: Any, config: Config, path: Path) -> list[str]:
    """Write `model` to `path` with the KV-cache signature (module docstring); input names."""
    import torch

    names = [f"past_key_values.{i}.{kv}" for i in range(config.layers) for kv in ("key", "value")]
    outputs = ["logits"] + [n.replace("past_key_values", "present") for n in names]
    head_dim = config.dim // config.heads
    past = [torch.zeros(1, config.heads, 3, head_dim) for _ in names]
    ids = torch.zeros(1, 2, dtype=torch.long)
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch", 1: "seq"},
                                       "attention_mask": {0: "batch", 1: "total"},
                                       "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in names})
    axes.update({n: {0: "batch", 2: "total"} for n in outputs[1:]})
    torch.onnx.export(model, (ids, torch.ones(1, 5, dtype=torch.long), *past), str(path),
                      input_names=["input_ids", "attention_mask", *names],
                      output_names=outputs, dynamic_axes=axes, opset_version=17,
                      dynamo=False)
    return ["input_ids", "attention_mask", *names]


def decode_inputs(model: Any, config: Config, text: bytes, cache: int, count: int
                  ) -> list[dict[str, np.ndarray]]:
    """`count` decode-step input sets at a cache of `cache` tokens, from `text`."""
    import torch

    out: list[dict[str, np.ndarray]] = []
    stride = (len(text) - cache - 1) // count
    with torch.no_grad():
        for k in range(count):
            passage = list(text[k * stride:k * stride + cache + 1])
            ids = torch.tensor([passage[:cache]])
            result = model(ids, torch.ones_like(ids), *empty_past(config))
            present = result[1:]
            step = model(torch.tensor([[passage[cache]]]), torch.ones(1, cache + 1,
                                                                      dtype=torch.long),
                         *present)[0][0, -1]
            whole = model(torch.tensor([passage]), torch.ones(1, cache + 1, dtype=torch.long),
                          *empty_past(config))[0][0, -1]
            # the cache is right: one step on it gives what reading the whole passage gives
            assert torch.allclose(step, whole, atol=1e-3), float((step - whole).abs().max())
            feed = {"input_ids": np.array([[passage[cache]]], dtype=np.int64),
                    "attention_mask": np.ones((1, cache + 1), dtype=np.int64)}
            for i in range(config.layers):
                feed[f"past_key_values.{i}.key"] = present[2 * i].numpy()
                feed[f"past_key_values.{i}.value"] = present[2 * i + 1].numpy()
            out.append(feed)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="decoder shape: small (10.8 M parameters), medium (26.0 M; CPU) "
                        "or base (113.6 M; GPU)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where to train (export and decode sets are made on the CPU)")
    parser.add_argument("--steps", type=int, default=300, help="AdamW training steps")
    parser.add_argument("--batch", type=int, help="training batch (size's default)")
    parser.add_argument("--seq", type=int, help="training window in bytes (size's default)")
    parser.add_argument("--lr", type=float, help="peak learning rate (size's default)")
    parser.add_argument("--warmup", type=int, help="linear warm-up steps (size's default)")
    parser.add_argument("--cache", type=int, default=512, help="decode step's cache length")
    parser.add_argument("--sets", type=int, default=8, help="decode-step input sets")
    parser.add_argument("--save-weights", action="store_true",
                        help="also write the trained state_dict to DIR/decoder.pt")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    args.out.mkdir(parents=True, exist_ok=True)
    config = SIZES[args.size]
    training = {k: (getattr(args, k) if getattr(args, k) is not None else v)
                for k, v in TRAINING[args.size].items()}
    data = corpus()
    split = int(len(data) * 0.9)
    model = build(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.size} decoder: {params:,} parameters ({params / 1e6:.1f} M); "
          f"training {args.steps} steps on {args.device}: {training}", flush=True)
    gpu = None
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        model.to("cuda")
        gpu = torch.cuda.get_device_name(0)
    t0 = time.perf_counter()
    losses = train(model, config, data[:split], args.steps, int(training["seq"]),
                   int(training["batch"]), float(training["lr"]), int(training["warmup"]),
                   args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
    trained_s = time.perf_counter() - t0
    held = heldout_loss(model, config, data[split:], int(training["seq"]), args.device)
    if args.device == "cuda":  # the rest as on a CPU-only machine: float32, no TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model.to("cpu")
    if losses:
        print(f"loss {losses[0]:.3f} -> {float(np.mean(losses[-10:])):.3f} (last 10) in "
              f"{trained_s:.1f} s; held-out {held:.3f}", flush=True)
    if args.save_weights:
        torch.save(model.state_dict(), args.out / "decoder.pt")
    t1 = time.perf_counter()
    export(model, config, args.out / "decoder.onnx")
    export_s = time.perf_counter() - t1
    sets = args.out / "decode"
    sets.mkdir(exist_ok=True)
    t2 = time.perf_counter()
    for k, feed in enumerate(decode_inputs(model, config, data[split:], args.cache,
                                           args.sets)):
        np.savez(sets / f"set-{k}.npz", **feed)
    sets_s = time.perf_counter() - t2
    info = {"size": args.size, "config": asdict(config), "parameters": params,
            "steps": args.steps, "training": training, "device": args.device, "gpu": gpu,
            "corpus_bytes": len(data), "train_bytes": split,
            "loss_first": losses[0] if losses else None,
            "loss_last10": float(np.mean(losses[-10:])) if losses else None,
            "heldout_loss": round(held, 4),
            "train_s": round(trained_s, 1), "export_s": round(export_s, 1),
            "sets_s": round(sets_s, 1), "cache": args.cache, "sets": args.sets,
            "versions": {p: importlib.metadata.version(p) for p in ("torch", "onnx", "numpy")}}
    (args.out / "decoder.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
