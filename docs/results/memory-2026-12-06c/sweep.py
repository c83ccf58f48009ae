import json, sys, itertools
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import replay_search as rs
import routetune.search.learned as L
folder = Path("/work/main/benchmarks/tables")
tables = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if "cuda" in json.loads(p.read_text())["backend"]]
priors = {}
for t in tables:
    others = [o for o in tables if o["family"] != t["family"]]
    priors[t["family"]] = rs.prior_from(others, t)
believe = sys.argv[1] == "1"
if not believe:
    orig = L.Learned._acquisition
    L.Learned._acquisition = lambda self, believed: orig(self, [])
for resc, brok in itertools.product([0.02, 0.05, 0.1, 0.2, 0.3], [0.02, 0.05, 0.1, 0.2]):
    L.RESCUED, L.BROKEN_TOGETHER = resc, brok
    out = []
    for t in tables:
        s = L.Learned(rs.table_space(t)); s.learn(priors[t["family"]])
        curve, reached = rs.curve(s, t)
        out.append(f"{t['family'][:6]} {reached}")
    print(f"believe={believe} rescued={resc} broken={brok}: " + "  ".join(out))
