"""The report's words: the environment, the verdict, the speed-ups, and ``report.md``.

`environment`, `winner_text`, `speedup_text` and `conditions_text` are shared by the
Markdown report (`render_markdown`) and the HTML one (`routetune.reporting.report_html`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: environment, settings, winner, seasonings, trials."""
    run, lines = data["run"], []
    lines.append(f"# routetune report: {Path(run.get('model', {}).get('source', '?')).name}\n")
    lines += [f"- {k}: {v}" for k, v in environment(run).items()]
    winner = data.get("winner")
    if winner:
        lines.append(f"\n## Winner: `{winner['route']}`\n\n{winner_text(winner)}\n")
        if phase_text(run.get("phase"), winner):
            lines.append(f"{phase_text(run.get('phase'), winner)}\n")
    lines.append("\n## Seasonings: effect against the same routes without them\n")
    lines.append(f"{EFFECTS_CAPTION}\n")
    lines.append("| seasoning | pairs | latency ratio: median | min–max | "
                 "rel-L2 change: mean | min–max | pairs with rel-L2 |\n"
                 "|---|---|---|---|---|---|---|")
    for s in data["seasonings"]:
        lines.append(f"| `{s['seasoning']}` | {s['pairs']} | {s['latency_ratio']:.3f} | "
                     f"{span_text(s.get('latency_ratio_range'), '.3f')} | "
                     f"{_num(s['error_change'], '+.3g')} | "
                     f"{span_text(s.get('error_change_range'), '+.3g')} | "
                     f"{s.get('error_pairs', '')} |")
    lines.append("\n## Trials\n")
    lines.append("Speed-up: search-time, paired blocks with the base route (median "
                 "[95% interval]); *noisy*: timed while the machine was busy (other "
                 "processes' load, or slower than it was).\n")
    other = next((r for r in data["trials"] if r.get("other_p50_ms") is not None), None)
    extra = (f" {'device' if other['latency_kind'] == 'end-to-end' else 'host-to-host'} "
             "p50 ms | device MiB |") if other else ""
    kind = f"{other['latency_kind']} " if other else ""
    key, higher = headline_of(data["run"])
    lines.append(f"| route | status | {kind}p50 ms | "
                 f"base p50 ms (alongside) | speed-up | {key} |{extra} reason |\n"
                 f"|---|---|---|---|---|---|{'---|---|' if other else ''}---|")
    for r in data["trials"]:
        reason = r["reason"].replace("|", "\\|")
        mark = " (winner)" if winner and r["route"] == winner["route"] else ""
        memory = r.get("device_memory_bytes")
        cells = (f" {_num(r.get('other_p50_ms'), '.3f')} | "
                 f"{_num(memory / 2**20 if memory is not None else None, '.0f')} |"
                 if other else "")
        lines.append(f"| `{r['route']}`{mark} | {r['status']} | {_num(r['p50_ms'], '.3f')} | "
                     f"{_num(r['base_p50_ms'], '.3f')} | {speedup_text(r)} | "
                     f"{_num(worst_value(r, key, higher), '.3g')} |{cells} {reason} |")
    return "\n".join(lines) + "\n"


def headline_of(run: Mapping[str, Any]) -> tuple[str, bool]:
    """The headline value a run's tables show (``run.json``'s ``headline``), else rel-L2.

    Runs recorded before the field existed show rel-L2.
    """
    key, higher = run.get("headline") or ("rel_l2", False)
    return str(key), bool(higher)


def worst_value(row: dict[str, Any], key: str, higher: bool) -> float | None:
    """`key`'s value for the row's worst output (`worst_of`)."""
    return worst_of(row.get("accuracy", {}), key, higher)


