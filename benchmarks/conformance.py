"""Conformance: every built-in graph and precision pass over the ONNX project's node tests.

Usage:

    python benchmarks/conformance.py [--out DIR] [--results DIR] [--sample N --seed S]
                                     [--only NAME,NAME] [--routes R,R]

For each node test of the installed onnx, this script writes the model and its input
sets (``.npz``, strings as NumPy ``str`` arrays) and runs what ``routetune build MODEL
--route R --inputs DIR`` runs, for every graph and precision seasoning that ONNX
Runtime's CPU provider offers, and classifies each (test, route) as
`routetune.conformance` describes. Targets (issue 21): 0 ``wrong-output``, 0
``invalid-model``, 0 ``traceback``. Rows go to ``RESULTS/conformance.json``, counts to
``RESULTS/conformance.md``. ``--sample N`` takes the seeded sample of N tests that
tests/test_conformance.py runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import onnx

from routetune.conformance import (
    DEFECTS,
    ROUTES,
    Row,
    node_tests,
    run_route,
    sample_tests,
    summary,
    write_case,
)


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
        cases = sample_tests(cases, args.sample, args.seed)
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
