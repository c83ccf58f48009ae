#!/usr/bin/env bash
# The exporter zoo on the H200 (issue 39): today's exporters' models, tuned on
# onnxruntime-cuda with a short budget.
#
# Usage, on the GPU machine with onnxruntime-gpu installed (../shared/device/README.md),
# from the repository's root, OUT being where results go:
#   bash benchmarks/exports_h200.sh OUT KEYS [BUDGET]   # KEYS: comma-separated, or "all"
# The models are exported once per machine into ~/exports (the device has torch, timm,
# transformers and onnxscript), then swept; each call stays under the device's 10 min.
set -euo pipefail
out=$1
keys=$2
budget=${3:-40}
exports=$HOME/exports
if [ ! -f "$exports/exports.json" ]; then
  python3 benchmarks/exports.py --out "$exports" > "$out/exports.log" 2>&1 || true
  grep -E "nodes, opset|FAILED" "$out/exports.log" || tail -5 "$out/exports.log"
fi
only=()
[ "$keys" = all ] || only=(--only "$keys")
python3 benchmarks/zoo.py --exports "$exports" --backend onnxruntime-cuda \
  --time-budget "$budget" --out /tmp/zoo-gpu --results "$out" "${only[@]}" 2>&1 \
  | grep -E '^\{"key"|"models"|finished|wall' | cut -c1-400
