"""python phase.py RUN...: per run and backend: measure phases (count, sum, median) and, for routes timed for
exactly 3 paired blocks, the median measure phase; from timeline.jsonl and trials.sqlite."""
import gzip
import json
import shutil
import sqlite3
import statistics
import sys
from pathlib import Path

for run in sys.argv[1:]:
    parts = []
    for be in ("onnxruntime", "openvino"):
        d = Path(run) / be
        tl = d / "timeline.jsonl"
        tl = tl if tl.exists() else d / "artifacts" / "timeline.jsonl"
        rows = [json.loads(line) for line in open(tl)]
        db = d / "trials.sqlite"
        if not db.exists():
            with gzip.open(str(db) + ".gz") as f, open("/tmp/_t.sqlite", "wb") as g:
                shutil.copyfileobj(f, g)
            db = Path("/tmp/_t.sqlite")
        c = sqlite3.connect(db)
        pairs = {r: json.loads(p).get("pairs") if p else None
                 for r, p in c.execute("select route, paired from trials")}
        meas = [(r["route"], r["end"] - r["start"]) for r in rows if r["phase"] == "measure"]
        builds = sum(r["end"] - r["start"] for r in rows if r["phase"] == "build")
        three = [d_ for r, d_ in meas if pairs.get(r) == 3]
        span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        parts.append(f"{be}: search span {span:.0f} s, {len(meas)} measured, measure sum "
                     f"{sum(d_ for _, d_ in meas):.1f} s (median {statistics.median(d_ for _, d_ in meas):.2f} s), "
                     f"3-pair median {statistics.median(three) if three else float('nan'):.2f} s (n={len(three)}), builds {builds:.1f} s")
    print(Path(run).name, "|", " | ".join(parts))
