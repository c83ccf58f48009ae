"""The route memory's signature of each benchmark model, as `benchmarks/gpu.py` builds it.

Usage, where torch (and torchvision) can build the models (the GPU machine):

    python benchmarks/signatures.py --models resnet50,bert,mobilenetv3 --out DIR

Writes ``DIR/signature-NAME.json`` (`routetune.model.signature.ModelSignature.to_json`):
what `benchmarks/replay_search.py --export-table --signature` needs for a table whose
model cannot be built on the machine that exports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu import _feeds, build_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet50,bert,mobilenetv3")
    parser.add_argument("--out", type=Path, default=Path("routetune-out/signatures"))
    args = parser.parse_args()
    import onnx

    from routetune.model.signature import ModelSignature

    for name in args.models.split(","):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        _, path, inputs = build_model(name, folder)
        feeds = _feeds(name, inputs)[0]
        sig = ModelSignature.of(onnx.load(str(path), load_external_data=False), feeds)
        (args.out / f"signature-{name}.json").write_text(json.dumps(sig.to_json()) + "\n")
        print(name, sig.parameters, sum(sig.ops.values()), "nodes", sig.inputs, flush=True)


if __name__ == "__main__":
    main()
