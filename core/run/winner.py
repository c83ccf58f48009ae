"""The winner's files in a run's record folder.

``winner.onnx``, ``winner.json`` (route, settings and figures), ``winner.toml`` (a
recipe) and the winner's outputs (``winner_outputs.npz``), which ``routetune build``
checks a rebuilt engine against.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from routetune.candidate.artifacts import matches_record
from routetune.errors import StorageError
from routetune.judging.accuracy import judged
from routetune.model.weights import copy_model, save_standalone
from routetune.run.recipe import write_winner_recipe

if TYPE_CHECKING:
    from routetune.judging.constraint import Constraint
    from routetune.run.preparation import Prepared
    from routetune.run.run_spec import RunSpec
    from routetune.run.tuning import TuneResult


WINNER_OUTPUTS = "winner_outputs.npz"
"""The winner's outputs on the validation inputs (``<set>/<output name>`` keys), for
``routetune build`` to compare a rebuilt engine with: the outputs its accuracy
constraint reads (a decoder's KV cache only where a bound names it)."""


def save_outputs(path: Path, outputs: Sequence[Mapping[str, np.ndarray]] | None,
                 constraint: Constraint) -> None:
    """Write outputs, one mapping per input set, as ``.npz`` (keys ``<set>/<name>``).

    A decoder's cache outputs are left out unless a bound reads them
    (`routetune.judging.accuracy.judged`): 1.36 GB for 128 decode steps of
    ``benchmarks/decoder.py``'s 10.8 M decoder with them, 163 KB without. ``routetune
    build`` compares the outputs stored here, so a rebuilt engine is judged on the same
    names.
    """
    if outputs is None:
        return
    arrays: dict[str, Any] = {f"{i}/{name}": array for i, out in enumerate(outputs)
                              for name, array in judged(out, constraint).items()}
    np.savez(path, **arrays)


def load_outputs(path: Path) -> list[dict[str, np.ndarray]]:
    """Read what `save_outputs` wrote."""
    with np.load(path, allow_pickle=False) as data:
        sets: dict[int, dict[str, np.ndarray]] = {}
        for key in data.files:
            i, name = key.split("/", 1)
            sets.setdefault(int(i), {})[name] = data[key]
    return [sets[i] for i in sorted(sets)]


def write_winner(run: Prepared, result: TuneResult, opts: RunSpec, records: Path
                  ) -> dict[str, Path]:
    """Write ``winner.onnx``, ``winner.json`` and ``winner.toml`` into `records`.

    ``winner.json``'s ``stopped`` says why the search ended before its course (the
    budget, or an interrupt: the best so far, not the search's verdict), or is null.
    """
    winner, reason = result.winner, result.winner_reason
    model_path = records / "winner.onnx"
    if winner.artifact:  # with external data: winner.onnx and one winner.onnx.data
        source = run.outdir / winner.artifact
        if not matches_record(source, winner.settings, winner.candidate_sha256):
            raise StorageError(f"{source}: not the candidate model the trial store recorded "
                               f"for the winner '{winner.route}' (changed on disk); "
                               "tune again with --fresh")
        copy_model(source, model_path)
    else:
        save_standalone(run.model.proto, run.model.weights, model_path)
    settings = {
        "route": winner.route,
        "backend": run.backend.name,
        "backend_version": run.backend.version(),
        "settings": dict(winner.settings) or run.backend.full_settings(run.backend_options),
        "status": winner.status,
        "reason": reason,
        "stopped": result.stopped,
        "settings_hash": run.settings_hash,
        **verdict_figures(result),
    }
    settings_path = records / "winner.json"
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
    recipe = write_winner_recipe(records / "winner.toml", run, result, opts)
    return {"model": model_path, "settings": settings_path, "recipe": recipe}


def verdict_figures(result: TuneResult) -> dict[str, Any]:
    """The winner's figures, each labelled by where it was measured.

    ``speedup`` and ``confirmed`` come from the confirmation (fresh processes, paired
    blocks; ``repeats``: each process's estimate and interval); ``search`` from the
    search's own trial. They are never mixed: a p50 of
    one with the speed-up of the other would describe no single measurement.
    """
    winner, confirmed = result.winner, result.confirmed
    search = None
    if winner.latency is not None:
        search = {"p50_ms": winner.latency.p50, "base_p50_ms": (
            winner.base_latency.p50 if winner.base_latency else None),
            "speedup": winner.speedup, "speedup_ci": (
                [winner.paired.ci_low, winner.paired.ci_high] if winner.paired else None),
            "noisy": winner.noisy}
    out: dict[str, Any] = {"speedup": round(result.winner_speedup, 4), "search": search,
                           "confirmed": None}
    if confirmed is not None:
        p = confirmed.paired
        out["confirmed"] = {"p50_ms": confirmed.latency.p50,
                            "base_p50_ms": confirmed.base_latency.p50,
                            "speedup": p.value, "speedup_ci": [p.ci_low, p.ci_high],
                            "pairs": p.pairs, "drift": p.drift,
                            "repeats": [[r.value, r.ci_low, r.ci_high]
                                        for r in confirmed.repeats],
                            "busy": confirmed.conditions.get("busy", "")}
    return out
