# The recogniser runs: bash runs-rec.sh OUT "old rec 1" "new rec 1" ...
# before: a copy of 37fcf83's package (core/ as routetune, passes/ and plugins/ in it)
# after: the same of 813df09 (254b7cf, and failed-accuracy timing for a repair's bar)
set -u
R=$1; shift; mkdir -p $R
cd /tmp
for spec in "$@"; do
  set -- $spec; which=$1; m=$2; n=$3
  run=$which-ppocr-$m-$n
  pp=/tmp/newpkg4; [ "$which" = old ] && pp=/tmp/oldpkg3
  cache=$R/cache-$run; mkdir -p $cache/models; cp -r /tmp/prof/cache/models/* $cache/models/
  s=$(date +%s.%N); la=$(cut -d' ' -f1-3 /proc/loadavg)
  COLUMNS=80 ROUTETUNE_CACHE=$cache PYTHONPATH=$pp /work/main/.venv/bin/routetune tune --example ppocr-$m --backend onnxruntime,openvino --output $R/$run > $R/$run.log 2>&1
  echo "$which ppocr-$m rc=$? $(echo "$(date +%s.%N) - $s" | bc) s loadavg_before=$la $(date +%H:%M:%S)" >> $R/walls.txt
  rm -rf $cache
done
echo ALL >> $R/walls.txt
