#!/usr/bin/env bash
# The route memory on the H200 (issue 38): exhaustive tables, then the learned search
# on the transformer encoders with a memory learned from the CNNs only.
#
# Usage, on the GPU machine with onnxruntime-gpu installed (../shared/device/README.md),
# from the repository's root, OUT being where results go:
#   bash benchmarks/memory_h200.sh tables OUT    # signatures, MobileNetV3's exhaustive
#                                               # table, every H200 table, the seed memory
#   bash benchmarks/memory_h200.sh learned OUT MODEL RUNS   # MODEL (bert or hf-bert)
#                                               # tuned RUNS times, each from a fresh copy
#                                               # of the seed memory, a 90 s budget
#                                               # (BUDGET=S for another)
set -euo pipefail
stage=$1
out=$2
seed=${SEED:-$HOME/seed-memory.sqlite}  # SEED: a seed memory carried in
tables=$HOME/tables
if [ "$stage" = tables ]; then
  python3 benchmarks/signatures.py --models resnet50,bert,hf-bert,mobilenetv3 --out /tmp/sig
  cp /tmp/sig/*.json "$out/"
  python3 benchmarks/search_efficiency.py --models mobilenetv3 --strategies exhaustive \
    --out /tmp/se > "$out/exhaustive-mobilenetv3.log" 2>&1
  tail -2 "$out/exhaustive-mobilenetv3.log"
  cp /tmp/se/search_efficiency.json "$out/search_efficiency-mobilenetv3.json"
  cp /tmp/se/mobilenetv3/exhaustive/trials.sqlite "$out/exhaustive-mobilenetv3-trials.sqlite"
  mkdir -p "$tables"
  python3 benchmarks/replay_search.py --trials docs/results/gpu-h200-2026-12-02c/exhaustive-bert-trials.sqlite \
    --export-table "$tables/bert-h200.json" --family bert --signature /tmp/sig/signature-bert.json \
    --source "docs/results/gpu-h200-2026-12-02c (exhaustive, 2026-12-02)"
  python3 benchmarks/replay_search.py --trials /tmp/se/mobilenetv3/exhaustive/trials.sqlite \
    --export-table "$tables/mobilenetv3-h200.json" --family mobilenetv3 \
    --signature /tmp/sig/signature-mobilenetv3.json \
    --source "benchmarks/search_efficiency.py --models mobilenetv3 --strategies exhaustive (2026-12-03)"
  python3 benchmarks/replay_search.py --efficiency docs/results/gpu-h200-2026-12-01/search_efficiency-resnet50.json \
    --family resnet50 --signature /tmp/sig/signature-resnet50.json --like "$tables/bert-h200.json" \
    --export-table "$tables/resnet50-h200.json" --source "docs/results/gpu-h200-2026-12-01 (exhaustive, 2026-12-01)"
  cp "$tables"/*.json "$out/"
  rm -f "$seed"
  python3 benchmarks/replay_search.py --tables "$tables" --families resnet50,mobilenetv3 --write-memory "$seed"
elif [ "$stage" = learned ]; then
  model=$3
  for i in $(seq 1 "$4"); do
    cp "$seed" "/tmp/memory-$model-$i.sqlite"
    python3 benchmarks/gpu.py --models "$model" --search learned --in-process --max-depth 4 \
      --budget-s "${BUDGET:-90}" --fresh --no-baselines --memory "/tmp/memory-$model-$i.sqlite" \
      --seasonings fuse-attention,ort-transformer-fusion,fp16,ort-cuda-graph,ort-cuda-sdpa-kernel \
      --out "/tmp/learned-$model-$i" > "$out/learned-$model-$i.log" 2>&1 || true
    cp "/tmp/learned-$model-$i/benchmark.json" "$out/learned-$model-$i.json" || true
    python3 -c "import json,sys; r=json.load(open('$out/learned-$model-$i.json'))['models']['$model']; print('$model run $i', r['winner'], r['tuning_s'], 's', r['builds'], 'builds', [c['speedup'] for c in r['confirmed']], r['memory'])" || tail -5 "$out/learned-$model-$i.log"
  done
fi
