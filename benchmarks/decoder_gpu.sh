#!/usr/bin/env bash
# The trained `base` decoder (113.6 M parameters) on one GPU: routetune on ONNX Runtime's
# CUDA provider against torch at the same decode step (issue 40).
#
# Usage, on a machine with a CUDA GPU, torch, onnxruntime-gpu (+ onnx-ir, CuPy) and
# routetune importable, from anywhere:
#
#     bash benchmarks/decoder_gpu.sh RESULTS [WORK] [TUNE_BUDGET_S]
#
# WORK (default $HOME/decoder-gpu) gets the model, its weights and decode sets, and the
# tune folders; RESULTS gets only what is worth keeping (logs, JSON, reports,
# trials.sqlite). Steps, each timed in RESULTS/timeline.txt, each under `timeout`:
#   gpu_tests. with REPO_ROOT (a checkout with tests/ and pyproject.toml): the CUDA
#      backend's tests, tests/plugins/onnxruntime/test_cuda.py;
#   decoder. benchmarks/decoder.py --size base --device cuda --steps 600 --sets 16
#      --cache 512 --save-weights (batch 32 of 256 bytes; export and decode sets on the CPU);
#   generate. routetune tune WORK/decoder.onnx --backend onnxruntime-cuda --tokens
#      (the held-out 10% of decoder.py's corpus) --cache-tokens 512 --generate-tokens 128:
#      the decode objective on 128 greedy steps of the FP32 model, judged by the decoder
#      default (logits:top1>=0.99,logits:kl<=0.01) -> RESULTS/generate/;
#   torch. benchmarks/decoder_torch.py: eager FP32, eager FP16, torch.compile FP16
#      (reduce-overhead), CUDA events, p50 of 300 single calls -> torch.json;
#   tune. routetune tune WORK/decoder.onnx --inputs WORK/decode (16 steps at a cache of
#      exactly 512) --accuracy "logits:kl<=0.01" -> tune.log, report.md, report.json,
#      run.json, winner.json, trials.sqlite;
#   torch_max_autotune (MAX_AUTOTUNE=1). decoder_torch.py with
#      torch.compile(mode="max-autotune") -> torch_max_autotune.json.
# Each routetune search has TUNE_BUDGET_S (default 240) of search. env.txt: nvidia-smi,
# versions, timestamps (and nvidia-smi before each step). RESULTS/current names the step
# running; "ALL" once every step has ended.
# For a smoke test without a GPU, override (environment): DECODER_ARGS (the decoder's
# size, device, steps, sets and cache), BACKEND (onnxruntime-cuda), TORCH_EXTRA ("" ; e.g.
# "--device cpu --calls 5"), COMPILE_MODE (reduce-overhead), GENERATE (128); GPU_TESTS,
# TORCH, TUNE (1; 0 skips that step).
set -u
DECODER_ARGS="${DECODER_ARGS:---size base --device cuda --steps 600 --sets 16 --cache 512}"
BACKEND="${BACKEND:-onnxruntime-cuda}"
TORCH_EXTRA="${TORCH_EXTRA:-}"
COMPILE_MODE="${COMPILE_MODE:-reduce-overhead}"
MAX_AUTOTUNE="${MAX_AUTOTUNE:-0}"
export COLUMNS=200
here="$(cd "$(dirname "$0")" && pwd)"
R="$(mkdir -p "${1:?RESULTS}" && cd "$1" && pwd)"
W="${2:-$HOME/decoder-gpu}"
BUDGET="${3:-240}"
mkdir -p "$W"
export PYTHONUNBUFFERED=1
step() {  # step NAME TIMEOUT_S COMMAND...: run one step, its log in RESULTS/NAME.log
  local name=$1 limit=$2; shift 2
  echo "$name" > "$R/current"
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used,temperature.gpu,clocks.sm \
    --format=csv,noheader >> "$R/gpu-before-steps.txt" 2>&1
  local s; s=$(date +%s)
  echo "$(date -u +%FT%TZ) begin $name" >> "$R/timeline.txt"
  timeout -k 10 "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$(date -u +%FT%TZ) end $name rc=$rc wall_s=$(( $(date +%s) - s ))" >> "$R/timeline.txt"
  return $rc
}
{
  date -u +"start %FT%TZ"
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import sys, torch, onnx, onnxruntime as o, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'onnx', onnx.__version__, 'onnxruntime', o.__version__, o.get_available_providers(), 'numpy', numpy.__version__)"
  python3 -c "import importlib.metadata as m; print('routetune', m.version('routetune'))" 2>&1
  python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1
  python3 -c "import onnx_ir; print('onnx_ir', onnx_ir.__version__)" 2>&1
  [ -f "$here/../.device/dec/rev.txt" ] && cat "$here/../.device/dec/rev.txt"
  nproc
} > "$R/env.txt" 2>&1

