"""What a tuning run writes in ``run.json``: what it was asked to do, and what it decided.

The trial store holds trials; ``run.json`` holds the rest that a report needs: the
environment (versions, device, CPU flags, model hash), the route space and the search
settings, and at the end the winner with its confirmation, and the machine's
conditions (noisy trials, time waited for a quiet machine). Written at the start of a
run and again at its end (`routetune.records.run_record` reads, writes and places it).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import routetune
from routetune.libraries import records
from routetune.options import values_of

if TYPE_CHECKING:
    from routetune.run.preparation import Prepared
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import TuneResult

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


def start_record(run: Prepared, opts: RunSpec, versions: dict[str, str],
                 memory: dict[str, Any]) -> dict[str, Any]:
    """The record of a run about to start.

    `memory` is the route memory's part (`routetune.run.route_memory.MemoryUse.record`).
    """
    return {
        "routetune": routetune.__version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"source": str(run.model.source), "sha256": run.model.source_sha256,
                  "inputs": [str(s) for s in run.model.inputs],
                  "outputs": [str(s) for s in run.model.outputs],
                  "prepared": list(run.model.changes)},
        "given": {k: str(v) for k, v in run.source.items()},
        "phase": run.phase,
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
                   "max_trials": opts.max_trials, "time_budget_s": run.time_budget_s,
                   "memory": memory},
        "measure": asdict(run.spec.measure),
        "verdict": {"min_speedup": opts.min_speedup, "busy_machine": opts.busy_machine,
                    "confirm_repeats": opts.confirm_repeats},
        "conditions_at_start": machine_now(),
        "base_pipeline": [p["step"] for p in run.base_passes],
        "libraries": records(run.libraries),
        "reference": ({"source": "file", **run.saved_reference.record()}
                      if run.saved_reference is not None else
                      {"source": "run", "backend": run.registry.reference_backend().name}),
    }


def finish_record(record: dict[str, Any], result: TuneResult) -> dict[str, Any]:
    """The record with the run's outcome added."""
    out = dict(record)
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    from routetune.run.winner import verdict_figures

    measured = [t for t in result.trials if t.latency is not None]
    out["result"] = {"winner": result.winner.route, "reason": result.winner_reason,
                     "status": result.winner.status, "stopped": result.stopped,
                     "planned_trials": result.planned,
                     "untried_seasonings": list(result.untried),
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
        "search_and_confirmation_s": round(result.elapsed_s, 1),
        "out_of_race": sum(t.raced is not None for t in result.trials
                           if t.fingerprint in result.fresh),
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
