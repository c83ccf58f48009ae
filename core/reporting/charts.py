"""The report's two charts, drawn with matplotlib as inline SVG with hover titles.

`pareto_chart`: search-time latency relative to the base route against error, every
measured trial, the accurate Pareto front, its routes labelled where the labels do not
collide (`place_labels`). `speedup_chart`: the accurate routes' speed-ups with their 95%
intervals, the top `TOP_SPEEDUPS`. No pyplot: nothing global changes for the caller.
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

from routetune.reporting.report import ERROR_METRIC
from routetune.reporting.report_text import short_route, speedup_text

STYLE = {"ok": ("#2a9d4b", "o"), "accuracy-failed": ("#e0a100", "X"),
         "build-only": ("#3a7bd5", "s"), "crashed": ("#c0392b", "v"),
         "build-failed": ("#c0392b", "v"), "timed-out": ("#8e44ad", "v"),
         "skipped": ("#999999", ".")}
"""Colour and matplotlib marker per status."""

WINNER_COLOUR = "#111111"
"""The winner's colour in the speed-up chart (its ring in the Pareto chart)."""

TOP_SPEEDUPS = 20
"""How many accurate routes the speed-up chart shows, in the report's order."""

LABEL_CHARS = 48
"""The longest route name a chart writes in full (characters); longer ones end in …."""

LABEL_PAD = 3.0
"""Room kept around a chart label (display pixels, 100 dpi), so that the browser's
font, which may differ from matplotlib's, does not make neighbours touch."""


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
    """`route` as chart text: at most `limit` characters, cut between steps.

    `short_route` cuts it; ``$`` is escaped (matplotlib reads text between two ``$`` as
    mathtext).
    """
    return short_route(route, limit).replace("$", r"\$")


def _figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of `width` by `height` inches at 100 dpi with one axes, measured by Agg.

    No pyplot: nothing global (backend, rcParams) changes for the caller.
    """
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


LOG_SPREAD = 10.0
"""Above this ratio of the slowest to the fastest relative latency, the Pareto chart's
latency axis is logarithmic: a trial 183x slower (timed while its base route was
disturbed) then leaves the 0.5x-2x routes apart instead of on one line."""


def pareto_chart(data: dict[str, Any]) -> Chart:
    """The Pareto chart: search-time latency relative to the base route against error.

    One point per measured trial (p50 over the base route's p50 timed alongside, a
    ratio; `ERROR_METRIC`, worst output, symlog axis), coloured and shaped by status,
    each its own artist with the group id ``pt-<row number>``; the accurate trials'
    Pareto front as a line; the winner ringed. The latency axis is logarithmic when
    the latencies span more than `LOG_SPREAD`. Only the front's points are labelled
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
    # the winner at its search row's point, as every other trial
    route = (data.get("winner") or {}).get("route")
    winner: dict[str, Any] = next((r for r in data["trials"] if r["route"] == route), {})
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
    ys = [y for _, y in points if y > 0]
    spread = max(ys) / min(ys) if ys else 1.0
    if spread > LOG_SPREAD:  # one outlier would squeeze every useful point into a line
        ax.set_yscale("log")
    ax.set_ylabel("search-time latency / base route"
                  + (" (log scale)" if spread > LOG_SPREAD else "")
                  + "\n(paired blocks; not the confirmation)")
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
