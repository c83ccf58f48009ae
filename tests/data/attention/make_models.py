"""Export the tiny attention models that ``fuse-attention``'s tests read.

Not run by the tests (CI has no torch): run it by hand and commit the ``.onnx`` files.

    pip install torch transformers timm onnxscript     # into a venv of your own
    python tests/data/attention/make_models.py     # writes tests/data/attention/*.onnx

Generated 2026-12-01 with torch 2.14.1, transformers 5.24.0, onnxscript 0.7.2 and
onnx 1.23.2; the ``timm_vit_*`` models on 2026-12-04 with torch 2.14.1, timm 1.0.31,
onnxscript 0.7.2 and onnx 1.23.2 (the versions are also written into each model's
``doc_string``). Weights are
random (seeded); every model is saved with ``ir_version`` 8. The models:

- ``bert_{eager,sdpa}_{torchscript,dynamo}.onnx``: a Hugging Face ``BertModel`` (hidden
  32, 2 layers, 4 heads, FFN 64, vocabulary 100, no pooler) with
  ``attn_implementation`` ``eager`` or ``sdpa``, exported by TorchScript
  (``dynamo=False``, opset 17, dynamic batch and sequence) or by the dynamo exporter
  (``dynamo=True``, its default opset, static (2, 16)). Inputs ``input_ids`` and
  ``attention_mask``, (B, S) int64; output ``y``, (B, S, 32) float32.
- ``bert_static_torchscript.onnx``: ``benchmarks/exports.py``'s ``bert-ts`` (the same
  BERT, static (1, 16), transformers 5.25.0 with torch 2.14.1), whose TorchScript export
  writes a (1, −1, 16, 8) Reshape after MatMul(probs, V) that shape inference cannot
  prove keeps the batch.
- ``vit_torchscript.onnx``, ``vit_dynamo.onnx``: a Hugging Face ``ViTModel`` (32×32
  images, patch 8, hidden 32, 2 layers, 4 heads, no pooler; its default attention);
  input ``pixel_values`` (2, 3, 32, 32) float32; output ``y``, (2, 17, 32) float32.
- ``timm_vit_{eager,sdpa}_{torchscript,dynamo}.onnx``: a timm ``VisionTransformer``
  (32×32 images, patch 8, embed 32, 2 blocks, 4 heads, no head): Q, K and V packed in
  one projection and unbound; ``fused_attn`` off (``eager``) or on (``sdpa``); input
  ``pixel_values`` (2, 3, 32, 32) float32; output ``y``, (2, 17, 32) float32.
- ``gpt2_{eager,sdpa}_{torchscript,dynamo}.onnx``: a Hugging Face ``GPT2Model`` (hidden
  32, 2 layers, 4 heads, vocabulary 100, ``use_cache=False``): causal self-attention with
  a padding mask, its QKV projection one ``Conv1D`` split in three; inputs and output as
  BERT's (the dynamo export static (2, 16)).
- ``encoder_torchscript.onnx``: `benchmarks/gpu.py`'s ``Encoder`` (fused QKV projection
  split in three, scale by Mul after Q·Kᵀ, no mask) at width 32, 4 heads, 2 layers,
  exported as `benchmarks/gpu.py` exports it (TorchScript, opset 17, static shapes: its
  Slice outputs have no inferred shape); input ``ids`` (2, 16) int64; output ``y``,
  (2, 16, 32) float32. ``encoder_dynamic_torchscript.onnx``: the same with dynamic
  batch and sequence.
- ``decoder_torchscript.onnx`` (2026-12-07, torch 2.13.0, onnx 1.23.2):
  `benchmarks/decoder.py`'s Llama-shaped decoder (rotary position embedding, causal and
  padding mask, KV cache) at width 32, 2 layers, 4 heads, SwiGLU 64, vocabulary 256,
  untrained (seeded), exported by its ``export`` (TorchScript, opset 17): inputs
  ``input_ids`` (B, S) int64, ``attention_mask`` (B, P + S) int64,
  ``past_key_values.{0,1}.{key,value}`` (B, 4, P, 8) float32; outputs ``logits``
  (B, S, 256) and ``present.{0,1}.{key,value}`` (B, 4, P + S, 8).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import onnx

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))


def bert(attn: str) -> Any:
    """A tiny BertModel that takes (input_ids, attention_mask) and returns the last state."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                        initializer_range=0.3,
                        attn_implementation=attn)
    model = BertModel(config, add_pooling_layer=False).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask
                             ).last_hidden_state

    return Wrapped().eval()


