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
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.path import Path as MplPath
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from routetune.reporting.report import (
    EFFECTS_CAPTION,
    ERROR_METRIC,
    environment,
    span_text,
    speedup_text,
    winner_text,
)
from routetune.route import parse_route

STYLE = {"ok": ("#2a9d4b", "o"), "accuracy-failed": ("#e0a100", "X"),
         "build-only": ("#3a7bd5", "s"), "crashed": ("#c0392b", "v"),
         "build-failed": ("#c0392b", "v"), "timed-out": ("#8e44ad", "v"),
         "skipped": ("#999999", ".")}
"""Colour and matplotlib marker per status."""

WINNER_COLOUR = "#111111"
"""The winner's colour in the speed-up chart (its ring in the Pareto chart)."""

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")

TOP_SPEEDUPS = 20
"""How many accurate routes the speed-up chart shows, in the report's order."""

LABEL_CHARS = 48
"""The longest route name a chart writes in full (characters); longer ones end in …."""

LABEL_PAD = 3.0
"""Room kept around a chart label (display pixels, 100 dpi), so that the browser's
font, which may differ from matplotlib's, does not make neighbours touch."""

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


@dataclass
class Chart:
    """A drawn chart, ready for `Chart.svg`.

    Args:
        figure: The matplotlib figure (100 dpi; an Agg canvas measures its text).
        titles: The hover title of each point, by the SVG group id of its artist.
        labels: The boxes of the labels written next to points (display pixels,
            `LABEL_PAD` added on each side); no two overlap.
    """

    figure: Figure
    titles: dict[str, str]
    labels: list[Bbox]

    def svg(self, salt: str) -> str:
        """The chart as an inline ``<svg>`` element with a ``<title>`` on every point.

        `salt` makes the SVG's ids (clip paths, markers) deterministic and distinct
        from another chart's in the same page.
        """
        import matplotlib

        buf = io.StringIO()
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
            self.figure.savefig(buf, format="svg", metadata={"Date": None})
        svg = buf.getvalue()
        return re.sub(r'<g id="([^"]+)">', self._titled, svg[svg.index("<svg"):])

    def _titled(self, group: re.Match[str]) -> str:
        title = self.titles.get(group[1])
        return group[0] if title is None else f"{group[0]}<title>{html.escape(title)}</title>"


def point_title(number: int, row: dict[str, Any]) -> str:
    """A trial's hover title: row number, route, status, speed-up, `ERROR_METRIC`."""
    speed = speedup_text({**row, "noisy": False}) or "none"
    error = row["error"].get(ERROR_METRIC)
    return (f"#{number} {row['route']} · {row['status']} · speed-up {speed}"
            f"{' (noisy)' if row.get('noisy') else ''} · {ERROR_METRIC} "
            + ("none" if error is None else f"{error:.3g}"))


def short(route: str, limit: int = LABEL_CHARS) -> str:
    """`route` as chart text: cut to `limit` characters with an ellipsis, ``$`` escaped.

    (matplotlib reads text between two ``$`` as mathtext.)
    """
    text = route if len(route) <= limit else route[:limit - 1] + "…"
    return text.replace("$", r"\$")


def _figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of `width` by `height` inches at 100 dpi with one axes, measured by Agg.

    No pyplot: nothing global (backend, rcParams) changes for the caller.
    """
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def pareto_chart(data: dict[str, Any]) -> Chart:
    """The Pareto chart: search-time latency relative to the base route against error.

    One point per measured trial (p50 over the base route's p50 timed alongside, a
    ratio; `ERROR_METRIC`, worst output, symlog axis), coloured and shaped by status,
    each its own artist with the group id ``pt-<row number>``; the accurate trials'
    Pareto front as a line; the winner ringed. Only the front's points are labelled
    (`place_labels`).
    """
    fig, ax = _figure(12, 6)
    fig.subplots_adjust(left=0.07, right=0.76, top=0.93, bottom=0.1)
    rows = [(n, r) for n, r in enumerate(data["trials"], 1) if r["relative_p50"] is not None]
    titles, counts, points = {}, dict.fromkeys(STYLE, 0), []
    for n, r in rows:
        colour, marker = STYLE.get(r["status"], ("#555555", "o"))
        point = (r["error"].get(ERROR_METRIC, 0.0), r["relative_p50"])
        ax.scatter(*point, c=colour, marker=marker, s=36, alpha=0.85, gid=f"pt-{n}")
        titles[f"pt-{n}"] = point_title(n, r)
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        points.append(point)
    accurate: dict[tuple[float, float], tuple[int, str]] = {}
    for n, r in rows:  # the first row of a point names it: the better-ranked
        if r["status"] == "ok":
            accurate.setdefault((r["error"].get(ERROR_METRIC, 0.0), r["relative_p50"]),
                                (n, r["route"]))
    front = _front(list(accurate))
    handles: list[Any] = [Line2D([], [], ls="", marker=STYLE.get(s, ("", "o"))[1],
                                 color=STYLE.get(s, ("#555555", ""))[0], label=f"{s} ({c})")
                          for s, c in counts.items() if c]
    if len(front) > 1:
        handles += ax.plot(*zip(*front, strict=True), color=STYLE["ok"][0], lw=1, alpha=0.6,
                           drawstyle="steps-post", label="Pareto front (accurate)")
    winner = data.get("winner") or {}
    if winner.get("relative_p50") is not None:
        handles.append(ax.scatter([winner["error"].get(ERROR_METRIC, 0.0)],
                                  [winner["relative_p50"]], s=160, facecolors="none",
                                  edgecolors=WINNER_COLOUR,
                                  label=f"winner: {short(winner['route'], 32)}"))
    positive = [e for e, _ in points if e > 0]
    linthresh = 10 ** math.floor(math.log10(min(positive))) if positive else 1e-6
    ax.set_xscale("symlog", linthresh=linthresh)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"accuracy error ({ERROR_METRIC}, worst output; symlog)")
    ax.set_ylabel("search-time latency / base route\n(paired blocks; not the confirmation)")
    ax.axhline(1.0, color="#555555", lw=0.6, ls=":")
    ax.set_title(f"{len(rows)} measured trials; {len(data['trials']) - len(rows)} not "
                 "measured (failed, skipped or build-only). Hover a point for its figures; "
                 "#n is the row in the trial table", fontsize=9)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0)
    labels = [(point, short(route), f"#{n}", f"label-{n}")
              for point, (n, route) in ((p, accurate[p]) for p in front)]
    return Chart(fig, titles, place_labels(ax, labels, points, _steps_post(front)))


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (lower error and lower latency), by error."""
    front: list[tuple[float, float]] = []
    for err, lat in sorted(points):
        if not front or lat < front[-1][1]:
            front.append((err, lat))
    return front


