"""Reports from a real search's trial store, and the HTML in a real headless Chromium."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from command import routetune, without_root_rights
from graphs import conv_bn
from PIL import Image
from quick import quick_spec

from routetune.errors import UsageError
from routetune.reporting.charts import TOP_SPEEDUPS, pareto_chart, speedup_chart
from routetune.reporting.files import write_reports
from routetune.reporting.report import build_report
from routetune.reporting.report_html import render_html, route_html
from routetune.run.tuning import tune

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no chromium here (apt-get install chromium)")

ARTIFACTS = Path(os.environ.get("ROUTETUNE_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parents[2] / "test-artifacts" / "report")
"""Where the browser test keeps its screenshots for a person to look at."""

SVG_TITLE = "{http://www.w3.org/2000/svg}title"


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished exhaustive search over four seasonings on a Conv+BN model."""
    root = tmp_path_factory.mktemp("report")
    out = root / "out"
    tune(quick_spec(model=conv_bn(root / "m.onnx"), shapes="x:1x3x32x32", output=out,
                    seasonings=("fuse-bn-into-conv", "ort-threads", "fp16", "eliminate-noops"),
                    search="exhaustive", max_depth=2))
    return out


def test_tune_writes_every_report_from_the_store(outdir: Path) -> None:
    data = json.loads((outdir / "report.json").read_text())
    assert data == json.loads(json.dumps(build_report(outdir), default=str))
    statuses = {r["route"]: r["status"] for r in data["trials"]}
    assert statuses["base"] == "ok" and statuses["fp16"] == "accuracy-failed"
    fp16 = next(r for r in data["trials"] if r["route"] == "fp16")
    assert "l0 " in fp16["reason"] and "needs <= 0.001" in fp16["reason"]
    assert data["run"]["model"]["sha256"] and data["run"]["machine"]["cpu_flags"] is not None
    assert data["run"]["space"]["size"] == 16 and data["run"]["search"]["strategy"] == \
        "exhaustive"
    effects = {s["seasoning"]: s for s in data["seasonings"]}
    assert effects["ort-threads"]["pairs"] == 8  # 4 routes without it x 2 choices
    assert effects["fp16"]["error_change"] > 0  # FP16 adds error, fuse-bn does not
    for s in data["seasonings"]:  # the spread: min and max over the pairs kept
        low, high = s["latency_ratio_range"]
        assert low <= s["latency_ratio"] <= high and s["error_pairs"] == s["pairs"]
        low, high = s["error_change_range"]
        assert low <= s["error_change"] <= high
    assert effects["fp16"]["error_change_range"][0] > 0  # every pair: FP16 adds error
    assert data["winner"]["route"] == data["run"]["result"]["winner"]
    winner = data["winner"]  # each figure with its own measurement's interval and p50
    assert not {"speedup_ci", "p50_ms", "base_p50_ms"} & set(winner)
    assert winner["speedup_from"] in ("confirmation", "the base route (1.0 by definition)")
    if winner["confirmed"]:
        assert winner["speedup"] == pytest.approx(winner["confirmed"]["speedup"], abs=1e-4)
    if winner["route"] != "base":
        row = next(r for r in data["trials"] if r["route"] == winner["route"])
        assert winner["search"]["speedup_ci"] == row["speedup_ci"]
    md = (outdir / "report.md").read_text()
    assert f"## Winner: `{data['winner']['route']}`" in md and "| `fp16` | accuracy-failed" in md
    fp16 = effects["fp16"]
    low, high = fp16["latency_ratio_range"]
    assert (f"| `fp16` | {fp16['pairs']} | {fp16['latency_ratio']:.3f} | {low:.3f} – "
            f"{high:.3f} |") in md and "min–max" in md
    assert "| validation inputs | " not in md and "- validation inputs: synthesised (seeded, " \
        "uniform in [0, 1)) at x:1x3x32x32" in md


