"""``run.json``: what a tuning run was asked to do, and what it decided.

The trial store holds trials; this file holds the rest that a report needs: the
environment (versions, device, CPU flags, model hash), the route space and the search
settings, and at the end the winner with its side-by-side measurement. Written at the
start of a run and again at its end (atomically, by replace).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import routetune
from routetune.errors import UsageError

if TYPE_CHECKING:
    from routetune.tune import Prepared, TuneOptions, TuneResult

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


def start_record(run: Prepared, opts: TuneOptions, versions: dict[str, str]) -> dict[str, Any]:
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
        "profile": str(run.profile or ""),
        "space": {"size": run.space.size(), "max_depth": run.space.max_depth,
                  "seasonings": {n: [p.name + "=" + "|".join(map(str, p.choices))
                                     for p in i.params] for n, i in run.space.infos.items()},
                  "not_applicable": dict(run.not_applicable)},
        "search": {"strategy": opts.search, "beam_width": opts.beam_width,
                   "max_trials": opts.max_trials, "time_budget_s": opts.time_budget_s},
        "measure": asdict(opts.measure),
        "base_pipeline": [p["step"] for p in run.base_passes],
    }


def finish_record(record: dict[str, Any], result: TuneResult) -> dict[str, Any]:
    """The record with the run's outcome added."""
    out = dict(record)
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out["result"] = {"winner": result.winner.route, "reason": result.winner_reason,
                     "status": result.winner.status, "speedup": result.winner_speedup,
                     "stopped": result.stopped,
                     "side_by_side_ms": {"base": asdict(result.side_by_side[0]),
                                         "best": asdict(result.side_by_side[1])}
                     if result.side_by_side else None}
    return out


def write(outdir: Path, record: dict[str, Any]) -> Path:
    """Write ``run.json`` atomically; return its path."""
    path = outdir / FILENAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def read(outdir: Path) -> dict[str, Any]:
    """Read ``run.json``; an empty record when there is none (a store from an older run).

    Raises:
        UsageError: The file is not JSON, or not a run record.
    """
    path = outdir / FILENAME
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable run record ({e}); delete it, or run "
                         "`routetune tune` again to rewrite it") from e
    if not isinstance(record, dict) or not isinstance(record.get("model", {}), dict):
        raise UsageError(f"{path}: not a routetune run record; delete it, or run "
                         "`routetune tune` again to rewrite it")
    return record
