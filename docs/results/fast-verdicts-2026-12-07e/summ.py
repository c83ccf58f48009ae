"""One line per run: each backend's search seconds, trials measured/stored, confirmations,
base trial p50, trials marked by the pace check, seconds waited, and the winner."""
import json
import sqlite3
import sys
from pathlib import Path

for run in sys.argv[1:]:
    r = Path(run)
    out = []
    bj = json.loads((r / "backends.json").read_text())
    for b in ("onnxruntime", "openvino"):
        ev = [json.loads(line) for line in open(r / b / "artifacts" / "timeline.jsonl")]
        search = [e for e in ev if e["phase"] in ("build", "measure")]
        conf = [e for e in ev if e["phase"] == "confirm"]
        db = sqlite3.connect(r / b / "trials.sqlite")
        base = db.execute("select json_extract(latency,'$.p50') from trials where route='base'").fetchone()[0]
        paced = db.execute("select count(*) from trials where noisy like 'the base route ran%'").fetchone()[0]
        waited = db.execute("select coalesce(sum(json_extract(conditions,'$.waited_s')),0) from trials").fetchone()[0]
        n = db.execute("select count(*) from trials").fetchone()[0]
        repair = db.execute("select count(*) from trials where route like '%precision-repair%' and status!='skipped'").fetchone()[0]
        span = max(e["end"] for e in search) - min(e["start"] for e in search)
        measured = len([e for e in search if e["phase"] == "measure"])
        out.append(f"{b}: search {span:.0f} s, {measured} measured of {n} trials, "
                   f"repair trials {repair}, confirms {len(conf)}, base p50 {base:.3f} ms, "
                   f"pace-marked {paced}, waited {waited:.0f} s")
    w = bj["winner"]
    print(r.name, "|", " | ".join(out), "| winner", w.get("backend"), w.get("route"))
