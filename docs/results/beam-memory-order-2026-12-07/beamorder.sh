set -u
cd /tmp
R=/tmp/beamorder; rm -rf $R; mkdir -p $R
/work/main/.venv/bin/routetune tune /tmp/dec1/decoder.onnx --inputs /tmp/dec1/decode --seasonings fuse-attention,int8-weights --search exhaustive --accuracy "logits:kl<=0.01" --output $R/seed --memory $R/seed.sqlite > $R/seed.log 2>&1
for run in old1 new1 old2 new2; do
  cp $R/seed.sqlite $R/$run.sqlite
  pp=""; [ "${run#old}" != "$run" ] && pp=/tmp/oldpkg
  s=$(date +%s.%N); la=$(cut -d' ' -f1-3 /proc/loadavg)
  PYTHONPATH=$pp /work/main/.venv/bin/python -m routetune tune /tmp/dec1/decoder.onnx --inputs /tmp/dec1/decode --accuracy "logits:kl<=0.01" --output $R/$run --memory $R/$run.sqlite --time-budget 60 > $R/$run.log 2>&1
  echo "$run rc=$? wall=$(echo "$(date +%s.%N) - $s" | bc) load_before=$la" >> $R/walls.txt
done
echo ALL >> $R/walls.txt
