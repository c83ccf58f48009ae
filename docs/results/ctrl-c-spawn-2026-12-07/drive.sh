cd "$(dirname "$0")"
PY=${PY:-python}
$PY repro.py ${1:-20} 2> /tmp/ctrl-c-spawn-err.txt & pid=$!
sleep 1
while kill -0 $pid 2>/dev/null; do kill -INT $pid 2>/dev/null; sleep 0.01; done
wait $pid
grep -c "spawn_main" /tmp/ctrl-c-spawn-err.txt; tail -1 /tmp/ctrl-c-spawn-err.txt
