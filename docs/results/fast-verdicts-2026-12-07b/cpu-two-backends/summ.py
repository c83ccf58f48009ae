"""summary-*.txt: python summ.py OUT, after gunzip */*/trials.sqlite.gz.

Per run: each backend's search time (run.json), routes measured, repair trials, routes
recorded as another's engine, coarser quantizations not built; the winner.
"""

import datetime as dt
import json
import sqlite3
import sys
from pathlib import Path

COUNTS = {
    "repair": "route like '%precision-repair%' and status != 'skipped'",
    "same-engine(opts)": "reason like 'same engine as route%'",
    "coarser": "reason like 'not built: quantizes more coarsely%'",
}


def seconds(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()


root = Path(sys.argv[1])
for run in sorted(root.glob("*-ppocr-*-[0-9]")):
    if not run.is_dir() or run.name.startswith("cache"):
        continue
    row = [run.name]
    for backend in ("onnxruntime", "openvino"):
        record = json.loads((run / backend / "run.json").read_text())
        db = sqlite3.connect(run / backend / "trials.sqlite")
        status = dict(db.execute("select status, count(*) from trials group by status"))
        measured = status.get("ok", 0) + status.get("accuracy-failed", 0)
        took = seconds(record["finished_at"]) - seconds(record["started_at"])
        counts = ", ".join(f"{name} {db.execute(f'select count(*) from trials where {w}').fetchone()[0]}"
                           for name, w in COUNTS.items())
        row.append(f"{backend}: {took:.0f} s, measured {measured}, {counts}")
    winner = json.loads((run / "backends.json").read_text())["winner"]
    row.append(f"winner {winner['backend']}: {winner['route']} {winner['reason'][:40]}")
    print(" | ".join(row))
