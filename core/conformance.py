"""Conformance of passes over the ONNX project's node tests (onnx/backend/test/case/node).

The ONNX project ships a test case for every operator
(``onnx.backend.test.case.node.collect_testcases()``: one-operator models, some written
as functions, each with input sets). `run_route` runs what ``routetune build MODEL
--route R --inputs DIR`` runs (`routetune.run.rebuild.rebuild`, in this process) on one
written test and classifies the result:

- ``ok``: the pass changed the model, which built, and its outputs match the FP32
  reference under the default constraint;
- ``unchanged``: the pass ran and found nothing to change;
- ``not-applicable``: the pass declined up front (`Seasoning.applicable`), with why;
- ``tolerance-miss``: a precision route whose outputs do not (allowed);
- ``wrong-output``: an exact pass whose outputs do not (a defect);
- ``refused``: the pass or the backend declined, in one line (the reason is kept);
- ``invalid-model``: the pass wrote a model the ONNX checker, or the pass contract,
  rejects, or it crashed (a defect, even though routetune caught it);
- ``traceback``: anything else that escaped (a defect);
- ``skipped``: the original model cannot run here (ONNX Runtime refuses it), or its
  inputs cannot be given as ``.npz`` (sequences, optionals); the reason is kept.

``benchmarks/conformance.py`` runs every test; tests/test_conformance.py a seeded sample.
"""

from __future__ import annotations

import random
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from routetune.errors import PostconditionError, RoutetuneError, SeasoningError, UsageError
from routetune.registry import Registry

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


def sample_tests(cases: list[Any], n: int, seed: int = 0) -> list[Any]:
    """A seeded random sample of `n` node tests (all of them when there are fewer)."""
    return sorted(random.Random(seed).sample(cases, min(n, len(cases))), key=lambda c: c.name)


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
            if isinstance(value, onnx.TensorProto):  # the float8 tests give their data so
                value = onnx.numpy_helper.to_array(value)
            if isinstance(value, np.generic):
                value = np.asarray(value)
            if isinstance(value, np.ndarray) and value.dtype.isbuiltin == 2:  # ml_dtypes
                value = value.view(f"u{value.dtype.itemsize}")  # their bytes, as --inputs takes
            if not isinstance(value, np.ndarray):
                return (f"input '{name}' is a {type(value).__name__} (a sequence or "
                        "optional); --inputs takes tensors")
            arrays[name] = value.astype(str) if value.dtype == object else value
        np.savez(inputs / f"{i}.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub
    if not case.data_sets:
        return "the test has no input sets"
    onnx.save(model, folder / "model.onnx")
    return ""


def run_route(folder: Path, route: str, registry: Registry) -> Row:
    """`routetune build` of one route on one written test, classified."""
    from routetune.run.rebuild import rebuild  # imports the search; not needed to list tests
    from routetune.run.run_spec import RunSpec

    opts = RunSpec(model=folder / "model.onnx", inputs=folder / "inputs",
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
            applicable = "not applicable: " not in done.failed
            row.outcome = "refused" if applicable else "not-applicable"
            row.reason = done.failed
        elif done.verdict is None:
            row.outcome, row.reason = "refused", done.not_run
        elif not done.verdict.passed:
            row.outcome = "wrong-output" if ROUTES[route] == "exact" else "tolerance-miss"
            row.reason = done.verdict.reason
        elif not done.changed:
            row.outcome = "unchanged"
    row.seconds = round(time.perf_counter() - t0, 3)
    if "\n" in row.reason and row.outcome in ("refused", "skipped"):
        row.outcome, row.reason = "traceback", "a refusal of several lines: " + row.reason
    return row


def summary(rows: list[Row], tests: int, skipped: dict[str, str], wall_s: float) -> str:
    """The Markdown counts: per route and outcome, and the defects listed."""
    outcomes = ["ok", "unchanged", "not-applicable", "tolerance-miss", "refused", "skipped",
                *DEFECTS]
    lines = [f"{tests} node tests ({len(skipped)} not writable as .npz inputs), "
             f"{len(rows)} (test, route) runs, {wall_s:.0f} s.", "",
             "| route | " + " | ".join(outcomes) + " | applied and within tolerance |",
             "|---" * (len(outcomes) + 2) + "|"]
    for route in ROUTES:
        mine = [r for r in rows if r.route == route]
        counts = Counter(r.outcome for r in mine)
        ran = len(mine) - counts["skipped"]
        share = f"{counts['ok'] / ran:.1%}" if ran else "-"  # applied, and within tolerance
        lines.append(f"| {route} | " + " | ".join(str(counts[o]) for o in outcomes)
                     + f" | {share} of {ran} |")
    defects = [r for r in rows if r.outcome in DEFECTS]
    lines += ["", f"Defects: {len(defects)}."]
    lines += [f"- `{r.test}` `{r.route}` {r.outcome}: {r.reason[:300]}" for r in defects[:200]]
    return "\n".join(lines) + "\n"


