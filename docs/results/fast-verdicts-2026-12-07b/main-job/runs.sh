set -u
R=$1; shift; mkdir -p $R
cd /tmp
for spec in "$@"; do
  set -- $spec; which=$1; n=$2
  run=$which-main-$n
  pp=/tmp/newpkg; [ "$which" = old ] && pp=/tmp/oldpkg
  cache=$R/cache-$run; mkdir -p $cache/models; cp -r /root/.cache/routetune/models/* $cache/models/
  s=$(date +%s.%N); la=$(cut -d' ' -f1-3 /proc/loadavg)
  ROUTETUNE_CACHE=$cache PYTHONPATH=$pp /work/main/.venv/bin/routetune tune --example ppocr-det --output $R/$run > $R/$run.log 2>&1
  echo "$which main rc=$? $(echo "$(date +%s.%N) - $s" | bc) s loadavg_before=$la $(date +%H:%M:%S)" >> $R/walls.txt
done
echo ALL >> $R/walls.txt
