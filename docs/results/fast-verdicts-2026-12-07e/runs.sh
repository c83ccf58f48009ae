# The runs of this folder: bash runs.sh OUT "old det 1" "new det 1" ...
# walls-1.txt: "old det 1" "new det 1" "new det 2" "old det 2" "old rec 1" "new rec 1"
#   (after: the working tree's editable install, at f13be05 before its bisection change)
# walls-2.txt: "old rec 2" "new rec 2" "old cls 1" "new cls 1" "new cls 2" "old cls 2"
#   (after: a copy of f13be05's package in /tmp/newpkg)
# before: a copy of 91886a4's package (core/ as routetune, passes/ and plugins/ in it)
# OLDPKG, NEWPKG, MODELS: the two packages and the example models to copy (defaults as
# this stop ran; later stops set them, fast-verdicts-2026-12-07c/README.md)
set -u
R=$1; shift; mkdir -p $R
cd /tmp
for spec in "$@"; do
  set -- $spec; which=$1; m=$2; n=$3
  run=$which-ppocr-$m-$n
  pp=${NEWPKG:-/tmp/newpkg}; [ "$which" = old ] && pp=${OLDPKG:-/tmp/oldpkg}
  cache=$R/cache-$run; mkdir -p $cache/models; cp -r ${MODELS:-/root/.cache/routetune/models}/* $cache/models/
  s=$(date +%s.%N); la=$(cut -d' ' -f1-3 /proc/loadavg)
  ROUTETUNE_CACHE=$cache PYTHONPATH=$pp routetune tune --example ppocr-$m --backend onnxruntime,openvino --output $R/$run > $R/$run.log 2>&1
  echo "$which ppocr-$m rc=$? $(echo "$(date +%s.%N) - $s" | bc) s loadavg_before=$la $(date +%H:%M:%S)" >> $R/walls.txt
done
echo ALL >> $R/walls.txt