if [ -n "${REPO_ROOT:-}" ] && [ "${GPU_TESTS:-1}" = 1 ]; then  # the CUDA backend's tests
  step gpu_tests 300 bash -c "cd '$REPO_ROOT' && python3 -m pytest -q -p no:cacheprovider \
    -o addopts='-ra --import-mode=importlib' tests/plugins/onnxruntime/test_cuda.py"
fi
# shellcheck disable=SC2086  # the *_ARGS/*_EXTRA variables are word lists
step decoder 600 python3 "$here/decoder.py" --out "$W" $DECODER_ARGS --save-weights
cp "$W/decoder.json" "$R/" 2>/dev/null
if [ -f "$W/decoder.json" ] && [ -f "$W/decode/set-0.npz" ]; then
  step seasonings 120 python3 -m routetune seasonings
  python3 - "$W/heldout.txt" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from decoder import corpus
data = corpus()
held = data[int(len(data) * 0.9):][:8000]  # the held-out tail, as decoder.py splits it
open(sys.argv[1], "w", encoding="utf-8").write(held.decode("utf-8", "ignore"))
PY
  # the decode objective: 128 greedy steps of the FP32 model after 512 held-out bytes,
  # judged by the decoder default (logits:top1>=0.99,logits:kl<=0.01)
  step generate $(( BUDGET + 900 )) python3 -m routetune tune "$W/decoder.onnx" \
    --backend "$BACKEND" --tokens "$W/heldout.txt" --cache-tokens 512 \
    --generate-tokens "${GENERATE:-128}" --time-budget "$BUDGET" --output "$W/generate"
  mkdir -p "$R/generate"
  for f in report.md report.json run.json winner.json winner.toml trials.sqlite; do
    [ -f "$W/generate/$f" ] && cp "$W/generate/$f" "$R/generate/"
  done
  if [ "${TORCH:-1}" = 1 ]; then
    step torch 400 python3 "$here/decoder_torch.py" --dir "$W" --out "$R/torch.json" \
      --modes eager-fp32,eager-fp16,compile-fp16 --compile-mode "$COMPILE_MODE" $TORCH_EXTRA
  fi
  if [ "${TUNE:-1}" = 1 ]; then
    step tune $(( BUDGET + 600 )) python3 -m routetune tune "$W/decoder.onnx" \
      --inputs "$W/decode" --backend "$BACKEND" --accuracy "logits:kl<=0.01" \
      --time-budget "$BUDGET" --output "$W/tune"
  fi
  for f in report.md report.json run.json winner.json winner.toml trials.sqlite; do
    [ -f "$W/tune/$f" ] && cp "$W/tune/$f" "$R/"
  done
  if [ "$MAX_AUTOTUNE" = 1 ]; then
    step torch_max_autotune 500 python3 "$here/decoder_torch.py" --dir "$W" \
      --out "$R/torch_max_autotune.json" --modes eager-fp32,compile-fp16 \
      --compile-mode max-autotune $TORCH_EXTRA
  fi
fi
{ date -u +"end %FT%TZ"; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv; } >> "$R/env.txt" 2>&1
echo ALL > "$R/current"