def _steps_post(front: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The corners of the front's line as drawn (``drawstyle="steps-post"``)."""
    corners: list[tuple[float, float]] = []
    for i, (x, y) in enumerate(front):
        if i:
            corners.append((x, front[i - 1][1]))
        corners.append((x, y))
    return corners


def place_labels(ax: Axes, labels: Sequence[tuple[tuple[float, float], str, str, str]],
                 points: Sequence[tuple[float, float]],
                 line: Sequence[tuple[float, float]]) -> list[Bbox]:
    """Write each label next to its point where it touches nothing; return their boxes.

    A label is tried at fixed offsets (6, 18, 30, 42 and 54 points above and below its
    point, the first label starting above, the next below, and so on; each to the
    right, then to the left) with its text, then with its short text (the row number);
    the first place whose box (`LABEL_PAD` added) stays inside the axes and overlaps no
    placed label, no point and not `line` wins. A label with no such place is left out:
    the point's hover title still names it. Deterministic: the same chart, the same
    places.

    Args:
        ax: The axes, with its scales and limits final.
        labels: ``((x, y), text, short text, group id)`` per label, in data coordinates.
        points: Every point drawn (data coordinates), to be kept clear.
        line: The corners of a polyline (data coordinates) to be kept clear.

    Returns:
        The placed labels' boxes, in display pixels, `LABEL_PAD` included.
    """
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    assert isinstance(fig.canvas, FigureCanvasAgg)  # `_figure`'s
    renderer = fig.canvas.get_renderer()
    ax.get_ylim()  # the autoscaled limits settle (reading them does) before measuring
    area = ax.get_window_extent(renderer)
    dots: list[tuple[float, float]] = [tuple(d) for d in ax.transData.transform(points)
                                       ] if points else []
    path = MplPath(ax.transData.transform(line)) if len(line) > 1 else None
    placed: list[Bbox] = []

    def clear(box: Bbox) -> bool:
        return (area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0
                and box.y1 <= area.y1 and not any(box.overlaps(b) for b in placed)
                and not any(box.contains(x, y) for x, y in dots)
                and not (path is not None and path.intersects_bbox(box, filled=False)))

    for k, (xy, text, fallback, gid) in enumerate(labels):
        for candidate in (text, fallback):
            label = _first_clear(ax, renderer, xy, candidate, k % 2 == 1, clear)
            if label is not None:
                label.set_gid(gid)
                placed.append(label.get_window_extent(renderer).padded(LABEL_PAD))
                break
    return placed


def _first_clear(ax: Axes, renderer: RendererAgg, xy: tuple[float, float], text: str,
                 below: bool, clear: Callable[[Bbox], bool]) -> Annotation | None:
    """`text` annotated at the first offset from `xy` whose box is `clear`, or None."""
    sign = -1 if below else 1
    for rise in (6, 18, 30, 42, 54):
        for dy in (sign * rise, -sign * rise):
            for dx in (6, -6):
                label = ax.annotate(
                    text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=8,
                    ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "#999999",
                                "shrinkA": 0, "shrinkB": 3} if rise > 6 else None)
                if clear(label.get_window_extent(renderer).padded(LABEL_PAD)):
                    return label
                label.remove()
    return None


