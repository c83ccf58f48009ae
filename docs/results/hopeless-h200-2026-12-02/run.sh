#!/usr/bin/env bash
# One-off, on the GPU machine: GPU tests, then the hopeless-candidate stop before/after
# (ffdcb96 = before, the working tree = after), alternating, same command.
export PYTHONPATH=$HOME/site
export ROUTETUNE_CACHE=$HOME/rtcache
mkdir -p $ROUTETUNE_CACHE/models && cp -r .device/p6/models/* $ROUTETUNE_CACHE/models/
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target $HOME/site_old .device/p6/old > $OUT/old-install.txt 2>&1
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv > $OUT/gpu.txt
uptime >> $OUT/gpu.txt
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/plugins/onnxruntime tests/plugins/tensorrt > $OUT/gpu-tests.txt 2>&1
  tail -3 $OUT/gpu-tests.txt
fi
for run in ${RUNS:-old:1 new:1}; do
  v=${run%%:*}; i=${run##*:}
  if [ $v = old ]; then PP=$HOME/site_old:$HOME/site; else PP=$HOME/site; fi
  s=$(date +%s.%N)
  PYTHONPATH=$PP timeout 240 python3 -m routetune tune --example ppocr-rec --backend onnxruntime-cuda \
    --seasonings ort-cuda-conv-algo --search exhaustive --max-depth 1 --confirm-repeats 1 \
    --output /tmp/rt/$v-$i --fresh > $OUT/$v-$i.txt 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "$v $i rc=$rc wall_s=$(python3 -c "print(round($e-$s,1))") $(uptime)" | tee -a $OUT/walls.txt
  mkdir -p $OUT/$v-$i && cp /tmp/rt/$v-$i/artifacts/timeline.jsonl /tmp/rt/$v-$i/report.json /tmp/rt/$v-$i/run.json $OUT/$v-$i/ 2>/dev/null
done
