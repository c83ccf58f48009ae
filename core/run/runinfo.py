"""``run.json``: what a tuning run was asked to do, and what it decided.

The trial store holds trials; this file holds the rest that a report needs: the
environment (versions, device, CPU flags, model hash), the route space and the search
settings, and at the end the winner with its confirmation, and the machine's
conditions (noisy trials, time waited for a quiet machine). Written at the start of a
run and again at its end (atomically, by replace).

A run in a folder that holds another run's record (another search space or strategy,
constraint, inputs or pinned routes: ``tune --recipe winner.toml`` re-measuring a
winner, say) writes its records (``run.json``, the reports and the winner files) into
``runs/<UTC time>/`` instead (`record_dir`), so that the original run's stay as they
were. Running the same command again (a resume) updates the folder's own.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import routetune
from routetune.errors import UsageError, one_line
from routetune.run.option_schema import values_of

if TYPE_CHECKING:
    from routetune.run.preparation import Prepared
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import TuneResult

FILENAME = "run.json"
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
             "asimd", "asimdhp", "sve")
"""CPU feature flags worth reporting: the ones ONNX Runtime's MLAS kernels dispatch on."""


def cpu_flags() -> list[str]:
    """The `CPU_FLAGS` this CPU has, from ``/proc/cpuinfo`` (empty where unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


def start_record(run: Prepared, opts: RunSpec, versions: dict[str, str]) -> dict[str, Any]:
    """The record of a run about to start."""
    return {
        "routetune": routetune.__version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"source": str(run.model.source), "sha256": run.model.source_sha256,
                  "inputs": [str(s) for s in run.model.inputs],
                  "outputs": [str(s) for s in run.model.outputs]},
        "given": {k: str(v) for k, v in run.source.items()},
        "backend": {"name": run.backend.name, "version": run.backend.version(),
                    "device": run.backend.device(), "versions": versions,
                    "options": dict(run.backend_options)},
        "pinned": [str(r) for r in run.pinned],
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpu_flags": cpu_flags(), "python": platform.python_version()},
        "settings_hash": run.settings_hash,
        "accuracy": run.constraint.text,
        "headline": list(run.constraint.headline(run.registry)),
        "profile": str(run.profile or ""),
        "space": {"size": run.space.size(), "max_depth": run.space.max_depth,
                  "seasonings": {n: [p.name + "=" + "|".join(map(str, p.choices))
                                     for p in i.params] for n, i in run.space.infos.items()},
                  "not_applicable": dict(run.not_applicable)},
        "search": {"strategy": opts.search, "options": values_of(run.strategy_options),
                   "max_trials": opts.max_trials, "time_budget_s": run.time_budget_s},
        "measure": asdict(opts.measure),
        "verdict": {"min_speedup": opts.min_speedup, "busy_machine": opts.busy_machine,
                    "confirm_repeats": opts.confirm_repeats},
        "conditions_at_start": machine_now(),
        "base_pipeline": [p["step"] for p in run.base_passes],
    }


def finish_record(record: dict[str, Any], result: TuneResult) -> dict[str, Any]:
    """The record with the run's outcome added."""
    out = dict(record)
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    from routetune.run.winner import verdict_figures

    measured = [t for t in result.trials if t.latency is not None]
    out["result"] = {"winner": result.winner.route, "reason": result.winner_reason,
                     "status": result.winner.status, "stopped": result.stopped,
                     **verdict_figures(result),
                     "confirmations": [
                         {"route": c.route, "search_speedup": next(
                             (t.speedup for t in result.trials if t.route == c.route), None),
                          "latency_ms": asdict(c.latency), "base_latency_ms": asdict(
                              c.base_latency), "paired": asdict(c.paired),
                          "repeats": [asdict(r) for r in c.repeats],
                          "conditions": dict(c.conditions)} for c in result.confirmations]}
    out["conditions"] = {
        "busy_machine": result.busy_machine, "measured": len(measured),
        "noisy": len(result.noisy), "noisy_routes": [t.route for t in result.noisy],
        "waited_s": round(result.waited_s, 1),
        "foreign_cores_max": max((t.conditions.get("foreign_cores", 0.0) for t in measured),
                                 default=None),
        "steal_pct_max": max((t.conditions.get("steal_pct", 0.0) for t in measured),
                             default=None),
        "at_end": machine_now()}
    return out