def worst_of(accuracy: Mapping[str, Mapping[str, float]], key: str, higher: bool
             ) -> float | None:
    """`key`'s value for the worst output of `accuracy` (output name to metric values).

    A key scoped to one output (``logits:top1``, as `Constraint.headline` gives for a
    scoped bound) reads that output only: a bound on a decoder's logits says nothing of
    its ``present.*`` cache outputs. None when no output has the value.
    """
    output, _, metric = key.rpartition(":")
    values = [m[metric] for name, m in accuracy.items()
              if metric in m and (not output or name == output)]
    return (min(values) if higher else max(values)) if values else None


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
              f"a decoder's, made with the FP32 reference: {given['decoder']}"
              if "decoder" in given else
              f"the {given['example']} example's own input sets at {shapes}"
              if "example" in given else f"synthesised (seeded, uniform in [0, 1)) at {shapes}")
    return {
        "model": f"{model['source']} (sha256 {model['sha256']})",
        "backend": f"{backend['name']} {backend['version']} on {backend['device']}",
        "versions": versions,
        "CPU": f"{run['machine']['cpu']}; flags {' '.join(run['machine']['cpu_flags'])}",
        "accuracy constraint": run["accuracy"] + (
            f" ({given['accuracy']} task constraint)" if "accuracy" in given else ""),
        "optimisation profile": run["profile"] or "none",
        "validation inputs": inputs,
        **({"decoder phase": PHASES[run["phase"]]} if run.get("phase") in PHASES else {}),
        "FP32 reference": _reference_text(run.get("reference")),
        "base pipeline": ", ".join(run.get("base_pipeline", [])) or "none",
        "custom-op libraries": _libraries_text(run.get("libraries"), "custom_ops"),
        "plugin libraries": _libraries_text(run.get("libraries"), "plugins"),
        "backend options": ", ".join(f"{k}={v}" for k, v in
                                     backend.get("options", {}).items()) or "defaults",
        "pinned routes": ", ".join(f"'{r}'" for r in run.get("pinned", [])) or "none",
        "route space": f"{run['space']['size']} route{'s' * (run['space']['size'] != 1)} "
                       f"from {n} seasoning{'s' * (n != 1)} (max depth "
                       f"{run['space']['max_depth']}): "
                       + (", ".join(run["space"]["seasonings"]) or "none"),
        "search": f"{strategy}; max trials {search['max_trials'] or 'none'}, time budget "
                  + (f"{search['time_budget_s']} s" if search["time_budget_s"] else "none")
                  + (f"; stopped early: {stopped}"
                     if (stopped := (run.get("result") or {}).get("stopped")) else ""),
        "route memory": _memory_text(search.get("memory")),
        "measurement": f"at least {run['measure']['min_runs']} runs, "
                       f"{run['measure']['min_time_s']} s and "
                       f"{run['measure'].get('min_blocks', 1)} blocks per candidate, timed "
                       "in paired blocks with the base route",
        "verdict": _verdict_rule(run),
        "machine conditions": conditions_text(run),
        "started": f"{run['started_at']}, finished {run.get('finished_at', '?')}",
    }


def _reference_text(reference: Any) -> str:
    """Where the FP32 reference came from: a run here, or the user's file with its sha256."""
    if not isinstance(reference, dict) or reference.get("source") != "file":
        backend = reference.get("backend") if isinstance(reference, dict) else None
        return f"run here ({backend or 'onnxruntime'}, CPU, optimisations off)"
    return (f"from the file {reference.get('path')} ({reference.get('format')}, "
            f"sha256 {reference.get('sha256')}), not run here")


def _libraries_text(libraries: Any, kind: str) -> str:
    """Each library of `kind` the run loaded, with its sha256 (`routetune.libraries`)."""
    listed = libraries.get(kind) if isinstance(libraries, dict) else None
    if not isinstance(listed, list) or not listed:
        return "none"
    return "; ".join(f"{lib.get('path')} (sha256 {lib.get('sha256')})" for lib in listed
                     if isinstance(lib, dict))


def _memory_text(memory: dict[str, Any] | str | None) -> str:
    """The route memory's line: the file and what it knew, what this run added to it."""
    if not isinstance(memory, dict):  # an older run.json: a line, or nothing
        return memory or "none (a run before the route memory)"
    if memory["path"] is None or not memory["used"]:
        return memory["note"]
    return (f"{memory['note']}; it ordered the search only, no figure comes from it; this "
            f"run added {memory['lessons_added']:,} lesson"
            f"{'s' * (memory['lessons_added'] != 1)}")


PHASES = {"decode": "decode: one token against a cache per run, so p50 is the per-token "
                     "latency and 1000 / p50 the tokens/s at batch 1",
          "prefill": "prefill: a prompt against an empty cache per run, so p50 is the time "
                      "to the first token",
          "generate": "generate: a prompt and every greedy step after it per run, in order "
                       "(one call), so p50 is the time from the prompt to the last token"}
"""A decoder's phase (``run.json``'s ``phase``, `routetune.feeds.decoder.phase_of`): what
its p50 figures mean."""


def phase_text(phase: str | None, winner: dict[str, Any]) -> str:
    """The winner's figures in a decoder user's words (`PHASES`); "" for other models."""
    if phase not in PHASES:
        return ""
    from routetune.feeds.decoder import per_token

    confirmed, search = winner.get("confirmed"), winner.get("search") or {}
    figures = (("the confirmation", confirmed["p50_ms"], confirmed["base_p50_ms"])
               if confirmed else ("the search", search.get("p50_ms"), None))
    where, ms, base = figures
    if not ms:
        return ""
    text = f"{phase.capitalize()}: {per_token(ms, phase)}"
    if base:
        text += f" against the base route's {per_token(base, phase)}"
    return text + f", batch 1 (p50 in {where})."


