"""Conformance: every built-in graph and precision pass over the ONNX project's node tests.

Usage:

    python benchmarks/conformance.py [--out DIR] [--results DIR] [--sample N --seed S]
                                     [--only NAME,NAME] [--routes R,R]

The ONNX project ships a test case for every operator
(``onnx.backend.test.case.node.collect_testcases()``: one-operator models, some written
as functions, each with inputs and expected outputs). For each test this script writes
the model and its input sets (``.npz``, strings as NumPy ``str`` arrays) and runs what
``routetune build MODEL --route R --inputs DIR`` runs (`routetune.rebuild.rebuild`, in
this process), for every graph and precision seasoning that ONNX Runtime's CPU provider
offers. Each (test, route) is classified:

- ``ok``: built, and its outputs match the FP32 reference under the default constraint;
- ``tolerance-miss``: a precision route whose outputs do not (allowed);
- ``wrong-output``: an exact pass whose outputs do not (a defect);
- ``refused``: the pass or the backend declined, in one line (the reason is kept);
- ``invalid-model``: the pass wrote a model the ONNX checker, or its own contract,
  rejects (a defect, even though routetune caught it);
- ``traceback``: anything else that escaped (a defect);
- ``skipped``: the original model cannot run here (ONNX Runtime refuses it), or its
  inputs cannot be given as ``.npz`` (sequences, optionals); the reason is kept.

Targets (issue 21): 0 ``wrong-output``, 0 ``invalid-model``, 0 ``traceback``.
Rows go to ``RESULTS/conformance.json``, counts to ``RESULTS/conformance.md``.
``--sample N`` takes a seeded random sample of N tests (the CI run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROUTES = {"eliminate-noops": "exact", "fold-constants": "exact",
          "fuse-bn-into-conv": "exact", "fp16": "precision", "int8-qdq": "precision"}
"""The graph and precision seasonings ONNX Runtime's CPU provider offers, and their kind
(fp8-qdq and bf16 need kernels this provider lacks; fold-if and int32-limits are
TensorRT's)."""

DEFECTS = ("wrong-output", "invalid-model", "traceback")


@dataclass
class Row:
    """One (test, route) and what became of it."""

    test: str
    route: str
    outcome: str
    reason: str = ""
    seconds: float = 0.0


def node_tests(only: set[str] | None = None) -> list[Any]:
    """The node tests of the installed onnx, sorted by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # test generators divide by zero on purpose
        cases = collect_testcases()
    return sorted((c for c in cases if only is None or c.name in only), key=lambda c: c.name)


def write_case(case: Any, folder: Path) -> str:
    """Write ``model.onnx`` and ``inputs/<i>.npz``; a skip reason, or "" when written."""
    model: onnx.ModelProto = case.model
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    folder.mkdir(parents=True, exist_ok=True)
    inputs = folder / "inputs"
    inputs.mkdir(exist_ok=True)
    for i, (values, _) in enumerate(case.data_sets or []):
        arrays = {}
        for name, value in zip(names, values, strict=False):
            if not isinstance(value, np.ndarray):
                return (f"input '{name}' is a {type(value).__name__} (a sequence or "
                        "optional); --inputs takes tensors")
            arrays[name] = value.astype(str) if value.dtype == object else value
        np.savez(inputs / f"{i}.npz", **arrays)
    if not case.data_sets:
        return "the test has no input sets"
    onnx.save(model, folder / "model.onnx")
    return ""


def run_route(folder: Path, route: str, registry: Any) -> Row:
    """`routetune build` of one route on one written test, classified."""
    from routetune.errors import (
        PostconditionError,
        RoutetuneError,
        SeasoningError,
        UsageError,
    )
    from routetune.rebuild import rebuild
    from routetune.tune import TuneOptions

    opts = TuneOptions(model=folder / "model.onnx", inputs=folder / "inputs",
                       output=folder / "out")
    t0 = time.perf_counter()
    row = Row(folder.name, route, "ok")
    try:
        done = rebuild(opts, route, registry)
    except PostconditionError as e:
        row.outcome, row.reason = "invalid-model", str(e)
    except SeasoningError as e:
        row.outcome, row.reason = "refused", str(e)
    except UsageError as e:
        text = str(e)
        original = "FP32 reference" in text or "ONNX checker rejects the model" in text
        row.outcome = "skipped" if original else "refused"
        row.reason = text
    except RoutetuneError as e:
        row.outcome, row.reason = "refused", str(e)
    except Exception:  # noqa: BLE001 - that is what is counted
        row.outcome = "traceback"
        row.reason = traceback.format_exc(limit=-3).strip().replace("\n", " | ")[-600:]
    else:
        if done.broken:
            row.outcome, row.reason = "invalid-model", done.broken
        elif done.failed:
            row.outcome, row.reason = "refused", done.failed
        elif done.verdict is None:
            row.outcome, row.reason = "refused", done.not_run
        elif not done.verdict.passed:
            row.outcome = "wrong-output" if ROUTES[route] == "exact" else "tolerance-miss"
            row.reason = done.verdict.reason
    row.seconds = round(time.perf_counter() - t0, 3)
    if "\n" in row.reason and row.outcome in ("refused", "skipped"):
        row.outcome, row.reason = "traceback", "a refusal of several lines: " + row.reason
    return row


def summary(rows: list[Row], tests: int, skipped: dict[str, str], wall_s: float) -> str:
    """The Markdown counts: per route and outcome, and the defects listed."""
    outcomes = ["ok", "tolerance-miss", "refused", "skipped", *DEFECTS]
    lines = [f"{tests} node tests ({len(skipped)} not writable as .npz inputs), "
             f"{len(rows)} (test, route) runs, {wall_s:.0f} s.", "",
             "| route | " + " | ".join(outcomes) + " | applied and within tolerance |",
             "|---" * (len(outcomes) + 2) + "|"]
    for route in ROUTES:
        mine = [r for r in rows if r.route == route]
        counts = Counter(r.outcome for r in mine)
        ran = len(mine) - counts["skipped"]
        share = f"{counts['ok'] / ran:.1%}" if ran else "-"
        lines.append(f"| {route} | " + " | ".join(str(counts[o]) for o in outcomes)
                     + f" | {share} of {ran} |")
    defects = [r for r in rows if r.outcome in DEFECTS]
    lines += ["", f"Defects: {len(defects)}."]
    lines += [f"- `{r.test}` `{r.route}` {r.outcome}: {r.reason[:300]}" for r in defects[:200]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("conformance-work"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--sample", type=int, default=None, help="a seeded sample of N tests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated test names")
    parser.add_argument("--routes", default=",".join(ROUTES))
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    routes = args.routes.split(",")
    unknown = set(routes) - set(ROUTES)
    if unknown:
        parser.error(f"--routes: unknown {sorted(unknown)}; known: {', '.join(ROUTES)}")
    from routetune.plugin_manager import load_registry

    logging.disable(logging.WARNING)  # the libraries' warnings go nowhere; rows keep reasons
    registry = load_registry()
    t0 = time.perf_counter()
    cases = node_tests(only)
    if args.sample is not None:
        cases = sorted(random.Random(args.seed).sample(cases, min(args.sample, len(cases))),
                       key=lambda c: c.name)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    for n, case in enumerate(cases, 1):
        folder = args.out / case.name
        why = write_case(case, folder)
        if why:
            skipped[case.name] = why
            continue
        for route in routes:
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                row = run_route(folder, route, registry)
            rows.append(row)
            if row.outcome in DEFECTS:
                print(f"[{n}/{len(cases)}] {row.test} {route}: {row.outcome}: "
                      f"{row.reason[:200]}", file=sys.stderr)
    wall = time.perf_counter() - t0
    text = summary(rows, len(cases), skipped, wall)
    print(text)
    if args.results is not None:
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "conformance.json").write_text(json.dumps({
            "onnx": onnx.__version__, "tests": len(cases), "wall_s": wall,
            "sample": args.sample, "seed": args.seed, "skipped": skipped,
            "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
        (args.results / "conformance.md").write_text(text)
    return 1 if any(r.outcome in DEFECTS for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
