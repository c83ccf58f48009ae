"""The leave-one-family-out replay with variants of the route memory's prior.

    python benchmarks/replay_search.py --tables benchmarks/tables --out OUT
    REPLAY_JSON=OUT/replay_memory.json python variants.py > variants.txt
    python variants.py --trace mobilenetv3 efficientnet resnet50 convnext > trace.txt

Each variant replaces `routetune.records.prior.prior_of` with the same estimate under
other weights (see `variant`), replays the learned search on every GPU table and prints
its builds to the best and the budgets where it is behind TPE's or random's mean (from
the replay's JSON: those strategies do not read the prior).
"""
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))

import replay_search as rs  # noqa: E402

import routetune.records.prior as prior_module  # noqa: E402
from routetune.search.learned import Learned  # noqa: E402

TABLES = [json.loads(p.read_text()) for p in sorted((ROOT / "benchmarks" / "tables").glob("*.json"))]
PRIOR_OF = prior_module.prior_of


def variant(fail_half: bool = True, speed_half: bool = True, power: float = 2.0,
            pseudo: float = 1.0, fail_pseudo: float = 1.0, norm: bool = False) -> Any:
    """`prior_of` with: another device's lessons halved for speed and/or failure,
    similarity to the power `power`, pseudo-model weights, weights scaled so the
    most similar model weighs 1 (`norm`)."""
    def prior_of(lessons: Any, signature: Any, device: str, skipped: int = 0) -> Any:
        per_model: dict = defaultdict(lambda: defaultdict(list))
        speed_w: dict = {}
        fail_w: dict = {}
        count = 0
        for lesson in lessons:
            key = (lesson.signature.key, lesson.device)
            if key not in speed_w:
                sim = lesson.signature.similarity(signature) ** power
                other = lesson.device != device
                speed_w[key] = sim * (0.5 if other and speed_half else 1.0)
                fail_w[key] = sim * (0.5 if other and fail_half else 1.0)
            if speed_w[key] > 0:
                count += 1
                per_model[key][lesson.step].append(lesson)
        if norm and speed_w:
            top, ftop = max(speed_w.values()), max(fail_w.values())
            speed_w = {k: v / top for k, v in speed_w.items()}
            fail_w = {k: v / ftop for k, v in fail_w.items()}
        steps = {}
        for step in {s for by_step in per_model.values() for s in by_step}:
            means, spreads, fails, ws, fws = [], [], [], [], []
            for key, by_step in per_model.items():
                found = by_step.get(step)
                if not found:
                    continue
                mean, spread, failed = prior_module.model_summary(found)
                means.append(mean)
                spreads.append(spread)
                fails.append(failed)
                ws.append(speed_w[key])
                fws.append(fail_w[key])
            total = sum(ws)
            mean = sum(w * m for w, m in zip(ws, means, strict=True)) / (total + pseudo)
            var = (pseudo * prior_module.PRIOR_SD ** 2 + sum(
                w * ((m - mean) ** 2 + s) for w, m, s in zip(ws, means, spreads, strict=True))) / (total + pseudo)
            fail = (0.1 * fail_pseudo + sum(w * f for w, f in zip(fws, fails, strict=True))) / (sum(fws) + fail_pseudo)
            steps[step] = prior_module.StepPrior(mean, max(math.sqrt(var), 0.02), total, fail)
        return prior_module.Prior(steps, count, len(per_model), skipped, 0)
    return prior_of


def evaluate(tag: str, baselines: dict) -> None:
    out = []
    for table in TABLES:
        if table["backend"] != "onnxruntime-cuda":
            continue
        others = [t for t in TABLES if t["backend"] == table["backend"]
                  and t["family"] != table["family"]]
        learned = Learned(rs.table_space(table))
        learned.learn(rs.prior_from(others, table))
        found, reached = rs.curve(learned, table)
        key = f"{table['family']} ({table['backend']})"
        tpe, rnd = baselines[key]["tpe"], baselines[key]["random"]
        behind = [i + 1 for i in range(30)
                  if found[i] < max(tpe["curve"][i], rnd["curve"][i]) - 1e-9]
        beyond = [i + 1 for i in range(30) if found[i] < max(
            tpe["curve"][i] - 2 * tpe["standard_error"][i],
            rnd["curve"][i] - 2 * rnd["standard_error"][i]) - 1e-9]
        out.append(f"{table['family']}: best@{reached} behind {behind} beyond2se {beyond}")
    print(tag, "|", " | ".join(out), flush=True)


def trace(family: str) -> None:
    table = next(t for t in TABLES if t["family"] == family)
    others = [t for t in TABLES if t["backend"] == table["backend"] and t["family"] != family]
    prior = rs.prior_from(others, table)
    print(family, prior.describe())
    for text, p in sorted(prior.steps.items()):
        print(f"   {text:38s} mean {p.mean:+.3f} sd {p.sd:.3f} weight {p.weight:.2f} "
              f"fail {p.fail:.2f}")
    learned = Learned(rs.table_space(table))
    learned.learn(prior)
    ask, asks = learned.ask, [0]

    def traced() -> list:
        batch = ask()
        asks[0] += 1
        for route in batch:
            row = table["trials"].get(str(route), {})
            speedup = row.get("speedup")
            print(f"   ask {asks[0]:2d} {str(route):62s} {row.get('status')} "
                  f"{speedup and round(speedup, 3)}")
        return batch

    learned.ask = traced  # type: ignore[method-assign]
    print("   builds to the best:", rs.curve(learned, table)[1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--trace"]:
        for name in sys.argv[2:]:
            trace(name)
        sys.exit(0)
    baselines = json.loads(Path(os.environ.get("REPLAY_JSON", "replay_memory.json")).read_text())
    for kw in [{}, {"fail_half": False}, {"fail_half": False, "fail_pseudo": 0.5},
               {"fail_half": False, "fail_pseudo": 0.25}, {"fail_half": False, "power": 4},
               {"speed_half": False, "fail_half": False}, {"power": 4}, {"norm": True},
               {"norm": True, "fail_half": False}, {"pseudo": 0.5},
               {"norm": True, "pseudo": 0.5}]:
        prior_module.prior_of = variant(**kw)
        evaluate(str(kw) if kw else "landed (no change)", baselines)
    prior_module.prior_of = PRIOR_OF
