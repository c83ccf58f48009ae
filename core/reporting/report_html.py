"""``report.html``: one self-contained file, readable offline.

The Pareto chart is matplotlib's SVG, inline; the trial table sorts by any column with
a few lines of inline JavaScript; a Content-Security-Policy forbids every fetch, so the
page cannot load anything from the network even by mistake. Opening the file with
``#selftest`` makes it sort by p50 and record the first routes in
``document.body.dataset.selftest`` (the browser test reads it).
"""

from __future__ import annotations

import html
import io
import math
from typing import Any

from routetune.reporting.report import ERROR_METRIC, environment, speedup_text, winner_text

STYLE = {"ok": ("#2a9d4b", "o"), "accuracy-failed": ("#e0a100", "X"),
         "build-only": ("#3a7bd5", "s"), "crashed": ("#c0392b", "v"),
         "build-failed": ("#c0392b", "v"), "timed-out": ("#8e44ad", "v"),
         "skipped": ("#999999", ".")}
"""Colour and matplotlib marker per status."""

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")

SCRIPT = """
function sortBy(th) {
  const table = th.closest('table'), body = table.tBodies[0];
  const col = Array.from(th.parentNode.children).indexOf(th);
  const dir = th.dataset.dir === 'asc' ? 'desc' : 'asc';
  th.parentNode.querySelectorAll('th').forEach(h => delete h.dataset.dir);
  th.dataset.dir = dir;
  const key = row => {
    const v = row.children[col].dataset.v;
    const n = parseFloat(v);
    return v === '' ? null : (isNaN(n) ? v : n);
  };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === null) return 1;
    if (y === null) return -1;
    const numeric = typeof x === 'number' && typeof y === 'number';
    const c = numeric ? x - y : String(x).localeCompare(String(y));
    return dir === 'asc' ? c : -c;
  });
  rows.forEach(r => body.appendChild(r));
}
document.querySelectorAll('th').forEach(th => th.addEventListener('click', () => sortBy(th)));
if (location.hash === '#selftest') {
  document.getElementById('p50-header').click();
  const rows = document.querySelectorAll('#trials tbody tr');
  const routes = Array.from(rows).map(r => r.children[0].dataset.v);
  document.body.dataset.selftest = JSON.stringify({sorted: routes,
    svg: document.querySelectorAll('#pareto svg path, #pareto svg use').length});
}
"""