def gpt2(attn: str) -> Any:
    """A tiny GPT2Model (no KV cache) on (input_ids, attention_mask): the last state."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                        use_cache=False, attn_implementation=attn, initializer_range=0.3)
    model = GPT2Model(config).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt2 = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> torch.Tensor:
            return self.gpt2(input_ids=input_ids, attention_mask=attention_mask,
                             use_cache=False).last_hidden_state

    return Wrapped().eval()


def vit() -> Any:
    """A tiny ViTModel on (2, 3, 32, 32) images that returns the last state."""
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64,
                       initializer_range=0.3)
    model = ViTModel(config, add_pooling_layer=False).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.vit(pixel_values=pixel_values).last_hidden_state

    return Wrapped().eval()


def timm_vit(fused_attn: bool) -> Any:
    """A tiny timm VisionTransformer on (2, 3, 32, 32) images, its features unpooled.

    timm's ``Attention`` projects Q, K and V with one Linear, reshapes to
    (B, S, 3, N, H), permutes to (3, B, N, S, H) and unbinds; with `fused_attn` it
    calls ``F.scaled_dot_product_attention``, else it writes the product out.
    """
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                              patch_size=8, embed_dim=32, depth=2, num_heads=4,
                              num_classes=0, global_pool="")
    for block in model.blocks:
        block.attn.fused_attn = fused_attn
    return model.eval()


def decoder() -> None:
    """`benchmarks/decoder.py`'s decoder, tiny and untrained, as ``decoder_torchscript``."""
    import importlib.metadata

    import torch
    from decoder import Config, build
    from decoder import export as export_decoder

    config = Config(dim=32, layers=2, heads=4, ffn=64)
    path = HERE / "decoder_torchscript.onnx"
    with torch.no_grad():
        export_decoder(build(config).eval(), config, path)
    model = onnx.load(str(path))
    model.ir_version = 8
    model.doc_string = (f"routetune fuse-attention fixture: torch {torch.__version__}, "
                        f"benchmarks/decoder.py, onnx {importlib.metadata.version('onnx')}, "
                        "TorchScript exporter")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    print(f"{path.name}: {path.stat().st_size} bytes")


def export(module: Any, example: dict[str, Any], name: str, dynamo: bool,
           dynamic: bool = True) -> None:
    """Export `module` on `example` to ``HERE/name.onnx`` with ir_version 8.

    TorchScript exports get dynamic batch and sequence axes on token inputs when
    `dynamic`.
    """
    import importlib.metadata

    import onnxscript
    import torch

    path = HERE / f"{name}.onnx"
    args = tuple(example.values())
    with torch.no_grad():
        if dynamo:
            program = torch.onnx.export(module, args, input_names=list(example),
                                        output_names=["y"], dynamo=True)
            assert program is not None
            program.save(str(path))
        else:
            axes = {k: {0: "batch", 1: "seq"} for k in example if dynamic and v_is_ids(k)}
            torch.onnx.export(module, args, str(path), input_names=list(example),
                              output_names=["y"], opset_version=17, dynamo=False,
                              dynamic_axes=axes or None)
    model = onnx.load(str(path))
    model.ir_version = 8
    made_by = "timm" if name.startswith("timm") else "transformers"
    model.doc_string = (f"routetune fuse-attention fixture: torch {torch.__version__}, "
                        f"{made_by} {importlib.metadata.version(made_by)}, onnxscript "
                        f"{onnxscript.__version__}, onnx {onnx.__version__}, "
                        f"{'dynamo' if dynamo else 'TorchScript'} exporter")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    print(f"{path.name}: {path.stat().st_size} bytes, "
          f"{sum(n.op_type == 'Softmax' for n in model.graph.node)} Softmax")


def v_is_ids(name: str) -> bool:
    """Whether an input is a (B, S) token tensor, given dynamic batch and sequence axes."""
    return name in ("input_ids", "attention_mask", "ids")


def main() -> None:
    import torch
    from gpu import Encoder

    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 8:] = 0
    for attn in ("eager", "sdpa"):
        for dynamo in (False, True):
            export(bert(attn), {"input_ids": ids, "attention_mask": mask},
                   f"bert_{attn}_{'dynamo' if dynamo else 'torchscript'}", dynamo)
    for attn in ("eager", "sdpa"):
        for dynamo in (False, True):
            export(gpt2(attn), {"input_ids": ids, "attention_mask": mask},
                   f"gpt2_{attn}_{'dynamo' if dynamo else 'torchscript'}", dynamo)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for dynamo in (False, True):
        export(vit(), {"pixel_values": pixels},
               f"vit_{'dynamo' if dynamo else 'torchscript'}", dynamo)
    for fused in (False, True):
        for dynamo in (False, True):
            export(timm_vit(fused), {"pixel_values": pixels},
                   f"timm_vit_{'sdpa' if fused else 'eager'}_"
                   f"{'dynamo' if dynamo else 'torchscript'}", dynamo)
    torch.manual_seed(0)
    encoder = Encoder(width=32, heads=4, layers=2, ffn=64, vocab=100).eval()
    export(encoder, {"ids": ids}, "encoder_torchscript", False, dynamic=False)
    export(encoder, {"ids": ids}, "encoder_dynamic_torchscript", False)
    decoder()


if __name__ == "__main__":
    main()