def test_rows_are_the_winner_then_the_accurate_by_speed_then_the_rest(outdir: Path) -> None:
    data = json.loads((outdir / "report.json").read_text())
    rows = data["trials"]
    assert rows[0]["route"] == data["winner"]["route"] == data["run"]["result"]["winner"]
    statuses = [r["status"] for r in rows[1:]]
    accurate = rows[1:1 + statuses.count("ok")]
    assert {r["status"] for r in accurate} == {"ok"}  # all of them before the rest
    speeds = [r["relative_p50"] for r in accurate]
    assert speeds == sorted(speeds)  # fastest first: p50 relative to the base route
    md = (outdir / "report.md").read_text()
    md_routes = [line.split("`")[1] for line in md[md.index("## Trials"):].splitlines()
                 if line.startswith("| `")]
    assert md_routes == [r["route"] for r in rows]  # the Markdown shows the same order


def svg_titles(svg: str) -> dict[str, str]:
    """The hover titles of an inline SVG, by the id of the group they name."""
    root = ET.fromstring(svg)
    return {g.get("id", ""): title.text or "" for g in root.iter("{http://www.w3.org/2000/svg}g")
            for title in g.findall(SVG_TITLE)}


def test_every_chart_point_has_a_hover_title(outdir: Path) -> None:
    data = build_report(outdir)
    measured = [(n, r) for n, r in enumerate(data["trials"], 1) if r["relative_p50"] is not None]
    titles = svg_titles(pareto_chart(data).svg("pareto"))
    assert len(titles) == len(measured) > 10
    for n, r in measured:
        assert titles[f"pt-{n}"].startswith(f"#{n} {r['route']} · {r['status']} · speed-up ")
        assert f"· rel_l2 {r['error']['rel_l2']:.3g}" in titles[f"pt-{n}"]
    accurate = [(n, r) for n, r in measured if r["status"] == "ok"]
    chart = speedup_chart(data)
    assert chart is not None
    titles = svg_titles(chart.svg("speedups"))
    assert list(titles) == [f"ci-{n}" for n, _ in accurate]  # the table's order
    assert titles["ci-1"].startswith(f"#1 {data['winner']['route']} · ok · speed-up ")


def crowded(data: dict[str, Any], extra: int) -> dict[str, Any]:
    """`data` with `extra` accurate rows added, all on the Pareto front, close together.

    The measured rows' latencies are replaced by fixed ones, so how many labels fit does
    not depend on how busy the machine was when the fixture's search timed them.
    """
    data = copy.deepcopy(data)
    for k, r in enumerate(data["trials"]):
        if r["relative_p50"] is not None:
            r["relative_p50"] = 1.0 + 0.01 * k
            r["speedup"] = 1 / r["relative_p50"]
            if data.get("winner") and data["winner"]["route"] == r["route"]:
                data["winner"] = r
    model = next(r for r in data["trials"] if r["status"] == "ok" and r["speedup_ci"])
    for i in range(extra):
        row = copy.deepcopy(model)
        row["route"] = f"fuse-bn-into-conv,ort-threads{{intra_op={i + 3}}},fold-constants"
        row["error"]["rel_l2"] = 1e-7 * (1 + 0.04 * i)
        row["relative_p50"] = 0.9 - 0.004 * i
        row["speedup"] = 1 / row["relative_p50"]
        data["trials"].append(row)
    return data


def test_front_labels_never_overlap_and_the_speedup_chart_shows_the_top(outdir: Path) -> None:
    data = crowded(build_report(outdir), 24)
    chart = pareto_chart(data)
    chart.svg("pareto")  # drawn: the labels' boxes are measured as they are drawn
    ax = chart.figure.axes[0]
    renderer = chart.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert 4 <= len(boxes) == len(chart.labels) < 24  # crowded: some are left out
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1:])
    assert not any(a.overlaps(b) for i, a in enumerate(chart.labels)
                   for b in chart.labels[i + 1:])
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("#") for t in texts)  # crowded out: the row number instead
    assert any(t.startswith("fuse-bn-into-conv,ort-threads{intra_op=") for t in texts)
    assert texts == [t.get_text() for t in pareto_chart(data).figure.axes[0].texts]
    ok = [r for r in data["trials"] if r["status"] == "ok"]
    speedups = speedup_chart(data)
    assert speedups is not None and len(ok) > TOP_SPEEDUPS
    assert len(svg_titles(speedups.svg("speedups"))) == TOP_SPEEDUPS


