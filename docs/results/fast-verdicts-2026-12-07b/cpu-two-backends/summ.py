# summary-*.txt: python summ.py OUT (after gunzip */*/trials.sqlite.gz)
import json, sqlite3, sys, datetime as dt
from pathlib import Path
def t(s): return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z").timestamp()
root = Path(sys.argv[1])
walls = {}
for line in (root / "walls.txt").read_text().splitlines():
    if line == "ALL": continue
    p = line.split(); walls.setdefault((p[0], p[1]), []).append((float(p[3]), p[-1]))
seen = {}
for run in sorted(root.glob("*-ppocr-*-[0-9]")):
    if not run.is_dir() or run.name.startswith("cache"): continue
    pass
    row = [run.name]
    for b in ("onnxruntime", "openvino"):
        r = json.loads((run / b / "run.json").read_text())
        db = sqlite3.connect(run / b / "trials.sqlite")
        st = dict(db.execute("select status, count(*) from trials group by status").fetchall())
        same = db.execute("select count(*) from trials where reason like 'same engine as route%'").fetchone()[0]
        coarse = db.execute("select count(*) from trials where reason like 'not built: quantizes more coarsely%'").fetchone()[0]
        rep = db.execute("select count(*) from trials where route like '%precision-repair%' and status != 'skipped'").fetchone()[0]
        measured = st.get("ok", 0) + st.get("accuracy-failed", 0)
        row.append(f"{b}: {t(r['finished_at']) - t(r['started_at']):.0f} s, measured {measured}, repair {rep}, same-engine(opts) {same}, coarser {coarse}")
    w = json.loads((run / "backends.json").read_text())["winner"]
    row.append(f"winner {w['backend']}: {w['route']} {w['reason'][:40]}")
    print(" | ".join(row))
print(walls)
