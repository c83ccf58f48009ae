"""Models as today's PyTorch exporters write them, for the zoo sweep (`zoo.py --exports`).

Usage (in a venv with torch, torchvision, timm, transformers and onnxscript; CI has no
torch, so the models are made here and the sweep reads them):

    python benchmarks/exports.py --out /tmp/exports          # writes *.onnx and exports.json

Each model is small (hidden 32 to 64, 2 layers), has seeded random weights
(``torch.manual_seed(0)``) and is exported by the exporter its key names: ``dynamo``
(``torch.onnx.export(..., dynamo=True)``, its default opset, onnxscript's optimizer) or
``ts`` (TorchScript, ``dynamo=False``, opset 17). ``exports.json`` lists each file with
its inputs (name, shape, dtype and, for token ids, the vocabulary), so that `zoo.py` can
make input sets without torch. The recipe is this file; the versions used are written
into each model's ``doc_string`` and into ``exports.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB = 100
"""Token ids of the text models are drawn from [0, VOCAB)."""


@dataclass(frozen=True)
class Export:
    """One model to export.

    Args:
        key: Its name: ``<family>-<exporter>``.
        make: Builds the ``torch.nn.Module`` (eval mode, seeded).
        inputs: Input name to (shape, dtype, vocabulary or None).
        family: What it stands for (vision CNN, ViT, decoder …).
    """

    key: str
    make: Callable[[], Any]
    inputs: dict[str, tuple[tuple[int, ...], str, int | None]]
    family: str

    @property
    def dynamo(self) -> bool:
        """Whether the dynamo exporter writes it (else TorchScript)."""
        return self.key.endswith("-dynamo")


def _last_state(model: Any, **kwargs: Any) -> Any:
    """`model` wrapped to return its ``last_hidden_state`` only (a tensor, not a dict)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(*args, **kwargs).last_hidden_state

    return Wrapped().eval()