def winner_text(winner: dict[str, Any]) -> str:
    """The winner in a few sentences: why, the confirmed and the search-time figures."""
    reason = winner["reason"][:1].upper() + winner["reason"][1:]
    parts = [f"{reason}."]
    confirmed, search = winner.get("confirmed"), winner.get("search")
    if confirmed:
        lo, hi = confirmed["speedup_ci"]
        repeats = confirmed.get("repeats") or []
        how = (f"{len(repeats)} fresh processes, paired blocks; the median of their "
               "estimates, and from the lowest to the highest end of their 95% intervals, "
               f"{confirmed['pairs']} block pairs in all" if len(repeats) > 1 else
               "fresh process, paired blocks; median and 95% interval over "
               f"{confirmed['pairs']} block pairs")
        each = ("; each: " + ", ".join(f"{v:.2f}x [{a:.2f}, {b:.2f}]" for v, a, b in repeats)
                if len(repeats) > 1 else "")
        parts.append(
            f"Confirmed ({how}): {confirmed['speedup']:.2f}x [{lo:.2f}, {hi:.2f}]{each}; "
            f"p50 {confirmed['p50_ms']:.3f} ms against the base route's "
            f"{confirmed['base_p50_ms']:.3f} ms.")
    if search and winner["route"] != "base" and search.get("speedup"):
        ci = search.get("speedup_ci")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        parts.append(f"In the search: {search['speedup']:.2f}x{interval}; p50 "
                     f"{search['p50_ms']:.3f} ms.")
    for c in winner.get("confirmations", []):
        if c["route"] != winner["route"]:
            p = c["paired"]
            parts.append(f"Not confirmed: '{c['route']}' {p['value']:.2f}x [{p['ci_low']:.2f}, "
                         f"{p['ci_high']:.2f}] (search "
                         f"{_num(c.get('search_speedup'), '.2f', 'x')}).")
    return " ".join(parts)


def speedup_figure(value: float, interval: Sequence[float] | None = None) -> str:
    """A speed-up and its interval: ``1.25x [1.20, 1.31]``, ``0.006x [0.004, 0.006]``.

    Two decimals, or more where the interval's lower end is below 0.1, so that a
    hopeless candidate's figure does not read as ``0.00``.
    """
    low = min([value, *(interval or ())])
    digits = 2 if low >= 0.1 else 3 if low >= 0.01 else 4
    text = f"{value:.{digits}f}x"
    if interval:
        text += f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
    return text


def speedup_text(row: dict[str, Any]) -> str:
    """A row's search-time speed-up with its interval, and the noisy mark."""
    if row["speedup"] is None:
        return ""
    return (speedup_figure(row["speedup"], row.get("speedup_ci"))
            + (" *noisy*" if row.get("noisy") else ""))


EFFECTS_CAPTION = ("Each seasoning against the same routes without it (pairs of trials, "
                   "both measured) and the range (min–max) over them. Latency ratio: the "
                   "route's latency relative to the base route with the seasoning over "
                   "that without it (each the inverse of its speed-up column: paired "
                   "blocks with the base route where timed so, else p50 over the base "
                   "route's p50 alongside; < 1 is faster), summarised by the median, so "
                   "that one outlier does not stand for the seasoning; rel-L2 change: "
                   "with minus without, by the mean.")
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
            f"processes loaded the machine, or while it ran slower than it was with none "
            f"to blame)")
    if c["noisy_routes"]:
        text += ": " + ", ".join(f"'{r}'" for r in c["noisy_routes"][:5]) + (
            "…" if c["noisy"] > 5 else "")
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


ROUTE_WIDTH = 48
"""Characters per line of a route in the terminal tables; it wraps only at a comma."""


def route_steps(text: str) -> list[str]:
    """A route's text split after each comma between steps (not those inside a step)."""
    steps, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            steps.append(text[start:i + 1])
            start = i + 1
    steps.append(text[start:])
    return steps


def short_route(text: str, limit: int) -> str:
    """A route's text in at most `limit` characters, cut between steps.

    The first steps that fit, then ``… +N`` for the N left out; a first step longer than
    `limit` is cut itself, ending in "…".
    """
    if len(text) <= limit:
        return text
    steps = route_steps(text)
    kept = ""
    for i, step in enumerate(steps):
        rest = f"… +{len(steps) - i}"
        if len(kept) + len(step) + len(rest) > limit:
            return (kept + rest) if kept else step[:limit - 1] + "…"
        kept += step
    return kept


def wrap_route(text: str, width: int = ROUTE_WIDTH, cut: int | None = None) -> str:
    """A route's text in lines of at most `width` characters, broken only after a comma.

    A step is never split (``fp16{op_types_to_exclude=[Softmax,Pow]}`` stays whole,
    however long), so each line can be copied back into a route; the commas inside a
    step's parameters are not break points. With `cut`, a step longer than `cut`
    characters is shortened to that many, ending in "…" (the table's row number leads
    to the whole route: ``routetune show --all`` in a wider terminal, or report.html).
    """
    steps = route_steps(text)
    if cut is not None:
        steps = [step if len(step) <= cut else step[:cut - 1] + "…" for step in steps]
    lines = [""]
    for step in steps:
        if lines[-1] and len(lines[-1]) + len(step) > width:
            lines.append("")
        lines[-1] += step
    return "\n".join(lines)