def pareto_svg(data: dict[str, Any]) -> str:
    """The Pareto chart as inline SVG: latency relative to the base route against error.

    One point per measured trial (p50 over the base route's p50 timed alongside;
    `ERROR_METRIC`, symlog axis), coloured and shaped by status; the accurate trials'
    Pareto front as a line; the winner ringed.
    """
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    fig, ax = plt.subplots(figsize=(10, 4.5))
    rows = [r for r in data["trials"] if r["relative_p50"] is not None]
    for status, (colour, marker) in STYLE.items():
        pts = [(r["error"].get(ERROR_METRIC, 0.0), r["relative_p50"]) for r in rows
               if r["status"] == status]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, c=colour, marker=marker, s=36,
                       label=f"{status} ({len(pts)})", alpha=0.85)
    accurate = {(r["error"].get(ERROR_METRIC, 0.0), r["relative_p50"]): r["route"]
                for r in rows if r["status"] == "ok"}
    front = _front(list(accurate))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), color=STYLE["ok"][0], lw=1, alpha=0.6,
                drawstyle="steps-post", label="Pareto front (accurate)")
    for point in front:  # name the routes worth a look
        ax.annotate(accurate[point], point, fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    winner = data.get("winner") or {}
    if winner.get("relative_p50") is not None:
        ax.scatter([winner["error"].get(ERROR_METRIC, 0.0)], [winner["relative_p50"]],
                   s=160, facecolors="none", edgecolors="black",
                   label=f"winner: {winner['route']}")
    unplotted = len(data["trials"]) - len(rows)
    positive = [e for e, _ in accurate] + [r["error"].get(ERROR_METRIC, 0.0) for r in rows]
    positive = [e for e in positive if e > 0]
    linthresh = 10 ** math.floor(math.log10(min(positive))) if positive else 1e-6
    ax.set_xscale("symlog", linthresh=linthresh)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"accuracy error ({ERROR_METRIC}, worst output; symlog)")
    ax.set_ylabel("search-time latency / base route\n(paired blocks; not the confirmation)")
    ax.axhline(1.0, color="#555555", lw=0.6, ls=":")
    ax.set_title(f"{len(rows)} measured trials; {unplotted} not measured (failed, "
                 "skipped or build-only)", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.subplots_adjust(left=0.08, right=0.66, top=0.92, bottom=0.12)  # one draw, not two
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (lower error and lower latency), by error."""
    front: list[tuple[float, float]] = []
    for err, lat in sorted(points):
        if not front or lat < front[-1][1]:
            front.append((err, lat))
    return front


def render_html(data: dict[str, Any]) -> str:
    """The whole report as one HTML document with no external reference."""
    e = html.escape
    env = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>"
                  for k, v in environment(data["run"]).items())
    winner = data.get("winner")
    win = (f"<h2>Winner: <code>{e(winner['route'])}</code></h2><p>{e(winner_text(winner))}</p>"
           if winner else "<p>No result recorded (the run did not finish).</p>")
    effects = "".join(
        f"<tr><td data-v='{e(s['seasoning'])}'><code>{e(s['seasoning'])}</code></td>"
        f"<td data-v='{s['pairs']}'>{s['pairs']}</td>"
        f"<td data-v='{s['latency_ratio']:.6g}'>{s['latency_ratio']:.3f}</td>"
        f"<td data-v='{_v(s['error_change'])}'>{_f(s['error_change'], '+.3g')}</td></tr>"
        for s in data["seasonings"])
    rows = "".join(_trial_row(r, winner is not None and r["route"] == winner["route"])
                   for r in data["trials"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>routetune report</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
thead th {{ cursor: pointer; background: #f3f3f3; }}
thead th[data-dir=asc]::after {{ content: " \\25B2"; }}
thead th[data-dir=desc]::after {{ content: " \\25BC"; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.ok {{ color: #2a9d4b; }} .accuracy-failed {{ color: #b07d00; }}
.build-failed, .crashed {{ color: #c0392b; }} .skipped {{ color: #888; }}
.build-only {{ color: #3a7bd5; }}
</style></head><body>
<h1>routetune report</h1>
<table id="environment">{env}</table>
{win}
<h2>Latency against accuracy error</h2>
<div id="pareto">{pareto_svg(data)}</div>
<h2>Seasonings</h2>
<p>Each seasoning against the same routes without it: mean ratio of relative p50s
(&lt; 1 is faster) and mean change of {ERROR_METRIC}.</p>
<table id="seasonings"><thead><tr><th>seasoning</th><th>pairs</th><th>latency ratio</th>
<th>{ERROR_METRIC} change</th></tr></thead><tbody>{effects}</tbody></table>
<h2>Trials</h2>
<p>Click a column to sort. Rejected trials give the reason and the margin.</p>
<table id="trials"><thead><tr><th>route</th><th>status</th><th id="p50-header">p50 ms</th>
<th>± ms (blocks)</th><th>base p50 ms (alongside)</th><th>speed-up in the search [95%]</th>
<th>{ERROR_METRIC}</th>
<th>cos</th><th>build ms</th>
<th>reason</th></tr></thead><tbody>{rows}</tbody></table>
<script>{SCRIPT}</script>
</body></html>
"""


def _trial_row(r: dict[str, Any], winner: bool) -> str:
    e = html.escape
    ci = r["ci_ms"]
    spread = (ci[1] - ci[0]) / 2 if ci else None
    mark = " <strong>(winner)</strong>" if winner else ""
    cells = [
        (e(r["route"]), f"<code>{e(r['route'])}</code>{mark}", ""),
        (e(r["status"]), f"<span class='{e(r['status'])}'>{e(r['status'])}</span>", ""),
        (_v(r["p50_ms"]), _f(r["p50_ms"], ".3f"), "num"),
        (_v(spread), _f(spread, ".3f"), "num"),
        (_v(r["base_p50_ms"]), _f(r["base_p50_ms"], ".3f"), "num"),
        (_v(r["speedup"]), e(speedup_text(r)), "num"),
        (_v(r["error"].get(ERROR_METRIC)), _f(r["error"].get(ERROR_METRIC), ".3g"), "num"),
        (_v(r["error"].get("cos")), _f(r["error"].get("cos"), ".6f"), "num"),
        (_v(r["build_ms"]), _f(r["build_ms"], ".0f"), "num"),
        (e(r["reason"]), e(r["reason"]), ""),
    ]
    return "<tr>" + "".join(f"<td data-v='{v}' class='{c}'>{t}</td>" for v, t, c in cells) \
        + "</tr>"


def _v(value: float | None) -> str:
    return "" if value is None else f"{value:.9g}"


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"