def _logits(model: Any) -> Any:
    """`model` wrapped to return its logits only."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(*args, use_cache=False).logits

    return Wrapped().eval()


def _torchvision(name: str) -> Callable[[], Any]:
    def make() -> Any:
        import torch
        import torchvision

        torch.manual_seed(0)
        return getattr(torchvision.models, name)(weights=None, num_classes=10).eval()
    return make


def _timm(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make() -> Any:
        import timm
        import torch

        torch.manual_seed(0)
        return timm.create_model(name, pretrained=False, **kwargs).eval()
    return make


def _hf(config_name: str, model_name: str, wrap: Callable[[Any], Any], **config: Any
        ) -> Callable[[], Any]:
    def make() -> Any:
        import torch
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_name)(**config)
        return wrap(getattr(transformers, model_name)(cfg).eval())
    return make


IMAGE = {"x": ((1, 3, 64, 64), "float32", None)}
TOKENS = {"input_ids": ((1, 16), "int64", VOCAB)}
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "vocab_size": VOCAB}

EXPORTS: tuple[Export, ...] = (
    Export("resnet18-dynamo", _torchvision("resnet18"), IMAGE, "vision CNN"),
    Export("mobilenet-v3-ts", _torchvision("mobilenet_v3_small"), IMAGE, "vision CNN"),
    Export("efficientnet-b0-dynamo", _torchvision("efficientnet_b0"), IMAGE, "vision CNN"),
    Export("convnext-ts", _timm("convnext_atto", num_classes=10), IMAGE, "vision CNN"),
    Export("vit-dynamo", _timm("vit_tiny_patch16_224", img_size=64, patch_size=16,
                               embed_dim=64, depth=2, num_heads=4, num_classes=10),
           IMAGE, "ViT (packed QKV)"),
    Export("swin-ts", _timm("swin_tiny_patch4_window7_224", img_size=64, embed_dim=32,
                            depths=(1, 1), num_heads=(2, 4), window_size=4,
                            num_classes=10), IMAGE, "Swin (packed QKV, windows)"),
    Export("bert-ts", _hf("BertConfig", "BertModel", _last_state, **SMALL),
           {**TOKENS, "attention_mask": ((1, 16), "int64", 2)}, "encoder"),
    Export("gpt2-dynamo", _hf("GPT2Config", "GPT2LMHeadModel", _logits, n_embd=32, n_layer=2,
                          n_head=4, vocab_size=VOCAB, use_cache=False), TOKENS, "decoder"),
    Export("llama-dynamo", _hf("LlamaConfig", "LlamaForCausalLM", _logits,
                               num_key_value_heads=2, **SMALL), TOKENS,
           "decoder (RMSNorm, rotary, grouped-query)"),
    Export("t5-encoder-ts", _hf("T5Config", "T5EncoderModel", _last_state, d_model=32,
                                d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                vocab_size=VOCAB), TOKENS, "encoder (RMSNorm)"),
    Export("whisper-encoder-dynamo", lambda: _whisper(), {
        "input_features": ((1, 80, 64), "float32", None)}, "audio encoder"),
    Export("wav2vec2-ts", _hf("Wav2Vec2Config", "Wav2Vec2Model", _last_state,
                              conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                              num_feat_extract_layers=2, **SMALL),
           {"input_values": ((1, 1600), "float32", None)}, "audio encoder (convolutions)"),
)
"""Twelve models of today's exporters: four CNNs, two vision transformers, two encoders,
two decoders, two audio models; six by each exporter."""


def _whisper() -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64,
                                     num_mel_bins=80, max_source_positions=32,
                                     vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=1)
    encoder = transformers.WhisperModel(cfg).eval().get_encoder()
    return _last_state(encoder)


def export(entry: Export, out: Path) -> dict[str, Any]:
    """Export `entry` to ``out/<key>.onnx``; its manifest row."""
    import onnx
    import torch

    model = entry.make()
    args = tuple(_example(shape, dtype, vocab) for shape, dtype, vocab in entry.inputs.values())
    path = out / f"{entry.key}.onnx"
    with torch.no_grad():
        if entry.dynamo:
            program = torch.onnx.export(model, args, input_names=list(entry.inputs),
                                        output_names=["y"], dynamo=True)
            assert program is not None
            program.save(str(path))
        else:
            torch.onnx.export(model, args, str(path), input_names=list(entry.inputs),
                              output_names=["y"], opset_version=17, dynamo=False)
    proto = onnx.load(str(path))
    proto.doc_string = f"routetune exporter zoo: {versions()}"
    onnx.save(proto, str(path))
    return {"key": entry.key, "file": path.name, "family": entry.family,
            "exporter": "dynamo" if entry.dynamo else "torchscript",
            "opset": max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
            "nodes": len(proto.graph.node),
            "inputs": {k: {"shape": list(s), "dtype": d, "vocab": v}
                       for k, (s, d, v) in entry.inputs.items()}}


def _example(shape: tuple[int, ...], dtype: str, vocab: int | None) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    if vocab is not None:
        return torch.randint(0, vocab, shape, generator=g, dtype=getattr(torch, dtype))
    return torch.randn(shape, generator=g, dtype=getattr(torch, dtype))


def versions() -> str:
    """The versions that made the models."""
    names = ("torch", "torchvision", "timm", "transformers", "onnxscript", "onnx")
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="keys, comma-separated")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], {}
    for entry in EXPORTS:
        if args.only and entry.key not in args.only.split(","):
            continue
        try:
            rows.append(export(entry, args.out))
            print(f"{entry.key}: {rows[-1]['nodes']} nodes, opset {rows[-1]['opset']}")
        except Exception as e:  # one model's failure is recorded, the rest go on
            failed[entry.key] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            print(f"{entry.key}: FAILED {failed[entry.key]}")
    (args.out / "exports.json").write_text(json.dumps(
        {"versions": versions(), "models": rows, "failed": failed}, indent=2) + "\n")


if __name__ == "__main__":
    main()
