"""The quick test profile: a search's settings for tests that do not test measurement.

Tests inherit nothing from production's defaults that only a verdict needs: three
fresh-process confirmations (``--confirm-repeats 3``), waiting up to 60 s per measure
phase for a quiet machine (``--busy-machine wait``: under ``pytest -n``, the other test
worker is foreign load), and a second of timed runs per candidate. A test that checks
what one of these does sets it itself (`test_conditions.py`: the busy-machine policy;
`judging/test_verdict.py` and one search in `search/test_loop.py`: the three
confirmations). A test that runs beside others fails when a search it ran waited for a
quiet machine (`searches_that_wait`, called by tests/conftest.py after each test).

The three entry points take the same profile:

- `quick_spec` for `routetune.run.tuning.tune` (a `RunSpec`);
- `QUICK_KEYWORDS` for ``routetune.tune(...)``;
- `QUICK_FLAGS` for the command line (``routetune tune``), in process or not.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from routetune.run.run_spec import RunSpec
from routetune.timing.measure import MeasureSettings

QUICK_MEASURE = MeasureSettings(warmup=1, min_runs=3, min_time_s=0.02)
"""Timed runs per candidate: 3 at least, 0.02 s at least, in 10 paired blocks."""

QUICK_OPTIONS: dict[str, Any] = {"confirm_repeats": 1, "busy_machine": "ignore"}
"""What a verdict needs and a test of anything else does not."""

QUICK_KEYWORDS: dict[str, Any] = {**QUICK_OPTIONS, "min_runs": QUICK_MEASURE.min_runs,
                                  "min_time_s": QUICK_MEASURE.min_time_s}
"""`QUICK_OPTIONS` and `QUICK_MEASURE` as ``routetune.tune`` keywords."""

QUICK_FLAGS = ("--min-runs", str(QUICK_MEASURE.min_runs), "--min-time",
               str(QUICK_MEASURE.min_time_s), "--confirm-repeats", "1",
               "--busy-machine", "ignore")
"""`QUICK_KEYWORDS` as ``routetune tune`` flags."""


def quick_spec(**options: Any) -> RunSpec:
    """A `RunSpec` of `options` over the quick profile, in this process.

    Trials run in this process (``in_process``) unless `options` say otherwise: a test of
    worker isolation, timeouts or the pool passes ``in_process=False``.
    """
    return RunSpec(**{"measure": QUICK_MEASURE, "in_process": True, **QUICK_OPTIONS,
                      **options})


def searches_that_wait(folder: Path, since: float = 0.0) -> list[Path]:
    """The run folders under `folder` whose search ran with ``--busy-machine wait``.

    Read from each ``run.json`` (``verdict.busy_machine``) of a search started at
    `since` (seconds since the epoch) or later: a record a test copied from its data, or
    one that cannot be read (a test's own hostile file), is passed over.
    """
    found = []
    for here, _, files in os.walk(folder):
        if "run.json" not in files:
            continue
        try:
            record = json.loads((Path(here) / "run.json").read_text())
            verdict = record["verdict"]
            started = datetime.strptime(record["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if started >= since - 1 and isinstance(verdict, dict) and (
                verdict.get("busy_machine") == "wait"):
            found.append(Path(here))
    return sorted(found)