def machine_now() -> dict[str, Any]:
    """The load averages and CPU count now (``/proc/loadavg``)."""
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    return {"loadavg": [float(x) for x in load], "cpus": os.cpu_count()}


SAME_RUN = ("settings_hash", "accuracy", "profile", "pinned", "space", "search.strategy",
            "search.options", "backend.name", "backend.options", "model.sha256")
"""The fields of two records that must agree for them to be one run (a resume)."""


def _field(record: dict[str, Any], name: str) -> Any:
    for part in name.split("."):
        record = record.get(part, {}) if isinstance(record, dict) else {}
    return record


def record_dir(outdir: Path, record: dict[str, Any]) -> Path:
    """Where this run writes its records: `outdir`, or ``runs/<UTC time>/`` in it.

    The folder's own when it holds no run record or one of the same run (`SAME_RUN`);
    else the dated folder of an earlier run that was the same run (a repeated command
    resumes there); otherwise a new dated folder, so that another run's record is never
    overwritten.
    """
    try:
        old = read(outdir)
    except UsageError:
        old = {}
    if not old or all(_field(old, k) == _field(record, k) for k in SAME_RUN):
        return outdir
    runs = outdir / "runs"
    for folder in sorted(runs.iterdir()) if runs.is_dir() else ():
        if folder.is_symlink() or not folder.is_dir():
            continue
        try:  # the same run as one recorded there already: its folder, not a new one
            if all(_field(read(folder), k) == _field(record, k) for k in SAME_RUN):
                return folder
        except UsageError:
            continue
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = outdir / "runs" / stamp
    n = 1
    while path.exists():
        n += 1
        path = outdir / "runs" / f"{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def write(outdir: Path, record: dict[str, Any]) -> Path:
    """Write ``run.json`` atomically (`replace_text`); return its path."""
    path = outdir / FILENAME
    replace_text(path, json.dumps(record, indent=1, default=str) + "\n")
    return path


def replace_text(path: Path, text: str) -> None:
    """Write `text` as `path`, atomically: into a new file beside it, then renamed over it.

    The new file has a fresh name (``tempfile.mkstemp``), so a link planted in a
    results folder (``report.html`` pointing elsewhere) is replaced, never written
    through.

    Raises:
        UsageError: The folder or `path` cannot be written (`path` is a folder, say).
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UsageError(f"{path}: cannot write ({e.strerror}); check the folder") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write ({e.strerror}); move it away") from e


def read(outdir: Path) -> dict[str, Any]:
    """Read ``run.json``; an empty record when there is none (a store from an older run).

    Raises:
        UsageError: The file is not JSON, or not a run record.
    """
    path = outdir / FILENAME
    if not path.exists():
        return {}
    if not path.is_file():  # a FIFO or a device: reading it never ends
        raise UsageError(f"{path}: not a regular file; delete it, or run `routetune tune` "
                         "again to rewrite it")
    try:
        record = json.loads(path.read_text())
    except RecursionError as e:  # json recurses per nested array or object
        raise UsageError(f"{path}: not a readable run record (nested too deeply); delete "
                         "it, or run `routetune tune` again to rewrite it") from e
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable run record ({one_line(e)}); delete it, or "
                         "run `routetune tune` again to rewrite it") from e
    if not isinstance(record, dict) or not isinstance(record.get("model", {}), dict):
        raise UsageError(f"{path}: not a routetune run record; delete it, or run "
                         "`routetune tune` again to rewrite it")
    return record