def test_routes_break_only_between_steps() -> None:
    html = route_html("fp16{op_types_to_exclude=[Softmax,Pow]},fuse-bn-into-conv")
    assert html == ("<code class='route'><span>fp16{op_types_to_exclude=[Softmax,Pow]},"
                    "</span><wbr><span>fuse-bn-into-conv</span></code>")
    assert route_html("base") == "<code class='route'><span>base</span></code>"


def test_report_command_rewrites_them_and_refuses_a_directory_without_a_store(
        outdir: Path, tmp_path: Path) -> None:
    (outdir / "report.html").unlink()
    done = routetune("report", str(outdir))
    assert done.returncode == 0, done.stderr
    assert (outdir / "report.html").stat().st_size > 10_000
    with pytest.raises(UsageError, match="no trials.sqlite here"):
        write_reports(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(outdir, broken)
    (broken / "run.json").write_text("{not json")
    done = routetune("report", str(broken))
    assert done.returncode == 2
    assert done.stderr.startswith(f"routetune: error: {broken / 'run.json'}: not a readable "
                                  "run record")


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=120)


def selftest(page: Path, width: int, height: int = 1400) -> dict[str, Any]:
    """The facts the page records when opened with ``#selftest`` in a `width` px window."""
    dom = chromium("--dump-dom", f"--window-size={width},{height}", f"file://{page}#selftest")
    start = dom.stdout.index('data-selftest="') + len('data-selftest="')
    facts: dict[str, Any] = json.loads(dom.stdout[start:dom.stdout.index('"', start)]
                                       .replace("&quot;", '"').replace("&amp;", "&"))
    assert "Content Security Policy" not in dom.stderr  # nothing tried to load anything
    assert facts["innerWidth"] == width  # --window-size applies to --dump-dom
    return facts


@needs_chromium
@pytest.mark.parametrize("width", [1280, 1920])
def test_the_html_lays_out_sorts_and_renders_the_charts(outdir: Path, width: int) -> None:
    page = (outdir / "report.html").resolve()
    data = json.loads((outdir / "report.json").read_text())
    rows = data["trials"]
    facts = selftest(page, width)
    assert not facts["pageScroll"]  # the page never scrolls sideways; the table box may
    assert facts["first"] == data["winner"]["route"] and facts["order"] == [
        r["route"] for r in rows]
    measured = [r for r in rows if r["relative_p50"] is not None]
    accurate = [r for r in rows if r["status"] == "ok" and r["speedup"] is not None]
    assert facts["paretoTitles"] == len(measured) and facts["speedupTitles"] == len(accurate)
    assert facts["titles"] == len(measured) + len(accurate)
    assert not facts["figuresWrapped"] and not facts["stepsBroken"]
    assert not facts["labelsOverlap"]
    by_p50 = sorted((r for r in rows if r["p50_ms"] is not None), key=lambda r: r["p50_ms"])
    assert facts["sorted"][:len(by_p50)] == [r["route"] for r in by_p50]
    assert facts["svg"] > 20  # the chart's paths are in the DOM

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"report-{width}.png"
    shot.unlink(missing_ok=True)
    chromium(f"--screenshot={shot}", f"--window-size={width},2400", f"file://{page}")
    image = Image.open(shot)
    assert image.size == (width, 2400)
    import numpy as np

    rgb = np.asarray(image.convert("RGB")).astype(int)
    green = int(((rgb[..., 1] > 120) & (rgb[..., 0] < 100) & (rgb[..., 2] < 120)).sum())
    assert green > 200  # the accurate trials' green markers were drawn


