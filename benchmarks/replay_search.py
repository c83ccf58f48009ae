"""Replay a search strategy on an exhaustive run's stored trials, building nothing.

Usage (any machine; no GPU, no model):

    python benchmarks/replay_search.py --trials DIR/trials.sqlite
        --seasonings a,b,c [--max-depth 4] [--strategies beam,mixed] [--beam-width 3]
    python benchmarks/replay_search.py --tables benchmarks/tables [--out DIR]
    python benchmarks/replay_search.py --trials DIR/trials.sqlite --export-table T.json
        --family NAME (--model M.onnx | --signature S.json) [--source TEXT]

``--tables``: every stored exhaustive table (`benchmarks/tables/`, JSON: each route's
status, paired speed-up with its 95% interval, and whether it was built) is replayed
with the learned search, its prior learned only from the other families' tables of
the same backend (leave one family out), against mixed, TPE (Optuna, 5 seeds) and
random order (20 seeds). It prints the builds each needs to reach exhaustive's best
route (within its interval), and writes the best speed-up found at every budget from
1 to 30 builds (``replay_memory.json``, ``replay_memory.png``).

`benchmarks/search_efficiency.py` runs every strategy on the device, which costs device
time; when a strategy's own run is cut short (or lost), its choices can still be
scored on exhaustive's table. The strategy (the registered class, with its options) asks
for routes as in a real search, and is told, for each route, the trial that exhaustive
stored for it: the same measurement, so one run's conditions, not a second run's noise.
A seasoning that the run found not applicable (stored as skipped on its own) is left
out of the space, as the run left it out.

A route that exhaustive recorded as "same model and settings as route X" (equal
engines are measured once, issue 16) is counted as built when the replay has not yet
asked for X, since a live search would have built it then; it is told X's trial.
What the replay does not model: the loop's refinements after the strategy stops, and
the time budget. It prints, per strategy, the routes asked for, the engines built (the
base route's included, as `benchmarks/gpu.py`'s `builds` counts them), the winner, and
the winner's speed-up over exhaustive's best, as exhaustive measured both.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SAME = re.compile(r"same model and settings as route '([^']+)'")
ENGINE = re.compile(r"same engine as (?:route '([^']+)'|the base route)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=Path,
                        help="an exhaustive run's trials.sqlite (its -wal beside it, if any)")
    parser.add_argument("--seasonings", help="with --trials: the space's seasonings")
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--strategies", default="beam,mixed")
    parser.add_argument("--beam-width", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--export-table", type=Path,
                        help="with --trials: write it as a table (JSON) for --tables")
    parser.add_argument("--family", help="with --export-table: the model family's name")
    parser.add_argument("--model", type=Path, help="with --export-table: the ONNX file")
    parser.add_argument("--signature", type=Path,
                        help="with --export-table: the model's signature (JSON) instead")
    parser.add_argument("--source", default="", help="with --export-table: where it came from")
    parser.add_argument("--tables", type=Path,
                        help=f"replay every table here, leaving one family out (e.g. {TABLES})")
    parser.add_argument("--out", type=Path, help="with --tables: write JSON and a plot here")
    parser.add_argument("--write-memory", type=Path,
                        help="with --tables: write the lessons of the tables (those of "
                             "--families only, if given) to this route memory file, and exit")
    parser.add_argument("--families", help="with --write-memory: the families to learn from")
    parser.add_argument("--efficiency", type=Path,
                        help="with --export-table, instead of --trials: a "
                             "search_efficiency.json whose exhaustive row lists its trials")
    parser.add_argument("--like", type=Path,
                        help="with --efficiency: a table of the same machine (its backend, "
                             "version and device are taken)")
    parser.add_argument("--sweep-failure-model", action="store_true",
                        help="with --tables: the learned search's builds to each GPU "
                             "table's best over a grid of its failure model's constants")
    parser.add_argument("--tpe-seeds", type=int, default=5)
    parser.add_argument("--random-seeds", type=int, default=20)
    args = parser.parse_args()
    if args.tables is not None and args.write_memory is not None:
        write_memory(args.tables, args.write_memory, args.families)
        return
    if args.tables is not None and args.sweep_failure_model:
        sweep_failure_model(args.tables)
        return
    if args.tables is not None:
        leave_one_out(args.tables, args.out, args.tpe_seeds, args.random_seeds)
        return
    if args.efficiency is not None:
        if not (args.export_table and args.family and args.signature and args.like):
            sys.exit("--efficiency needs --export-table, --family, --signature and --like")
        table_from_efficiency(args.efficiency, args.family, args.signature, args.like,
                              args.export_table, args.source)
        return
    if args.trials is None:
        sys.exit("give --trials (one table) or --tables DIR (leave one family out)")
    if args.export_table is not None:
        if not args.family or (args.model is None and args.signature is None):
            sys.exit("--export-table needs --family and --model (or --signature)")
        export_table(args.trials, args.family, args.model, args.export_table, args.signature,
                     args.source)
        return
    if not args.seasonings:
        sys.exit("--trials needs --seasonings (the space's)")
    from routetune.plugin_manager import load_registry
    from routetune.routes.composer import RouteSpace

    if not args.trials.is_file():
        sys.exit(f"--trials {args.trials}: no such file; give an exhaustive run's trials.sqlite")
    registry = load_registry()
    table = load(args.trials)
    # A seasoning the run found not applicable to the model (its one-step route stored
    # as skipped, not as an equal engine) was left out of that run's space.
    names = [n for n in args.seasonings.split(",") if n not in table or table[n].status != "skipped"
             or SAME.match(table[n].reason or "")]
    space = RouteSpace([registry.seasoning(n).info for n in names], args.max_depth)
    missing = [str(r) for r in space.routes() if str(r) not in table]
    if missing:
        sys.exit(f"--trials: {len(missing)} routes of the space have no stored trial "
                 f"(first: {missing[0]}); finish the exhaustive run with --resume")
    accurate = {r: t.speedup for r, t in table.items() if t.status == "ok" and t.speedup}
    best = max(accurate, key=accurate.__getitem__)
    exhaustive_builds = sum(built(t) for t in table.values())
    rows: dict[str, Any] = {"exhaustive": {"asked": space.size() - 1, "builds": exhaustive_builds,
                                           "winner": best, "speedup": accurate[best]}}
    for name in args.strategies.split(","):
        cls = registry.strategy(name)
        options = cls.Options(beam_width=args.beam_width) if name == "beam" else None
        rows[name] = replay(cls(space, options), table)
    for name, row in rows.items():
        row["builds_fraction"] = round(row["builds"] / exhaustive_builds, 3)
        row["fraction_of_best"] = round(accurate.get(row["winner"], 1.0) / accurate[best], 3)
        print(f"{name:10s} asked {row['asked']:3d}  built {row['builds']:3d} "
              f"({row['builds_fraction']:.0%} of exhaustive's {exhaustive_builds})  "
              f"winner {row['winner']} {row['speedup']:.2f}x "
              f"({row['fraction_of_best']:.1%} of the best)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def load(path: Path) -> dict[str, Any]:
    """The stored trials of `path` (a trials.sqlite), by route text."""
    from routetune.records.store import TrialStore

    with tempfile.TemporaryDirectory() as tmp:  # SQLite writes beside the file it reads
        copy = Path(tmp) / "trials.sqlite"
        shutil.copy(path, copy)
        store = TrialStore.open(copy)
        table = {t.route: t for t in store.trials()}
        store.close()
    return table


def built(trial: Any) -> bool:
    """Whether the trial built an engine (as `benchmarks/gpu.py`'s `builds` counts)."""
    return trial.build_ms is not None and trial.status not in ("skipped", "not-applicable")


def replay(strategy: Any, table: dict[str, Any]) -> dict[str, Any]:
    """Run `strategy`'s ask/tell on stored trials: routes asked, engines built, winner."""
    from routetune.judging.ranking import rank_key
    from routetune.routes.route import Route
    from routetune.search.strategy import Result

    strategy.tell(Route(), Result.of(table["base"]))
    asked, builds, told = 0, 1, {"base": table["base"]}
    while batch := strategy.ask():
        for route in batch:
            trial = table[str(route)]
            same = SAME.match(trial.reason or "")
            if same and same.group(1) not in told:  # a live search builds it here
                trial = table[same.group(1)]
            asked += 1
            builds += built(trial)
            told[str(route)] = trial
            strategy.tell(route, Result.of(trial))
    ok = [t for t in told.values() if t.status == "ok"]
    winner = min(ok, key=rank_key)
    return {"asked": asked, "builds": builds, "winner": winner.route,
            "speedup": winner.speedup or 1.0}


# --- Leave one family out: the route memory's search against TPE, random and mixed ---------

TABLES = Path(__file__).parent / "tables"
BUDGETS = range(1, 31)


def export_table(trials: Path, family: str, model: Path | None, out: Path,
                 signature: Path | None = None, source: str = "") -> None:
    """Write an exhaustive run's trials.sqlite as a table the replay reads (JSON).

    The model's signature comes from the ONNX file and the inputs the run fed (its
    ``inputs`` folder or example), or from a JSON file ``--signature`` wrote elsewhere.
    """
    from routetune.model.signature import ModelSignature

    table = load(trials)
    base = table["base"]
    if signature is not None:
        sig = json.loads(signature.read_text())
    else:
        import onnx

        run = json.loads((trials.parent / "run.json").read_text())
        feeds = _feeds_of(run)
        sig = ModelSignature.of(onnx.load(str(model)), feeds).to_json()
    rows = {}
    for route, t in table.items():
        same = SAME.match(t.reason or "") or ENGINE.match(t.reason or "")
        paired = t.paired
        rows[route] = {"status": str(t.status), "speedup": t.speedup,
                       "ci": [paired.ci_low, paired.ci_high] if paired else None,
                       "built": built(t),
                       "same_as": (same.group(1) or "base") if same else None}
    out.write_text(json.dumps({
        "family": family, "backend": base.backend, "device": base.device,
        "backend_version": base.versions.get(base.backend, base.versions.get("onnxruntime", "")),
        "signature": sig, "source": source, "trials": rows}, indent=1) + "\n")


def table_from_efficiency(path: Path, family: str, signature: Path, like: Path, out: Path,
                          source: str) -> None:
    """A table from `benchmarks/search_efficiency.py`'s exhaustive row (its trials by route).

    Such a row has no build record: every route not skipped counts as built, as its
    ``builds`` (the routes of its space) says.
    """
    row = json.loads(path.read_text())[family]["exhaustive"]
    other = json.loads(like.read_text())
    rows = {route: {"status": t["status"], "speedup": t["speedup"], "ci": t["ci"],
                    "built": t["status"] not in ("skipped", "not-applicable"), "same_as": None}
            for route, t in row["trials"].items()}
    out.write_text(json.dumps({
        "family": family, "backend": other["backend"], "device": other["device"],
        "backend_version": other["backend_version"],
        "signature": json.loads(signature.read_text()), "source": source,
        "trials": rows}, indent=1) + "\n")


def write_memory(folder: Path, path: Path, families: str | None) -> None:
    """A route memory file holding what the tables of `families` teach."""
    from routetune.model.signature import ModelSignature
    from routetune.records.lessons import lessons_of
    from routetune.records.memory import RouteMemory

    memory = RouteMemory.open(path)
    for file in sorted(folder.glob("*.json")):
        table = json.loads(file.read_text())
        if families and table["family"] not in families.split(","):
            continue
        lessons = lessons_of(list(table_trials(table).values()),
                             ModelSignature.from_json(table["signature"]),
                             table["backend_version"], lambda t: None)
        print(f"{table['family']}: {memory.add(lessons)} lessons")
    memory.close()


def _feeds_of(run: dict[str, Any]) -> dict[str, Any]:
    """One input set of the run, as its example makes it (shapes and dtypes are what count).

    The example is the one whose model file the run read.
    """
    from routetune.feeds.examples import examples

    source = Path(run["model"]["source"]).name
    example = next(e for e in examples().values() if Path(e.member).name == source)
    return example.make_inputs(example.shapes, 0, 1)[0]


def table_space(table: dict[str, Any]) -> Any:
    """The route space a table covers: its seasonings, each with the values it tried."""
    import dataclasses

    from routetune.plugin_manager import load_registry
    from routetune.routes.composer import RouteSpace
    from routetune.routes.route import parse_route

    registry = load_registry()
    values: dict[str, dict[str, list[Any]]] = {}
    depth = 0
    rows = table["trials"]
    # a seasoning the run found not applicable (its one-step route skipped, not another's
    # engine) was left out of that run's space
    left_out = {r for r, row in rows.items() if "," not in r and "{" not in r
                and row["status"] == "skipped" and not row["same_as"]}
    for route in rows:
        if set(parse_route(route).names) & left_out:
            continue
        steps = parse_route(route)
        depth = max(depth, len(steps))
        for step in steps:
            per = values.setdefault(step.name, {})
            for key, value in step.params:
                per.setdefault(key, []).append(value)
    infos = []
    for name, per in sorted(values.items()):
        info = registry.seasoning(name).info
        params = tuple(dataclasses.replace(p, choices=tuple(dict.fromkeys(
            [p.default, *per.get(p.name, [])]))) for p in info.params)
        infos.append(dataclasses.replace(info, params=params))
    return RouteSpace(infos, depth)


def table_trials(table: dict[str, Any]) -> dict[str, Any]:
    """A table's rows as `Trial` objects (the lessons and the strategies read those)."""
    from routetune.records.trial import Status, Trial
    from routetune.timing.measure import Latency, Speedup

    out = {}
    for route, row in table["trials"].items():
        fields: dict[str, Any] = {}
        if row["speedup"]:
            s = row["speedup"]
            low, high = row["ci"] or [s, s]
            fields = {"latency": Latency(10, 1 / s, 1 / s, 1 / s, 1 / s, 1 / high, 1 / low),
                      "base_latency": Latency(10, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
                      "paired": Speedup(s, low, high, 10, 0.0)}
        status = Status(row["status"])
        out[route] = Trial(route, table["family"], route, table["backend"], table["device"],
                           "", status, "built" if row["built"] else "", **fields)
    return out


def prior_from(tables: list[dict[str, Any]], target: dict[str, Any]) -> Any:
    """The route memory's prior for `target`, learned from `tables` only."""
    from routetune.model.signature import ModelSignature
    from routetune.records.lessons import lessons_of
    from routetune.records.prior import prior_of

    lessons = []
    for table in tables:
        sig = ModelSignature.from_json(table["signature"])
        trials = list(table_trials(table).values())
        lessons += lessons_of(trials, sig, table["backend_version"], lambda t: None)
    return prior_of(lessons, ModelSignature.from_json(target["signature"]), target["device"])


def curve(strategy: Any, table: dict[str, Any]) -> tuple[list[float], int | None]:
    """Best accurate speed-up found within 1..30 builds, and the builds to reach the best.

    The best: exhaustive's fastest accurate route; reached once a route whose speed-up
    is within that route's 95% interval (at or above its lower end) is told. A route
    that exhaustive recorded as another's engine costs a build only if that other was
    not built yet (a live search builds it then), and is told that other's trial.
    """
    from routetune.records.trial import Status
    from routetune.routes.route import Route
    from routetune.search.strategy import Result

    trials = table_trials(table)
    rows = table["trials"]
    ok = {r: row for r, row in rows.items() if row["status"] == "ok" and row["speedup"]}
    best = max(ok, key=lambda r: ok[r]["speedup"])
    bar = (ok[best]["ci"] or [ok[best]["speedup"]])[0]
    strategy.tell(Route(), Result.of(trials["base"]))
    builds, best_so_far = 1, 1.0
    reached = 1 if best_so_far >= bar else None  # the base route is the best one
    history = [(1, 1.0)]  # (builds, best so far) after each route told
    told = {"base"}
    while batch := strategy.ask():
        for route in batch:
            text = str(route)
            if text not in rows:  # another ordering than exhaustive's: not in the table
                strategy.tell(route, Result(route, Status.SKIPPED))
                continue
            same = rows[text]["same_as"]
            if same in rows:
                builds += same not in told
                text_told = same
            else:
                builds += bool(rows[text]["built"])
                text_told = text
            told.update((text, text_told))
            row = rows[text_told]
            if row["status"] == "ok" and row["speedup"]:
                best_so_far = max(best_so_far, row["speedup"])
                if reached is None and row["speedup"] >= bar:
                    reached = builds
            history.append((builds, best_so_far))
            strategy.tell(route, Result.of(trials[text_told]))
        if builds > max(BUDGETS) and reached is not None:
            break
    found = [max(f for b, f in history if b <= budget) for budget in BUDGETS]
    return found, reached


def leave_one_out(folder: Path, out: Path | None, tpe_seeds: int, random_seeds: int) -> None:
    """Each table replayed with priors from the other families on the same backend."""
    import random as rnd

    from routetune.plugins.optuna.tpe import Tpe, TpeOptions
    from routetune.search.learned import Learned
    from routetune.search.mixed import Mixed

    tables = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    results: dict[str, Any] = {}
    for table in tables:
        others = [t for t in tables if t["backend"] == table["backend"]
                  and t["family"] != table["family"]]
        space = table_space(table)
        key = f"{table['family']} ({table['backend']})"
        exhaustive = sum(1 for row in table["trials"].values() if row["built"])
        learned = Learned(space)
        prior = prior_from(others, table)
        learned.learn(prior)
        rows: dict[str, Any] = {"exhaustive_builds": exhaustive, "routes": len(table["trials"]),
                                "prior": prior.describe(),
                                "priors_from": [t["family"] for t in others]}
        rows["learned"] = dict(zip(("curve", "builds_to_best"), curve(learned, table),
                                   strict=True))
        rows["mixed"] = dict(zip(("curve", "builds_to_best"), curve(Mixed(space), table),
                                 strict=True))
        for name, make, seeds in (
                ("tpe", lambda s, sp=space: Tpe(sp, TpeOptions(n_trials=sp.size(), seed=s)),
                 tpe_seeds),
                ("random", lambda s, sp=space: Shuffled(sp, rnd.Random(s)), random_seeds)):
            runs = [curve(make(s), table) for s in range(seeds)]
            reached = [r for _, r in runs]
            rows[name] = {"curve": [sum(c[i] for c, _ in runs) / seeds
                                    for i in range(max(BUDGETS))],
                          "standard_error": [_standard_error([c[i] for c, _ in runs])
                                             for i in range(max(BUDGETS))],
                          "builds_to_best": sorted(r if r is not None else 10**6
                                                   for r in reached)[seeds // 2],
                          "seeds": seeds}
        results[key] = rows
        # behind: below TPE's or random's mean by more than the best route's own
        # measurement noise (its speed-up less the lower end of its interval)
        noise = _noise(table)
        worse = [b for b in BUDGETS if rows["learned"]["curve"][b - 1] < max(
            rows["tpe"]["curve"][b - 1], rows["random"]["curve"][b - 1]) - noise]
        rows["noise"] = noise
        rows["budgets_behind_tpe_or_random"] = worse
        # the same, also allowing for the baselines' own uncertainty: their mean over
        # seeds is an estimate, with a standard error; behind only beyond twice it
        beyond = [b for b in worse if any(
            rows["learned"]["curve"][b - 1] < rows[n]["curve"][b - 1] - noise
            - 2 * rows[n]["standard_error"][b - 1] for n in ("tpe", "random"))]
        rows["budgets_behind_beyond_two_standard_errors"] = beyond
        print(f"{key:32s} exhaustive {exhaustive:3d} builds | builds to its best: "
              + " ".join(f"{n} {_frac(rows[n]['builds_to_best'], exhaustive)}"
                         for n in ("learned", "mixed", "tpe", "random"))
              + f" | learned behind at budgets {worse or 'none'}"
              + f" (beyond 2 standard errors of the baselines' means: {beyond or 'none'})"
              + f" | prior: {prior.describe()}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay_memory.json").write_text(json.dumps(results, indent=1) + "\n")
        plot(results, out / "replay_memory.png")


def sweep_failure_model(folder: Path) -> None:
    """Builds to the best, per GPU table (leave one family out), for each pair of the
    failure model's constants (`routetune.search.learned.RESCUED`, `BROKEN_TOGETHER`)."""
    import itertools

    from routetune.search import learned

    tables = [t for t in (json.loads(p.read_text()) for p in sorted(folder.glob("*.json")))
              if "cuda" in t["backend"]]
    priors = {t["family"]: prior_from([o for o in tables if o["family"] != t["family"]], t)
              for t in tables}
    for rescued, broken in itertools.product([0.02, 0.05, 0.1, 0.2, 0.3], [0.02, 0.05, 0.1, 0.2]):
        learned.RESCUED, learned.BROKEN_TOGETHER = rescued, broken
        reached = []
        for t in tables:
            strategy = learned.Learned(table_space(t))
            strategy.learn(priors[t["family"]])
            reached.append(f"{t['family']} {curve(strategy, t)[1] or 'never'}")
        print(f"RESCUED {rescued} BROKEN_TOGETHER {broken}: " + ", ".join(reached))


def _noise(table: dict[str, Any]) -> float:
    """Exhaustive's best speed-up less the lower end of its 95% interval (x)."""
    ok = [row for row in table["trials"].values() if row["status"] == "ok" and row["speedup"]]
    best = max(ok, key=lambda row: row["speedup"])
    return best["speedup"] - (best["ci"] or [best["speedup"]])[0]


def _standard_error(values: list[float]) -> float:
    """The standard error of the mean of `values` (sample sd / sqrt(n)); 0 for one."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5


def _frac(builds: int | None, exhaustive: int) -> str:
    if builds is None or builds >= 10**6:
        return "never"
    return f"{builds} ({builds / exhaustive:.0%})"


class Shuffled:
    """Random search: the space's routes in a seeded random order, one at a time."""

    def __init__(self, space: Any, rng: Any) -> None:
        self.routes = [r for r in space.routes() if not r.is_base]
        rng.shuffle(self.routes)

    def ask(self) -> list[Any]:
        return [self.routes.pop()] if self.routes else []

    def tell(self, route: Any, result: Any) -> None:
        pass


def plot(results: dict[str, Any], path: Path) -> None:
    """Best speed-up found against builds, one panel per table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), squeeze=False)
    for ax, (key, rows) in zip(axes[0], results.items(), strict=True):
        for name in ("learned", "mixed", "tpe", "random"):
            ax.plot(list(BUDGETS), rows[name]["curve"], label=name)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("engines built")
        ax.set_ylabel("best speed-up found (x, exhaustive's figures)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
