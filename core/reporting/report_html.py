"""``report.html``: one self-contained file, readable offline.

Two charts, matplotlib's SVG inline: the Pareto chart (latency against error) and the
accurate routes' speed-ups with their 95% intervals; every point has a hover title. The
trial table keeps `routetune.reporting.report.build_report`'s order (the winner, the
accurate routes by speed, the rest), scrolls inside its own box and sorts by any column
with a few lines of inline JavaScript. A Content-Security-Policy forbids every fetch, so
the page cannot load anything from the network even by mistake.

Opening the file with ``#selftest`` records layout facts in
``document.body.dataset.selftest`` (the window's width, whether the page scrolls
sideways, the first row, the charts' titles, whether a figure or a route step wrapped),
then sorts by p50 and records the routes in that order; the browser test reads it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from routetune.reporting.charts import pareto_chart, speedup_chart
from routetune.reporting.report import ERROR_METRIC
from routetune.reporting.report_text import (
    EFFECTS_CAPTION,
    environment,
    headline_of,
    span_text,
    speedup_text,
    winner_text,
    worst_value,
)
from routetune.routes.route import parse_route

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")


CSS = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; overflow-wrap: break-word; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
caption { caption-side: top; text-align: left; color: #555; padding-bottom: 4px; }
#environment td { overflow-wrap: anywhere; }
table.sortable thead th { cursor: pointer; background: #f3f3f3; }
thead th[data-dir=asc]::after { content: " \\25B2"; }
thead th[data-dir=desc]::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.status { white-space: nowrap; }
code.route { display: inline-block; max-width: 32em; }
code.route > span { white-space: nowrap; }
div.fold { min-width: 14em; max-width: 32em; overflow-wrap: anywhere; }
.table-box { overflow: auto; max-height: 75vh; width: fit-content; max-width: 100%;
              border: 1px solid #ccc; }
.table-box table { margin: 0; border-collapse: separate; border-spacing: 0; }
.table-box td, .table-box th { border-width: 0 1px 1px 0; }
.table-box thead th { position: sticky; top: 0; z-index: 1; }
tr.winner td { background: #eef7f0; }
.chart svg { display: block; width: 100%; max-width: 1200px; height: auto; }
.ok { color: #2a9d4b; } .accuracy-failed { color: #b07d00; }
.build-failed, .crashed { color: #c0392b; } .skipped { color: #888; }
.build-only { color: #3a7bd5; }
@media print {
  body { margin: 0; }
  .table-box { max-height: none; overflow: visible; border: none; }
  .table-box thead th { position: static; }
  tr, .chart { break-inside: avoid; }
}
"""

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
document.querySelectorAll('table.sortable thead th').forEach(
  th => th.addEventListener('click', () => sortBy(th)));
function lines(el) {  // the lines of text `el` takes
  const range = document.createRange();
  range.selectNodeContents(el);
  const rects = Array.from(range.getClientRects()).filter(r => r.width > 0)
    .sort((a, b) => a.top - b.top);
  let n = 0, bottom = -Infinity;
  for (const r of rects) {
    if (r.top >= bottom - 2) { n++; bottom = r.bottom; }
    else { bottom = Math.max(bottom, r.bottom); }
  }
  return n;
}
function overlapping(boxes) {
  return boxes.some((a, i) => boxes.slice(i + 1).some(b => a.left < b.right && b.left < a.right
    && a.top < b.bottom && b.top < a.bottom));
}
if (location.hash === '#selftest') {
  const routes = () => Array.from(document.querySelectorAll('#trials tbody td.route'))
    .map(td => td.dataset.v);
  const all = selector => Array.from(document.querySelectorAll(selector));
  const facts = {
    innerWidth: window.innerWidth,
    pageScroll: document.documentElement.scrollWidth > document.documentElement.clientWidth,
    order: routes(),
    first: routes()[0],
    titles: all('.chart svg title').length,
    paretoTitles: all('#pareto svg title').length,
    speedupTitles: all('#speedups svg title').length,
    figuresWrapped: all('#trials td.num, #seasonings td.num').some(td => lines(td) > 1),
    stepsBroken: all('code.route > span').some(s => lines(s) > 1),
    routeLines: Math.max(0, ...all('#trials code.route').map(lines)),
    reasonLines: Math.max(0, ...all('#trials div.fold').map(lines)),
    labelsOverlap: overlapping(all('#pareto g[id^="label-"] text')
      .map(t => t.getBoundingClientRect())),
    boxScrolls: document.getElementById('trials-box').scrollWidth
      > document.getElementById('trials-box').clientWidth,
  };
  document.getElementById('p50-header').click();
  facts.sorted = routes();
  facts.svg = all('#pareto svg path, #pareto svg use').length;
  document.body.dataset.selftest = JSON.stringify(facts);
}
"""



def route_html(route: str) -> str:
    """A route as HTML that breaks only after the commas between its steps.

    Each step is a ``nowrap`` span and a ``<wbr>`` follows each step's comma, so a
    step (``fp16{op_types_to_exclude=[Softmax,Pow]}`` too) never splits.
    """
    steps = [html.escape(str(s)) for s in parse_route(route)] or [html.escape(route)]
    return ("<code class='route'>" + "".join(f"<span>{s},</span><wbr>" for s in steps[:-1])
            + f"<span>{steps[-1]}</span></code>")


def render_html(data: dict[str, Any]) -> str:
    """The whole report as one HTML document with no external reference."""
    e = html.escape
    env = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>"
                  for k, v in environment(data["run"]).items())
    winner = data.get("winner")
    win = (f"<h2>Winner: {route_html(winner['route'])}</h2><p>{e(winner_text(winner))}</p>"
           if winner else "<p>No result recorded (the run did not finish).</p>")
    speedups = speedup_chart(data)
    key, higher = headline_of(data["run"])  # the metric the verdict used, its column
    headline = None if key in (ERROR_METRIC, "cos") else (key, higher)
    rows = "".join(_trial_row(n, r, winner is not None and r["route"] == winner["route"],
                              headline) for n, r in enumerate(data["trials"], 1))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>routetune report</title>
<style>{CSS}</style></head><body>
<h1>routetune report</h1>
<table id="environment">{env}</table>
{win}
<h2>Latency against accuracy error</h2>
<div id="pareto" class="chart">{pareto_chart(data).svg("pareto")}</div>
<h2>Speed-ups of the accurate routes</h2>
<div id="speedups" class="chart">{speedups.svg("speedups") if speedups else
    "<p>No accurate route was measured against the base route.</p>"}</div>
<h2>Seasonings</h2>
{_effects_table(data["seasonings"])}
<h2>Trials</h2>
<p>The winner first, then the accurate routes by speed, then the rest. Click a column to
sort (# restores this order). Rejected trials give the reason and the margin.</p>
<div class="table-box" id="trials-box"><table id="trials" class="sortable"><thead><tr>
<th>#</th><th>route</th><th>status</th><th id="p50-header">p50 ms</th>
<th>± ms (blocks)</th><th>base p50 ms (alongside)</th><th>speed-up in the search [95%]</th>
<th>{ERROR_METRIC}</th><th>cos</th>{f"<th>{e(key)}</th>" if headline else ""}<th>build ms</th>
<th>reason</th>
</tr></thead><tbody>{rows}</tbody></table></div>
<script>{SCRIPT}</script>
</body></html>
"""