@needs_chromium
def test_long_routes_and_reasons_fold_inside_their_cells(outdir: Path, tmp_path: Path) -> None:
    data = build_report(outdir)
    row = copy.deepcopy(next(r for r in data["trials"] if r["status"] == "accuracy-failed"))
    row["route"] = ",".join(["fuse-bn-into-conv", "fold-constants", "ort-threads{intra_op=2}",
                             "fp16{op_types_to_exclude=[Softmax,Pow]}"] * 3)  # 12 steps
    row["reason"] = "y: l0 0.0265808, needs <= 0.001; " + "x" * 300 + " " + "word " * 60
    data["trials"].append(row)
    page = tmp_path / "report.html"
    page.write_text(render_html(data))
    facts = selftest(page, 1280)
    assert not facts["pageScroll"] and not facts["figuresWrapped"]
    assert not facts["stepsBroken"] and facts["routeLines"] >= 3  # folded between steps
    assert facts["reasonLines"] >= 5  # the reason folds, however long its words


def test_print_shows_the_whole_table(outdir: Path) -> None:
    html = (outdir / "report.html").read_text()
    assert "overflow: auto; max-height: 75vh" in html  # on screen: the table's own box
    printed = html[html.index("@media print"):]
    printed = printed[:printed.index("\n}\n")]
    assert ".table-box { max-height: none; overflow: visible;" in printed


@needs_chromium
def test_the_html_fetches_nothing(outdir: Path, tmp_path: Path) -> None:
    page = (outdir / "report.html").resolve()
    probe = tmp_path / "probe.html"  # the same page with one external image added
    probe.write_text(page.read_text().replace(
        "<h1>", '<img src="https://example.com/x.png"><h1>', 1))
    blocked = chromium("--dump-dom", f"file://{probe}")
    assert "violates the following Content Security Policy directive" in blocked.stderr


def test_a_read_only_folder_is_named_as_such(outdir: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="routetune-ro-"))
    try:
        root.chmod(0o755)
        home = root / "home"
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        frozen = root / "out"
        shutil.copytree(outdir, frozen)
        for path in [frozen, *frozen.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        for command in ("report", "show"):
            done = subprocess.run(without_root_rights(sys.executable, "-m", "routetune", command,
                                                  str(frozen)),
                                  capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "HOME": str(home),
                                       "MPLCONFIGDIR": str(home)})
            assert done.returncode == 2, done.stderr
            assert done.stderr.strip().splitlines()[-1] == (
                f"routetune: error: {frozen}: a read-only folder, and SQLite writes its -wal "
                "and -shm files beside trials.sqlite even to read it; make the folder "
                f"writable (chmod u+w {frozen}), or copy it and use the copy")
        assert sorted(p.name for p in frozen.iterdir()) == sorted(
            p.name for p in outdir.iterdir())  # nothing written, nothing lost
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o777)
        shutil.rmtree(root)


def test_a_gpu_trial_shows_its_other_latency_and_device_memory(outdir: Path) -> None:
    from routetune.reporting.report_text import render_markdown

    data = build_report(outdir)
    assert all(r["latency_kind"] == "device" and r["other_p50_ms"] is None
               for r in data["trials"])  # a CPU engine: one figure
    assert "| route | status | p50 ms |" in render_markdown(data)
    row = next(r for r in data["trials"] if r["route"] == "base")
    row.update(other_p50_ms=7.609, device_memory_bytes=512 << 20)  # as a GPU trial records
    text = render_markdown(data)
    assert "| route | status | device p50 ms |" in text and "host-to-host p50 ms" in text
    line = next(x for x in text.splitlines() if x.startswith("| `base`"))
    assert "| 7.609 | 512 |" in line
    assert "host to host p50 7.609 ms; device memory 512 MiB" in render_html(data)


