"""The quick test profile (tests/quick.py) and the check that keeps tests on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from graphs import conv_bn
from quick import QUICK_FLAGS, QUICK_KEYWORDS, quick_spec, searches_that_wait

from routetune.registry import Registry
from routetune.run.recipe import merge
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune


def test_the_three_entry_points_take_the_same_profile(registry: Registry) -> None:
    spec = quick_spec()
    flags = dict(zip(QUICK_FLAGS[::2], QUICK_FLAGS[1::2], strict=True))
    assert spec.confirm_repeats == QUICK_KEYWORDS["confirm_repeats"] == int(
        flags["--confirm-repeats"]) == 1
    assert spec.busy_machine == QUICK_KEYWORDS["busy_machine"] == flags["--busy-machine"]
    assert spec.measure.min_runs == QUICK_KEYWORDS["min_runs"] == int(flags["--min-runs"])
    assert spec.measure.min_time_s == QUICK_KEYWORDS["min_time_s"] == float(
        flags["--min-time"])
    api = merge({k: v for k, v in QUICK_KEYWORDS.items()}, "api", registry)
    assert (api.busy_machine, api.confirm_repeats) == (spec.busy_machine, 1)
    assert spec.in_process and not quick_spec(in_process=False).in_process
    assert RunSpec().busy_machine == "wait"  # production's default, which tests avoid


def test_a_search_that_waited_is_found_and_other_records_are_not(registry: Registry,
                                                                 tmp_path: Path) -> None:
    tune(quick_spec(model=conv_bn(tmp_path / "m.onnx"), output=tmp_path / "quick",
                    shapes="x:1x3x32x32", seasonings=("ort-threads",), max_trials=1),
         registry)
    assert searches_that_wait(tmp_path) == []
    record = json.loads((tmp_path / "quick" / "run.json").read_text())
    record["verdict"]["busy_machine"] = "wait"  # as a search with production's default
    (tmp_path / "waited" / "deep").mkdir(parents=True)
    (tmp_path / "waited" / "deep" / "run.json").write_text(json.dumps(record))
    (tmp_path / "hostile").mkdir()
    (tmp_path / "hostile" / "run.json").write_text("{not json")
    (tmp_path / "copied").mkdir()  # a record from a test's data: not this test's search
    (tmp_path / "copied" / "run.json").write_text(json.dumps(
        {**record, "started_at": "2026-12-01T10:33:58+0000"}))
    assert searches_that_wait(tmp_path, since=time.time() - 60) == [
        tmp_path / "waited" / "deep"]
    assert searches_that_wait(tmp_path) == [tmp_path / "copied", tmp_path / "waited" / "deep"]
    (tmp_path / "waited" / "deep" / "run.json").unlink()  # or this test fails itself