def speedup_chart(data: dict[str, Any], top: int = TOP_SPEEDUPS) -> Chart | None:
    """The accurate routes' search-time speed-ups with their 95% intervals, or None.

    The first `top` accurate routes with a speed-up, in the report's order (the
    winner first, highlighted), one row each: the median speed-up over paired blocks
    with the base route (a ratio; > 1 is faster) and its 95% interval as a horizontal
    bar, the point's group id ``ci-<row number>``; a line at 1.0, the base route's speed.
    """
    rows = [(n, r) for n, r in enumerate(data["trials"], 1)
            if r["status"] == "ok" and r["speedup"] is not None]
    shown = rows[:top]
    if not shown:
        return None
    winner = (data.get("winner") or {}).get("route")
    fig, ax = _figure(12, 1.4 + 0.3 * len(shown))
    titles = {}
    for y, (n, r) in enumerate(shown):
        colour = WINNER_COLOUR if r["route"] == winner else STYLE["ok"][0]
        lo, hi = r["speedup_ci"] or (r["speedup"], r["speedup"])
        ax.errorbar(r["speedup"], y, xerr=[[max(0.0, r["speedup"] - lo)],
                                           [max(0.0, hi - r["speedup"])]],
                    fmt="none", ecolor=colour, elinewidth=1.5, capsize=3)
        ax.scatter(r["speedup"], y, c=colour, marker="D" if r["route"] == winner else "o",
                   s=40, zorder=3, gid=f"ci-{n}")
        titles[f"ci-{n}"] = point_title(n, r)
    ax.axvline(1.0, color="#555555", lw=0.8, ls=":")
    ax.set_yticks(range(len(shown)), [f"#{n} {short(r['route'])}" for n, r in shown],
                  fontsize=8)
    for tick, (_, r) in zip(ax.get_yticklabels(), shown, strict=True):
        if r["route"] == winner:
            tick.set_fontweight("bold")
    ax.set_ylim(len(shown) - 0.5, -0.5)  # the first row on top
    ax.set_xlabel("search-time speed-up over the base route (median of paired blocks, "
                  "95% interval; > 1 is faster)")
    ax.set_title(f"{len(shown)} of {len(rows)} accurate routes, in the table's order; the "
                 "winner in black", fontsize=9)
    assert isinstance(fig.canvas, FigureCanvasAgg)  # `_figure`'s
    renderer = fig.canvas.get_renderer()
    width = max(renderer.get_text_width_height_descent(
        t.get_text(), t.get_fontproperties(), ismath=False)[0] for t in ax.get_yticklabels())
    inch = 100.0  # pixels per inch: the figure's dpi
    fig.subplots_adjust(left=min(0.6, (width + 24) / (12 * inch)), right=0.98,
                        top=1 - 0.35 * inch / fig.bbox.height,
                        bottom=0.65 * inch / fig.bbox.height)
    return Chart(fig, titles, [])


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
    rows = "".join(_trial_row(n, r, winner is not None and r["route"] == winner["route"])
                   for n, r in enumerate(data["trials"], 1))
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
<th>{ERROR_METRIC}</th><th>cos</th><th>build ms</th><th>reason</th>
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
            f"<thead><tr><th>seasoning</th><th>pairs</th><th>latency ratio: mean</th>"
            f"<th>min–max</th><th>{ERROR_METRIC} change: mean</th><th>min–max</th>"
            f"<th>pairs with {ERROR_METRIC}</th></tr></thead><tbody>{rows}</tbody></table>")


def _trial_row(number: int, r: dict[str, Any], winner: bool) -> str:
    e = html.escape
    ci = r["ci_ms"]
    spread = (ci[1] - ci[0]) / 2 if ci else None
    mark = " <strong>(winner)</strong>" if winner else ""
    speed = e(speedup_text({**r, "noisy": False})) + (" <em>noisy</em>" if r.get("noisy")
                                                       else "")
    cells = [
        (str(number), str(number), "num"),
        (e(r["route"]), route_html(r["route"]) + mark, "route"),
        (e(r["status"]), f"<span class='{e(r['status'])}'>{e(r['status'])}</span>", "status"),
        (_v(r["p50_ms"]), _f(r["p50_ms"], ".3f"), "num"),
        (_v(spread), _f(spread, ".3f"), "num"),
        (_v(r["base_p50_ms"]), _f(r["base_p50_ms"], ".3f"), "num"),
        (_v(r["speedup"]), speed, "num"),
        (_v(r["error"].get(ERROR_METRIC)), _f(r["error"].get(ERROR_METRIC), ".3g"), "num"),
        (_v(r["error"].get("cos")), _f(r["error"].get("cos"), ".6f"), "num"),
        (_v(r["build_ms"]), _f(r["build_ms"], ".0f"), "num"),
        (e(r["reason"]), f"<div class='fold'>{e(r['reason'])}</div>", "reason"),
    ]
    return (f"<tr{' class=winner' if winner else ''}>"
            + "".join(f"<td data-v='{v}' class='{c}'>{t}</td>" for v, t, c in cells) + "</tr>")


def _num_cell(value: float | None, text: str) -> str:
    return f"<td data-v='{_v(value)}' class='num'>{html.escape(text)}</td>"


def _low(span: Sequence[float] | None) -> float | None:
    return span[0] if span else None


def _v(value: float | None) -> str:
    return "" if value is None else f"{value:.9g}"


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"