def test_report_json_holds_every_measured_metric_per_output(outdir: Path) -> None:
    data = build_report(outdir)
    base = next(r for r in data["trials"] if r["route"] == "base")
    metrics = base["accuracy"]["y"]
    assert {"rel_l2", "cos", "l0"} <= set(metrics)
    assert "top1" in metrics and metrics["top1"] == 1.0  # task metrics measured too
    fused = next(r for r in data["trials"] if r["route"] == "fuse-bn-into-conv")
    assert fused["passes"][0]["step"] == "fuse-bn-into-conv" and fused["passes"][0]["modified"]


def test_a_seasonings_latency_ratio_is_a_median_that_one_outlier_cannot_carry() -> None:
    """fold-constants at 0.906x in two pairs and 183.9x in one (a trial timed while its
    base was disturbed): the arithmetic mean said 61.9x (issue 39, kind 8)."""
    from routetune.records.trial import Trial
    from routetune.reporting.report import seasoning_effects
    from routetune.timing.measure import Latency

    def timed(route: str, p50: float) -> Trial:
        return Trial(route, "m", route, "onnxruntime", "cpu", "s", "ok",
                     latency=Latency(10, p50, p50, p50, p50, p50, p50),
                     base_latency=Latency(10, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0))

    trials = [timed("base", 1.0), timed("fp16", 1.0), timed("ort-threads", 1.0),
              timed("fuse-bn-into-conv", 1.0), timed("fold-constants", 0.906),
              timed("fold-constants,fp16", 0.906),
              timed("fold-constants,ort-threads", 183.9)]
    effect = next(e for e in seasoning_effects(trials) if e["seasoning"] == "fold-constants")
    assert effect["pairs"] == 3 and effect["latency_ratio_range"] == [0.906, 183.9]
    assert effect["latency_ratio"] == pytest.approx(0.906)  # the outlier does not carry it
    two = [t for t in trials if t.route != "fold-constants,fp16"]
    effect = next(e for e in seasoning_effects(two) if e["seasoning"] == "fold-constants")
    assert effect["latency_ratio"] == pytest.approx((0.906 * 183.9) ** 0.5)  # middle two


def test_one_outlier_puts_the_pareto_latency_axis_on_a_log_scale(outdir: Path) -> None:
    """A 183.9x trial (timed while its base was disturbed) squeezed every useful point
    into one line on a linear axis (issue 39, kind 8)."""
    data = crowded(build_report(outdir), 0)
    assert pareto_chart(data).figure.axes[0].get_yscale() == "linear"
    slow = next(r for r in data["trials"] if r["relative_p50"] is not None
                and r["route"] != "base")
    slow["relative_p50"] = 183.9
    ax = pareto_chart(data).figure.axes[0]
    assert ax.get_yscale() == "log" and "(log scale)" in ax.get_ylabel()


def test_the_html_trial_table_has_a_column_for_the_metric_the_verdict_used(
        outdir: Path) -> None:
    """report.md showed the verdict's task metric and report.html did not (issue 39,
    kind 8)."""
    data = build_report(outdir)
    assert "<th>top1</th>" not in render_html(data)  # rel-L2: its column is there already
    data["run"]["headline"] = ["top1", True]
    page = render_html(data)
    assert "<th>top1</th>" in page
    base = page.split("<tbody>")[-1].split("</tr>")[0]  # the winner's row first
    assert "<td data-v='1' class='num'>1</td>" in base


def test_routes_listed_in_a_line_are_quoted_so_their_own_commas_read_apart(
        outdir: Path) -> None:
    from routetune.reporting.report_text import conditions_text, environment

    data = build_report(outdir)
    run = {**data["run"], "pinned": ["fold-constants,ort-no-spinning", "fp16"],
           "conditions": {**data["run"]["conditions"], "noisy": 2, "measured": 9,
                          "noisy_routes": ["fold-constants,ort-no-spinning", "fp16"]}}
    assert environment(run)["pinned routes"] == "'fold-constants,ort-no-spinning', 'fp16'"
    assert ": 'fold-constants,ort-no-spinning', 'fp16'; waited" in conditions_text(run)
