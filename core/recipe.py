"""Route recipes: TOML files that name a model, a backend, a route and a constraint.

Schema version 1 (``schema_version = 1``) has these tables:

- ``[model]``: ``path`` (an ONNX file) or ``example`` (a bundled example name),
  and ``sha256`` of the file;
- ``[backend]``: ``name`` and ``version``;
- ``[route]``: ``text``, the canonical route text (see `routetune.route`);
- ``[accuracy]``: ``expr``, the ``--accuracy`` expression;
- ``[inputs]``: ``shapes`` (trtexec spelling) or ``path`` (``.npz`` file or folder);
- ``[result]``: what the search measured: ``status``, ``reason``, ``p50_ms``,
  ``speedup`` over the base route, ``device``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from routetune.store import Trial

if TYPE_CHECKING:
    from routetune.tune import Prepared, TuneOptions

SCHEMA_VERSION = 1


def write_winner_recipe(
    path: Path, run: Prepared, opts: TuneOptions, winner: Trial, reason: str
) -> Path:
    """Write the winning route as a recipe that pins it exactly.

    Returns:
        `path`.
    """
    model = {"sha256": run.model.source_sha256}
    model.update({k: v for k, v in run.source.items() if k in ("path", "example")})
    inputs = {k: v for k, v in run.source.items() if k in ("shapes",)}
    if "inputs" in run.source:
        inputs["path"] = run.source["inputs"]
    result: dict[str, object] = {"status": winner.status, "reason": reason,
                                 "device": winner.device}
    if winner.latency:
        result["p50_ms"] = round(winner.latency.p50, 4)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "backend": {"name": run.backend.name, "version": run.backend.version()},
        "route": {"text": winner.route},
        "accuracy": {"expr": run.constraint.text},
        "inputs": inputs,
        "result": result,
    }
    path.write_text(tomli_w.dumps(doc))
    return path
