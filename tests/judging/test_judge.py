"""Judging apart from measuring: a pure verdict, and stored trials judged again."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from quick import quick_spec

from routetune.judging.accuracy import AccuracyMeasurement, Unjudgeable, judge, parse_accuracy
from routetune.judging.judge import judged
from routetune.records.store import SCHEMA_VERSION, TrialStore
from routetune.records.trial import Status, Trial
from routetune.registry import Registry
from routetune.reporting.report import build_report
from routetune.run.tuning import tune

DATA = Path(__file__).parents[1] / "data"


def measured(cos: float, faults: tuple[str, ...] = ()) -> AccuracyMeasurement:
    return AccuracyMeasurement({"y": {"cos": cos, "l0": 0.0}}, faults, ("a note",),
                               {"y": (1e-3, 1e-3)})


def test_judge_applies_bounds_and_keeps_faults(registry: Registry) -> None:
    loose = parse_accuracy("cos>=0.99,atol=1e-3,rtol=1e-3", registry, ["y"])
    tight = parse_accuracy("cos>=0.9999,atol=1e-3,rtol=1e-3", registry, ["y"])
    assert judge(measured(0.999), loose).passed
    verdict = judge(measured(0.999), tight)
    assert not verdict.passed and verdict.reason == "y: cos 0.999, needs >= 0.9999"
    # a fault fails under any bound
    faulty = judge(measured(1.0, ("y: 2 NaN/Inf value(s) that differ",)), loose)
    assert not faulty.passed and faulty.failures == ("y: 2 NaN/Inf value(s) that differ",)
    assert judge(measured(0.999), loose).notes == ("a note",)


def test_judge_refuses_a_measurement_at_other_tolerances(registry: Registry) -> None:
    other = parse_accuracy("l0<=0.01,atol=1e-2,rtol=1e-3", registry, ["y"])
    with pytest.raises(Unjudgeable, match="measured at atol, rtol"):
        judge(measured(1.0), other)
    unmeasured = AccuracyMeasurement({"y": {"cos": 1.0}}, (), (), {"y": (1e-5, 1e-5)})
    with pytest.raises(Unjudgeable, match="l0 was not measured"):
        judge(unmeasured, parse_accuracy("l0<=0.01", registry, ["y"]))


def test_judged_trial_changes_only_status_and_reason(registry: Registry) -> None:
    trial = Trial("f", "m", "fp16", "be", "dev", "s", Status.OK, "a note",
                  accuracy={"y": {"cos": 0.999, "l0": 0.0}}, notes=("a note",),
                  tolerances={"y": (1e-3, 1e-3)})
    tight = parse_accuracy("cos>=0.9999,atol=1e-3,rtol=1e-3", registry, ["y"])
    again = judged(trial, tight)
    assert (again.status, again.reason) == (Status.ACCURACY_FAILED,
                                            "y: cos 0.999, needs >= 0.9999")
    assert judged(again, parse_accuracy("cos>=0.99,atol=1e-3,rtol=1e-3", registry,
                                        ["y"])) == trial
    # stored before measurements were kept (schema < 4): its verdict stands
    legacy = Trial("f", "m", "fp16", "be", "dev", "s", Status.OK, accuracy={"y": {"cos": 0.9}})
    assert judged(legacy, tight) is legacy


def test_a_store_of_schema_3_opens_migrated_and_reports(tmp_path: Path) -> None:
    """A trials.sqlite written by routetune at schema 3 (a real run, kept as test data)."""
    shutil.copy(DATA / "schema3" / "trials.sqlite", tmp_path / "trials.sqlite")
    shutil.copy(DATA / "schema3" / "run.json", tmp_path / "run.json")
    store = TrialStore.open(tmp_path / "trials.sqlite")
    try:
        trials = store.trials()
    finally:
        store.close()
    version = sqlite3.connect(tmp_path / "trials.sqlite").execute(
        "PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION == 5
    assert [(t.route, t.status) for t in trials] == [
        ("base", Status.OK), ("eliminate-noops", Status.OK), ("fp16", Status.OK)]
    assert all(t.tolerances == {} and t.faults == () for t in trials)
    report = build_report(tmp_path)
    assert [r["status"] for r in report["trials"]] == ["ok", "ok", "ok"]


@pytest.fixture
def cls_example(model_path: Callable[[str], Path], model_cache: Path,
                monkeypatch: pytest.MonkeyPatch) -> None:
    model_path("ppocr-cls")  # fetch once, or skip with the reason
    monkeypatch.setenv("ROUTETUNE_CACHE", str(model_cache))


@pytest.mark.slow
def test_another_accuracy_rejudges_stored_trials_without_measuring(
        cls_example: None, registry: Registry, tmp_path: Path) -> None:
    """PP-OCR's classifier in FP16 is off by rel-L2 about 1e-3 on the example's 64 lines
    (the base route by 8e-8): a bound below fails it, one above passes it, and the second
    run builds and times nothing."""
    out = tmp_path / "out"

    def run(accuracy: str) -> tuple[dict[str, Status], list[bool], float]:
        cached: list[bool] = []
        t0 = time.perf_counter()
        result = tune(quick_spec(
            example="ppocr-cls", output=out, seasonings=("fp16", "eliminate-noops"),
            max_depth=1, accuracy=accuracy, min_speedup=100.0),
            registry, on_trial=lambda trial, hit: cached.append(hit))
        assert len(result.fresh) == cached.count(False)  # waits counted for these only
        return ({t.route: t.status for t in result.trials}, cached,
                time.perf_counter() - t0)

    tight, first, first_s = run("rel_l2<=1e-6,atol=1e-3,rtol=1e-3")
    assert tight == {"base": "ok", "eliminate-noops": "ok", "fp16": "accuracy-failed"}
    assert first == [False, False, False]
    loose, second, second_s = run("rel_l2<=1e-2,atol=1e-3,rtol=1e-3")
    assert loose == {"base": "ok", "eliminate-noops": "ok", "fp16": "ok"}
    assert second == [True, True, True]  # judged again from the store
    assert second_s < first_s
    store = TrialStore.open(out / "trials.sqlite")
    try:
        assert len(store.trials()) == 3  # nothing new measured
    finally:
        store.close()
    # the second run's report judges under its own constraint
    records = next((out / "runs").iterdir())
    # the same command again resumes in that run's folder, not in a new dated one
    run("rel_l2<=1e-2,atol=1e-3,rtol=1e-3")
    assert list((out / "runs").iterdir()) == [records]
    report = build_report(out, records)
    assert {r["route"]: r["status"] for r in report["trials"]}["fp16"] == "ok"
    # other tolerances change what is measured: the trials are measured again
    _, third, _ = run("rel_l2<=1e-2,atol=1e-2,rtol=1e-3")
    assert third == [False, False, False]