def _effects_table(effects: list[dict[str, Any]]) -> str:
    """The seasoning table: pairs, mean and range (min–max) of each effect."""
    e = html.escape
    rows = "".join(
        f"<tr><td data-v='{e(s['seasoning'])}'><code>{e(s['seasoning'])}</code></td>"
        + _num_cell(s["pairs"], str(s["pairs"]))
        + _num_cell(s["latency_ratio"], _f(s["latency_ratio"], ".3f"))
        + _num_cell(_low(s.get("latency_ratio_range")),
                    span_text(s.get("latency_ratio_range"), ".3f"))
        + _num_cell(s["error_change"], _f(s["error_change"], "+.3g"))
        + _num_cell(_low(s.get("error_change_range")),
                    span_text(s.get("error_change_range"), "+.3g"))
        + _num_cell(s.get("error_pairs"), str(s.get("error_pairs", "")))
        + "</tr>" for s in effects)
    return (f"<table id='seasonings' class='sortable'><caption>{e(EFFECTS_CAPTION)}</caption>"
            f"<thead><tr><th>seasoning</th><th>pairs</th><th>latency ratio: median</th>"
            f"<th>min–max</th><th>{ERROR_METRIC} change: mean</th><th>min–max</th>"
            f"<th>pairs with {ERROR_METRIC}</th></tr></thead><tbody>{rows}</tbody></table>")


def _trial_row(number: int, r: dict[str, Any], winner: bool,
               headline: tuple[str, bool] | None = None) -> str:
    e = html.escape
    ci = r["ci_ms"]
    spread = (ci[1] - ci[0]) / 2 if ci else None
    mark = " <strong>(winner)</strong>" if winner else ""
    task = worst_value(r, *headline) if headline is not None else None
    speed = e(speedup_text({**r, "noisy": False})) + (" <em>noisy</em>" if r.get("noisy")
                                                       else "")
    cells = [
        (str(number), str(number), "num"),
        (e(r["route"]), route_html(r["route"]) + mark, "route"),
        (e(r["status"]), f"<span class='{e(r['status'])}'>{e(r['status'])}</span>", "status"),
        (_v(r["p50_ms"]), _p50_html(r), "num"),
        (_v(spread), _f(spread, ".3f"), "num"),
        (_v(r["base_p50_ms"]), _f(r["base_p50_ms"], ".3f"), "num"),
        (_v(r["speedup"]), speed, "num"),
        (_v(r["error"].get(ERROR_METRIC)), _f(r["error"].get(ERROR_METRIC), ".3g"), "num"),
        (_v(r["error"].get("cos")), _f(r["error"].get("cos"), ".6f"), "num"),
        *([] if headline is None else [(_v(task), _f(task, ".3g"), "num")]),
        (_v(r["build_ms"]), _f(r["build_ms"], ".0f"), "num"),
        (e(r["reason"]), f"<div class='fold'>{e(r['reason'])}</div>", "reason"),
    ]
    return (f"<tr{' class=winner' if winner else ''}>"
            + "".join(f"<td data-v='{v}' class='{c}'>{t}</td>" for v, t, c in cells) + "</tr>")


def _p50_html(r: dict[str, Any]) -> str:
    """The p50 as text; where the engine has host copies, the other figure on hover."""
    text = _f(r["p50_ms"], ".3f")
    if r.get("other_p50_ms") is None:
        return text
    other = "device compute" if r["latency_kind"] == "end-to-end" else "host to host"
    memory = r.get("device_memory_bytes")
    title = (f"{r['latency_kind']} p50 {text} ms; {other} p50 {r['other_p50_ms']:.3f} ms"
             + (f"; device memory {memory / 2**20:.0f} MiB" if memory is not None else ""))
    return f"<span title='{html.escape(title)}'>{text}</span>"


def _num_cell(value: float | None, text: str) -> str:
    return f"<td data-v='{_v(value)}' class='num'>{html.escape(text)}</td>"


def _low(span: Sequence[float] | None) -> float | None:
    return span[0] if span else None


def _v(value: float | None) -> str:
    return "" if value is None else f"{value:.9g}"


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"
