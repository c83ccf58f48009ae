"""Route recipes: TOML files that name a model, a backend, a route and a constraint.

Schema version 1 (``schema_version = 1``) has these tables:

- ``[model]``: ``path`` (an ONNX file) or ``example`` (a bundled example name),
  and ``sha256`` of the file;
- ``[backend]``: ``name`` and ``version``;
- ``[route]``: ``text``, the canonical route text (see `routetune.route`);
- ``[accuracy]``: ``expr``, the ``--accuracy`` expression;
- ``[inputs]``: ``shapes`` (trtexec spelling) or ``path`` (``.npz`` file or folder);
- ``[result]``: what the search measured: ``status``, ``reason``, ``p50_ms``,
  ``speedup`` over the base route (measured side by side after the search), ``device``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

if TYPE_CHECKING:
    from routetune.tune import Prepared, TuneResult

SCHEMA_VERSION = 1


def write_winner_recipe(path: Path, run: Prepared, result: TuneResult) -> Path:
    """Write the winning route as a recipe that pins it exactly.

    Returns:
        `path`.
    """
    winner = result.winner
    model = {"sha256": run.model.source_sha256}
    model.update({k: v for k, v in run.source.items() if k in ("path", "example")})
    inputs = {k: v for k, v in run.source.items() if k in ("shapes",)}
    if "inputs" in run.source:
        inputs["path"] = run.source["inputs"]
    measured: dict[str, object] = {"status": winner.status, "reason": result.winner_reason,
                                   "device": winner.device,
                                   "speedup": round(result.winner_speedup, 4)}
    if winner.latency:
        measured["p50_ms"] = round(winner.latency.p50, 4)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "backend": {"name": run.backend.name, "version": run.backend.version()},
        "route": {"text": winner.route},
        "accuracy": {"expr": run.constraint.text},
        "inputs": inputs,
        "result": measured,
    }
    path.write_text(tomli_w.dumps(doc))
    return path
