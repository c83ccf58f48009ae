set -u
R=/tmp/bench/two; rm -rf $R; mkdir -p $R
cd /tmp
for spec in "old det 1" "new det 1" "new det 2" "old det 2" "old rec 1" "new rec 1"; do
  set -- $spec; which=$1; m=$2; n=$3
  run=$which-ppocr-$m-$n
  pp=""; [ "$which" = old ] && pp=/tmp/oldpkg
  cache=$R/cache-$run; mkdir -p $cache/models; cp -r /root/.cache/routetune/models/* $cache/models/
  s=$(date +%s.%N); la=$(cut -d' ' -f1-3 /proc/loadavg)
  ROUTETUNE_CACHE=$cache PYTHONPATH=$pp /work/main/.venv/bin/python -m routetune tune --example ppocr-$m --backend onnxruntime,openvino --output $R/$run > $R/$run.log 2>&1
  echo "$which ppocr-$m rc=$? $(echo "$(date +%s.%N) - $s" | bc) s loadavg_before=$la $(date +%H:%M:%S)" >> $R/walls.txt
done
echo ALL >> $R/walls.txt
