"""Reports from a real search's trial store, and the HTML in a real headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from graphs import conv_bn
from PIL import Image

from routetune.errors import UsageError
from routetune.measure import MeasureSettings
from routetune.reporting.report import build_report, write_reports
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no chromium here (apt-get install chromium)")


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished exhaustive search over four seasonings on a Conv+BN model."""
    root = tmp_path_factory.mktemp("report")
    out = root / "out"
    tune(RunSpec(model=conv_bn(root / "m.onnx"), shapes="x:1x3x32x32", output=out,
                 seasonings=("fuse-bn-into-conv", "ort-threads", "fp16",
                                 "fold-constants"),
                     search="exhaustive", max_depth=2,
                     measure=MeasureSettings(min_runs=5, min_time_s=0.05)))
    return out


def test_tune_writes_every_report_from_the_store(outdir: Path) -> None:
    data = json.loads((outdir / "report.json").read_text())
    assert data == json.loads(json.dumps(build_report(outdir), default=str))
    statuses = {r["route"]: r["status"] for r in data["trials"]}
    assert statuses["base"] == "ok" and statuses["fp16"] == "accuracy-failed"
    fp16 = next(r for r in data["trials"] if r["route"] == "fp16")
    assert "l0 " in fp16["reason"] and "needs <= 0.001" in fp16["reason"]
    assert data["run"]["model"]["sha256"] and data["run"]["machine"]["cpu_flags"] is not None
    assert data["run"]["space"]["size"] == 15 and data["run"]["search"]["strategy"] == \
        "exhaustive"
    effects = {s["seasoning"]: s for s in data["seasonings"]}
    assert effects["ort-threads"]["pairs"] == 8  # 4 routes without it x 2 choices
    assert effects["fp16"]["error_change"] > 0  # FP16 adds error, fuse-bn does not
    assert data["winner"]["route"] == data["run"]["result"]["winner"]
    md = (outdir / "report.md").read_text()
    assert f"## Winner: `{data['winner']['route']}`" in md and "| `fp16` | accuracy-failed" in md
    assert "| validation inputs | " not in md and "- validation inputs: synthesised (seeded, " \
        "uniform in [0, 1)) at x:1x3x32x32" in md


def test_report_command_rewrites_them_and_refuses_a_directory_without_a_store(
        outdir: Path, tmp_path: Path) -> None:
    (outdir / "report.html").unlink()
    done = subprocess.run(["routetune", "report", str(outdir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert (outdir / "report.html").stat().st_size > 10_000
    with pytest.raises(UsageError, match="no trials.sqlite here"):
        write_reports(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(outdir, broken)
    (broken / "run.json").write_text("{not json")
    done = subprocess.run(["routetune", "report", str(broken)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"routetune: error: {broken / 'run.json'}: not a readable "
                                  "run record")


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=120)


@needs_chromium
def test_the_html_sorts_renders_the_chart_and_fetches_nothing(outdir: Path,
                                                               tmp_path: Path) -> None:
    page = (outdir / "report.html").resolve()
    dom = chromium("--dump-dom", f"file://{page}#selftest")
    start = dom.stdout.index('data-selftest="') + len('data-selftest="')
    selftest = json.loads(dom.stdout[start:dom.stdout.index('"', start)].replace("&quot;", '"'))
    rows = json.loads((outdir / "report.json").read_text())["trials"]
    by_p50 = sorted((r for r in rows if r["p50_ms"] is not None), key=lambda r: r["p50_ms"])
    assert selftest["sorted"][:len(by_p50)] == [r["route"] for r in by_p50]
    assert selftest["svg"] > 20  # the chart's paths are in the DOM
    assert "Content Security Policy" not in dom.stderr  # nothing tried to load anything

    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1200,1400", f"file://{page}")
    import numpy as np

    rgb = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    green = int(((rgb[..., 1] > 120) & (rgb[..., 0] < 100) & (rgb[..., 2] < 120)).sum())
    assert green > 200  # the accurate trials' green markers were drawn

    probe = tmp_path / "probe.html"  # the same page with one external image added
    probe.write_text(page.read_text().replace(
        "<h1>", '<img src="https://example.com/x.png"><h1>', 1))
    blocked = chromium("--dump-dom", f"file://{probe}")
    assert "violates the following Content Security Policy directive" in blocked.stderr
