"""Reports of a finished search: ``report.json``, ``report.md`` and ``report.html``.

Everything comes from the output directory: the trial store (``trials.sqlite``) and
``run.json`` (`routetune.run.runinfo`). `build_report` gathers it into one JSON-ready
mapping; `write_reports` writes the three files (the HTML in
`routetune.reporting.report_html`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routetune.errors import StorageError, UsageError, one_line
from routetune.judging.ranking import ranked
from routetune.records import run_record
from routetune.records.store import FILENAME, TrialStore
from routetune.records.trial import Trial
from routetune.reporting.report_text import worst_of
from routetune.routes.route import parse_route

ERROR_METRIC = "rel_l2"
"""The accuracy error the Pareto chart and the summaries use: ||out - ref|| / ||ref||,
the worst over outputs (lower is better; every trial with outputs has it)."""


def store_dir(path: Path) -> Path:
    """The output directory that holds the store of the records in `path`.

    `path` itself, or for a dated record folder (``OUTDIR/runs/<time>/``,
    `routetune.run.run_record.record_dir`) the output directory two levels up.
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
    run = run_record.read(records or outdir)
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
        accurate routes by speed, then the rest: `routetune.judging.ranking.ranked`,
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
            "winner": winner_record(rows[0], result) if winner else None}


SEARCH_FIGURES = ("p50_ms", "p90_ms", "ci_ms", "base_p50_ms", "relative_p50", "speedup_ci",
                  "other_p50_ms")
"""A trial row's timing figures, which come from the search; the winner record keeps
them under ``search`` only."""


def winner_record(row: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The winner: its trial row without the search's timing figures, and the verdict.

    ``speedup`` is the verdict's figure, from the confirmation (``confirmed``, with its
    own interval and p50s) or 1.0 for the base route; the search's figures stay in
    ``search`` with their own interval, so that no record pairs a figure of one
    measurement with the interval or p50 of another.
    """
    return {**{k: v for k, v in row.items() if k not in SEARCH_FIGURES}, **result,
            "speedup_from": "confirmation" if result.get("confirmed") else (
                "the base route (1.0 by definition)" if row["route"] == "base"
                else "none (not confirmed)")}


UNREADABLE = (KeyError, IndexError, TypeError, AttributeError, ValueError, ArithmeticError,
              RecursionError)
"""What reading a run record of the wrong shape raises: a field missing, or of another
type (``"result": []``, ``"min_speedup": "high"``), nested too deeply to render."""


def unreadable_record(folder: Path, error: BaseException) -> UsageError:
    """The one-line error for a ``run.json`` in `folder` that the report cannot use."""
    what = f"no field {error}" if isinstance(error, KeyError) else one_line(error, 200)
    return UsageError(f"{folder / run_record.FILENAME}: not a run record this routetune can "
                      f"read ({what}); delete it, or run `routetune tune` again")


def trial_row(trial: Trial) -> dict[str, Any]:
    """One trial as a flat row: latencies in ms, speed-up, the worst error per metric.

    ``p50_ms`` is what the search timed (``latency_kind``: device compute or end to
    end); ``other_p50_ms`` the other figure, where the engine has host copies.
    ``error`` holds the worst tensor metrics over the outputs; ``accuracy`` every metric
    measured per output, task metrics (``top1``, ``mask_iou@0.3``) included; ``passes``
    each step's statistics and note (what a fusion fused, what a repair kept).
    """
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
        "relative_p50": relative.p50 if (relative := trial.relative) else None,
        "speedup": trial.speedup,
        "speedup_ci": [trial.paired.ci_low, trial.paired.ci_high] if trial.paired else None,
        "noisy": trial.noisy, "waited_s": trial.conditions.get("waited_s"),
        "foreign_cores": trial.conditions.get("foreign_cores"),
        "build_ms": trial.build_ms, "latency_kind": trial.latency_kind,
        "other_p50_ms": trial.other_latency.p50 if trial.other_latency else None,
        "device_memory_bytes": trial.device_memory_bytes,
        "engine_bytes": trial.engine_bytes, "error": worst,
        "accuracy": {out: dict(metrics) for out, metrics in trial.accuracy.items()},
        "passes": [{k: step.get(k) for k in ("step", "modified", "stats", "note")}
                   for step in trial.passes],
        "steps": [s.name for s in parse_route(trial.route)],
    }


def seasoning_effects(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """How each seasoning moved latency and error, against the same routes without it.

    For every measured trial whose route holds seasoning s, the trial of the same route
    with s's step removed is its partner, when it was measured too; such a pair is kept.

    Returns:
        One mapping per seasoning, by name:

        - ``pairs``: the pairs kept;
        - ``latency_ratio``: the median over the pairs of the ratio of their
          latencies relative to the base route timed alongside (`Trial.relative`: the
          inverse of the paired speed-up, else p50 over the base's p50; < 1 is faster;
          with an even count, the geometric mean of the middle two). A median, not a
          mean: the pairs are few, and one outlier (183x: a trial timed while its
          base was disturbed) would carry a mean, an arithmetic or a geometric one;
          ``latency_ratio_range``: its smallest and largest ratio ``[min, max]``;
        - ``error_pairs``: the pairs whose two trials both have `ERROR_METRIC`;
          ``error_change``: the mean change of `ERROR_METRIC` (with minus without;
          None without such pairs); ``error_change_range``: ``[min, max]`` or None.

        The spread is the range (min to max) over the pairs, not an interval of the
        mean: the pairs are few (one per route without s), often fewer than five.
    """
    measured = {t.route: t for t in trials if t.relative}
    relative = {route: t.relative.p50 for route, t in measured.items() if t.relative}
    effects: dict[str, dict[str, list[float]]] = {}
    for t in measured.values():
        route = parse_route(t.route)
        for i, step in enumerate(route.steps):
            rest = str(type(route)(route.steps[:i] + route.steps[i + 1:]))
            partner = measured.get(rest)
            if partner is None:
                continue
            acc = effects.setdefault(step.name, {"ratio": [], "error": []})
            acc["ratio"].append(relative[t.route] / relative[rest])
            err, err0 = worst_error(t), worst_error(partner)
            if err is not None and err0 is not None:
                acc["error"].append(err - err0)
    return [{"seasoning": name, "pairs": len(v["ratio"]),
             "latency_ratio": _median_ratio(v["ratio"]),
             "latency_ratio_range": _range(v["ratio"]),
             "error_pairs": len(v["error"]), "error_change": _mean(v["error"]),
             "error_change_range": _range(v["error"])}
            for name, v in sorted(effects.items())]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median_ratio(values: list[float]) -> float | None:
    ordered = sorted(v for v in values if v > 0)
    if not ordered:
        return None
    middle = ordered[(len(ordered) - 1) // 2: len(ordered) // 2 + 1]
    return math.sqrt(middle[0] * middle[-1])


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def worst_error(trial: Trial, headline: tuple[str, bool] = (ERROR_METRIC, False)
                ) -> float | None:
    """The headline value of the trial's worst output; None when it was not measured.

    Args:
        trial: The trial.
        headline: The value's key in the trial's accuracy (``rel_l2``, ``mask_iou@0.3``,
            or ``logits:top1`` for one output) and whether higher is better
            (`routetune.judging.constraint.Constraint.headline`).
    """
    return worst_of(trial.accuracy, *headline)

