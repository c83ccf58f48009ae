"""Reports of a finished search: ``report.json``, ``report.md`` and ``report.html``.

Everything comes from the output directory: the trial store (``trials.sqlite``) and
``run.json`` (`routetune.run.runinfo`). `build_report` gathers it into one JSON-ready
mapping; `write_reports` writes the three files (the HTML in
`routetune.reporting.report_html`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routetune.errors import StorageError, UsageError, one_line
from routetune.route import parse_route
from routetune.run import runinfo
from routetune.run.outdir import refuse_links
from routetune.search.strategy import ranked
from routetune.store import FILENAME, TrialStore
from routetune.trial import Trial

ERROR_METRIC = "rel_l2"
"""The accuracy error the Pareto chart and the summaries use: ||out - ref|| / ||ref||,
the worst over outputs (lower is better; every trial with outputs has it)."""


def store_dir(path: Path) -> Path:
    """The output directory that holds the store of the records in `path`.

    `path` itself, or for a dated record folder (``OUTDIR/runs/<time>/``,
    `routetune.run.runinfo.record_dir`) the output directory two levels up.
    """
    if not (path / FILENAME).exists() and path.parent.name == "runs":
        return path.parent.parent
    return path


def _judged(trials: list[Trial], accuracy: Any) -> list[Trial]:
    """The trials judged under the run's constraint (``run.json``'s ``accuracy``).

    A trial of this run may have been measured by an earlier run with other bounds and
    the same tolerances, and stored with that run's verdict (`routetune.judging.judge`). An
    expression that no longer parses (a metric's plugin gone) leaves the stored verdicts.
    """
    if not isinstance(accuracy, str) or not trials:
        return trials
    from routetune.errors import RoutetuneError
    from routetune.judging.accuracy import parse_accuracy
    from routetune.judging.judge import judged
    from routetune.plugin_manager import load_registry

    outputs = sorted({name for t in trials for name in t.tolerances})
    try:
        constraint = parse_accuracy(accuracy, load_registry(), outputs)
    except RoutetuneError:
        return trials
    return [judged(t, constraint) for t in trials]


def stored_trials(outdir: Path, records: Path | None = None
                  ) -> tuple[dict[str, Any], list[Trial], str | None]:
    """The trials of the run recorded in `records`, judged under its constraint.

    Args:
        outdir: The output directory (the trial store's folder).
        records: The folder of the run's ``run.json``; default `outdir`.

    Returns:
        ``run.json``, the run's trials (its model, backend and settings), and the
        winner's route (None when the run did not finish).

    Raises:
        UsageError: `outdir` holds no trial store, or ``run.json`` is of the wrong shape.
    """
    path = outdir / FILENAME
    if not path.exists():
        raise UsageError(f"{outdir}: no {FILENAME} here; give the output directory of a "
                         "`routetune tune` run")
    run = runinfo.read(records or outdir)
    store = TrialStore.open(path)
    try:
        trials = store.trials()
    finally:
        store.close()
    try:
        if run.get("settings_hash"):
            trials = [t for t in trials if t.settings_hash == run["settings_hash"]
                      and t.model_sha256 == run["model"]["sha256"]
                      and t.backend == run["backend"]["name"]]
        route = dict(run.get("result", {})).get("winner")
    except UNREADABLE as e:
        raise unreadable_record(records or outdir, e) from e
    return run, _judged(trials, run.get("accuracy")), route


def build_report(outdir: Path, records: Path | None = None) -> dict[str, Any]:
    """Gather a report of the search stored in `outdir`.

    Args:
        outdir: The output directory (the trial store's folder).
        records: The folder of the run's ``run.json``; default `outdir`.

    Returns:
        ``run`` (``run.json``), ``trials`` (one row per trial of this run: route,
        status, reason, latency in ms, speed-up, error; the winner first, then the
        accurate routes by speed, then the rest: `routetune.search.strategy.ranked`,
        the order every report shows), ``seasonings`` (`seasoning_effects`) and
        ``winner``.

    Raises:
        UsageError: `outdir` holds no trial store.
    """
    run, trials, route = stored_trials(outdir, records)
    result = {k: v for k, v in dict(run.get("result", {})).items() if k != "winner"}
    winner = next((t for t in trials if t.route == route), None)
    try:
        rows = [trial_row(t) for t in ranked(trials, winner)]
        effects = seasoning_effects(trials)
    except (UsageError, ArithmeticError) as e:  # a stored route that does not parse
        raise StorageError(f"{outdir / FILENAME}: a stored trial cannot be reported "
                           f"({one_line(e)}); move the file away, or run `routetune tune "
                           "--fresh`") from e
    return {"run": run, "trials": rows, "seasonings": effects,
            "winner": {**rows[0], **result} if winner else None}


UNREADABLE = (KeyError, IndexError, TypeError, AttributeError, ValueError, ArithmeticError,
              RecursionError)
"""What reading a run record of the wrong shape raises: a field missing, or of another
type (``"result": []``, ``"min_speedup": "high"``), nested too deeply to render."""


def unreadable_record(folder: Path, error: BaseException) -> UsageError:
    """The one-line error for a ``run.json`` in `folder` that the report cannot use."""
    what = f"no field {error}" if isinstance(error, KeyError) else one_line(error, 200)
    return UsageError(f"{folder / runinfo.FILENAME}: not a run record this routetune can "
                      f"read ({what}); delete it, or run `routetune tune` again")


def trial_row(trial: Trial) -> dict[str, Any]:
    """One trial as a flat row: latencies in ms, speed-up, the worst error per metric."""
    lat = trial.latency
    worst = {}
    for name in ("rel_l2", "cos", "linf", "l0"):
        values = [m[name] for m in trial.accuracy.values() if name in m]
        if values:
            worst[name] = min(values) if name == "cos" else max(values)
    return {
        "route": trial.route, "status": trial.status, "reason": trial.reason,
        "p50_ms": lat.p50 if lat else None, "p90_ms": lat.p90 if lat else None,
        "ci_ms": [lat.ci_low, lat.ci_high] if lat else None,
        "base_p50_ms": trial.base_latency.p50 if trial.base_latency else None,
        "relative_p50": trial.relative.p50 if lat and trial.base_latency else None,
        "speedup": trial.speedup,
        "speedup_ci": [trial.paired.ci_low, trial.paired.ci_high] if trial.paired else None,
        "noisy": trial.noisy, "waited_s": trial.conditions.get("waited_s"),
        "foreign_cores": trial.conditions.get("foreign_cores"),
        "build_ms": trial.build_ms,
        "engine_bytes": trial.engine_bytes, "error": worst,
        "steps": [s.name for s in parse_route(trial.route)],
    }


def seasoning_effects(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """How each seasoning moved latency and error, against the same routes without it.

    For every measured trial whose route holds seasoning s, the trial of the same route
    with s's step removed is its partner, when it was measured too; such a pair is kept.

    Returns:
        One mapping per seasoning, by name:

        - ``pairs``: the pairs kept;
        - ``latency_ratio``: the mean over the pairs of the ratio of their p50s, each
          relative to the base route timed alongside (a ratio; < 1 is faster);
          ``latency_ratio_range``: its smallest and largest ratio ``[min, max]``;
        - ``error_pairs``: the pairs whose two trials both have `ERROR_METRIC`;
          ``error_change``: the mean change of `ERROR_METRIC` (with minus without;
          None without such pairs); ``error_change_range``: ``[min, max]`` or None.

        The spread is the range (min to max) over the pairs, not an interval of the
        mean: the pairs are few (one per route without s), often fewer than five.
    """
    measured = {t.route: t for t in trials if t.latency and t.base_latency}
    effects: dict[str, dict[str, list[float]]] = {}
    for t in measured.values():
        route = parse_route(t.route)
        for i, step in enumerate(route.steps):
            rest = str(type(route)(route.steps[:i] + route.steps[i + 1:]))
            partner = measured.get(rest)
            if partner is None:
                continue
            acc = effects.setdefault(step.name, {"ratio": [], "error": []})
            acc["ratio"].append(t.relative.p50 / partner.relative.p50)
            err, err0 = worst_error(t), worst_error(partner)
            if err is not None and err0 is not None:
                acc["error"].append(err - err0)
    return [{"seasoning": name, "pairs": len(v["ratio"]),
             "latency_ratio": _mean(v["ratio"]), "latency_ratio_range": _range(v["ratio"]),
             "error_pairs": len(v["error"]), "error_change": _mean(v["error"]),
             "error_change_range": _range(v["error"])}
            for name, v in sorted(effects.items())]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def worst_error(trial: Trial) -> float | None:
    """`ERROR_METRIC` of the trial's worst output; None when it was not measured."""
    values = [m[ERROR_METRIC] for m in trial.accuracy.values() if ERROR_METRIC in m]
    return max(values) if values else None


def write_reports(outdir: Path, dest: Path | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``report.html`` of the run in `outdir`.

    Args:
        outdir: The run's output directory, or a dated record folder in it
            (``OUTDIR/runs/<time>/``, whose ``run.json`` is read).
        dest: Where to write them; default `outdir`.

    Returns:
        The paths, by format.

    Raises:
        UsageError: `outdir` holds no trial store.
    """
    from routetune.reporting.report_html import render_html

    refuse_links(outdir, label="")  # report writes report.* and SQLite's -wal/-shm files there
    data = build_report(store_dir(outdir), outdir)
    try:  # every report rendered before any is written
        texts = {"md": render_markdown(data), "html": render_html(data),
                 "json": json.dumps(data, indent=1, default=str) + "\n"}
    except UNREADABLE as e:  # the trials are checked as they are read (routetune.store)
        raise unreadable_record(outdir, e) from e
    dest = dest or outdir
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{dest}: cannot create the folder for the reports ({e.strerror})"
                         ) from e
    if not os.access(dest, os.W_OK):
        raise UsageError(f"{dest}: a read-only folder; the reports (report.json, report.md, "
                         f"report.html) are written there: make it writable (chmod u+w "
                         f"{dest}), or copy the folder and report the copy")
    paths = {"json": dest / "report.json", "md": dest / "report.md",
             "html": dest / "report.html"}
    for kind, path in paths.items():
        runinfo.replace_text(path, texts[kind])  # a planted link is replaced, not followed
    return paths


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: environment, settings, winner, seasonings, trials."""
    run, lines = data["run"], []
    lines.append(f"# routetune report: {Path(run.get('model', {}).get('source', '?')).name}\n")
    lines += [f"- {k}: {v}" for k, v in environment(run).items()]
    winner = data.get("winner")
    if winner:
        lines.append(f"\n## Winner: `{winner['route']}`\n\n{winner_text(winner)}\n")
    lines.append("\n## Seasonings: effect against the same routes without them\n")
    lines.append(f"{EFFECTS_CAPTION}\n")
    lines.append("| seasoning | pairs | latency ratio: mean | min–max | rel-L2 change: mean | "
                 "min–max | pairs with rel-L2 |\n|---|---|---|---|---|---|---|")
    for s in data["seasonings"]:
        lines.append(f"| `{s['seasoning']}` | {s['pairs']} | {s['latency_ratio']:.3f} | "
                     f"{span_text(s.get('latency_ratio_range'), '.3f')} | "
                     f"{_num(s['error_change'], '+.3g')} | "
                     f"{span_text(s.get('error_change_range'), '+.3g')} | "
                     f"{s.get('error_pairs', '')} |")
    lines.append("\n## Trials\n")
    lines.append("Speed-up: search-time, paired blocks with the base route (median "
                 "[95% interval]); *noisy*: timed while the machine was busy.\n")
    lines.append("| route | status | p50 ms | base p50 ms (alongside) | speed-up | rel-L2 | "
                 "reason |\n|---|---|---|---|---|---|---|")
    for r in data["trials"]:
        reason = r["reason"].replace("|", "\\|")
        mark = " (winner)" if winner and r["route"] == winner["route"] else ""
        lines.append(f"| `{r['route']}`{mark} | {r['status']} | {_num(r['p50_ms'], '.3f')} | "
                     f"{_num(r['base_p50_ms'], '.3f')} | {speedup_text(r)} | "
                     f"{_num(r['error'].get('rel_l2'), '.3g')} | {reason} |")
    return "\n".join(lines) + "\n"


def environment(run: dict[str, Any]) -> dict[str, str]:
    """The environment and settings as label → text, for the Markdown and HTML reports."""
    if not run:
        return {"run": "no run.json (a store written by an older routetune)"}
    backend, model, search = run["backend"], run["model"], run["search"]
    versions = ", ".join(f"{k} {v}" for k, v in backend["versions"].items())
    n = len(run["space"]["seasonings"])
    options = search.get("options", {"beam_width": search.get("beam_width")}
                         if search["strategy"] == "beam" else {})  # older run.json
    strategy = search["strategy"] + (" (" + ", ".join(f"{k} {v}" for k, v in options.items())
                                     + ")" if options else "")
    given = run.get("given", {})
    shapes = given.get("shapes", "?")
    inputs = (given["inputs"] if "inputs" in given else
              f"the {given['example']} example's own input sets at {shapes}"
              if "example" in given else f"synthesised (seeded, uniform in [0, 1)) at {shapes}")
    return {
        "model": f"{model['source']} (sha256 {model['sha256']})",
        "backend": f"{backend['name']} {backend['version']} on {backend['device']}",
        "versions": versions,
        "CPU": f"{run['machine']['cpu']}; flags {' '.join(run['machine']['cpu_flags'])}",
        "accuracy constraint": run["accuracy"],
        "optimisation profile": run["profile"] or "none",
        "validation inputs": inputs,
        "base pipeline": ", ".join(run.get("base_pipeline", [])) or "none",
        "backend options": ", ".join(f"{k}={v}" for k, v in
                                     backend.get("options", {}).items()) or "defaults",
        "pinned routes": ", ".join(run.get("pinned", [])) or "none",
        "route space": f"{run['space']['size']} route{'s' * (run['space']['size'] != 1)} "
                       f"from {n} seasoning{'s' * (n != 1)} (max depth "
                       f"{run['space']['max_depth']}): "
                       + (", ".join(run["space"]["seasonings"]) or "none"),
        "search": f"{strategy}; max trials {search['max_trials'] or 'none'}, time budget "
                  + (f"{search['time_budget_s']} s" if search["time_budget_s"] else "none"),
        "measurement": f"at least {run['measure']['min_runs']} runs, "
                       f"{run['measure']['min_time_s']} s and "
                       f"{run['measure'].get('min_blocks', 1)} blocks per candidate, timed "
                       "in paired blocks with the base route",
        "verdict": _verdict_rule(run),
        "machine conditions": conditions_text(run),
        "started": f"{run['started_at']}, finished {run.get('finished_at', '?')}",
    }


def winner_text(winner: dict[str, Any]) -> str:
    """The winner in a few sentences: why, the confirmed and the search-time figures."""
    reason = winner["reason"][:1].upper() + winner["reason"][1:]
    parts = [f"{reason}."]
    confirmed, search = winner.get("confirmed"), winner.get("search")
    if confirmed:
        lo, hi = confirmed["speedup_ci"]
        parts.append(
            f"Confirmed (fresh process, paired blocks; median and 95% interval over "
            f"{confirmed['pairs']} block pairs): {confirmed['speedup']:.2f}x [{lo:.2f}, "
            f"{hi:.2f}]; p50 {confirmed['p50_ms']:.3f} ms against the base route's "
            f"{confirmed['base_p50_ms']:.3f} ms.")
    if search and winner["route"] != "base" and search.get("speedup"):
        ci = search.get("speedup_ci")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        parts.append(f"In the search: {search['speedup']:.2f}x{interval}; p50 "
                     f"{search['p50_ms']:.3f} ms.")
    for c in winner.get("confirmations", []):
        if c["route"] != winner["route"]:
            p = c["paired"]
            parts.append(f"Not confirmed: {c['route']} {p['value']:.2f}x [{p['ci_low']:.2f}, "
                         f"{p['ci_high']:.2f}] (search "
                         f"{_num(c.get('search_speedup'), '.2f', 'x')}).")
    return " ".join(parts)


def speedup_text(row: dict[str, Any]) -> str:
    """A row's search-time speed-up with its interval, and the noisy mark."""
    if row["speedup"] is None:
        return ""
    text = f"{row['speedup']:.2f}x"
    if row.get("speedup_ci"):
        text += f" [{row['speedup_ci'][0]:.2f}, {row['speedup_ci'][1]:.2f}]"
    return text + (" *noisy*" if row.get("noisy") else "")


EFFECTS_CAPTION = ("Each seasoning against the same routes without it (pairs of trials, "
                   "both measured): the mean over the pairs and the range (min–max) over "
                   "them. Latency ratio: p50 with the seasoning over p50 without, each "
                   "relative to the base route timed alongside (< 1 is faster); rel-L2 "
                   "change: with minus without.")
"""The seasoning table's caption, in the Markdown and the HTML report."""


def span_text(span: Sequence[float] | None, spec: str) -> str:
    """A ``[min, max]`` pair as ``min – max``; empty for None."""
    return "" if not span else f"{span[0]:{spec}} – {span[1]:{spec}}"


def _verdict_rule(run: dict[str, Any]) -> str:
    verdict = run.get("verdict")
    if not verdict:
        return "not recorded (an older run)"
    return (f"a route wins when the lower end of its confirmed speed-up's 95% interval is "
            f"above {verdict['min_speedup']:g}x; --busy-machine {verdict['busy_machine']}")


def conditions_text(run: dict[str, Any]) -> str:
    """The machine's conditions during the run, in one line."""
    c = run.get("conditions")
    if not c:
        start = run.get("conditions_at_start", {})
        return f"load average at start {start.get('loadavg', '?')}" if start else "not recorded"
    text = (f"{c['noisy']} of {c['measured']} measured trials noisy (timed while other "
            f"processes loaded the machine)")
    if c["noisy_routes"]:
        text += ": " + ", ".join(c["noisy_routes"][:5]) + ("…" if c["noisy"] > 5 else "")
    text += f"; waited {c['waited_s']} s for a quiet machine"
    if c.get("foreign_cores_max") is not None:
        text += (f"; other processes' CPU use at most {c['foreign_cores_max']:.2f} cores, "
                 f"steal at most {c['steal_pct_max']:.1f}%")
    start = run.get("conditions_at_start", {}).get("loadavg")
    end = c.get("at_end", {}).get("loadavg")
    if start and end:
        text += f"; load average {start[0]:.2f} at start, {end[0]:.2f} at end"
    return text


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"

