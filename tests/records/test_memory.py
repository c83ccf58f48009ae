"""The route memory: lessons from real searches, kept in real SQLite files, shared and merged.

A memory file is untrusted input: garbage, a foreign SQLite file, a huge one and planted
figures are refused or skipped, and none can make an unmeasured route win.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from command import routetune
from graphs import matmul_chain
from quick import QUICK_FLAGS, quick_spec

from routetune.errors import StorageError
from routetune.model.signature import ModelSignature
from routetune.records.lessons import Lesson, Outcome
from routetune.records.memory import MAX_LESSONS, RouteMemory
from routetune.registry import Registry
from routetune.routes.route import Route
from routetune.run.tuning import TuneResult, tune

SEASONINGS = ("ort-opt-level", "ort-no-spinning", "fp16")


def _search(model: Path, out: Path, memory: Path, registry: Registry, search: str = "mixed",
            **options: object) -> TuneResult:
    spec = quick_spec(model=model, output=out, search=search, seasonings=SEASONINGS,
                      memory=str(memory), accuracy="cos>=0.99", **options)
    return tune(spec, registry)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Two real searches on two models, each into a memory file of its own."""
    from routetune.plugin_manager import load_registry

    tmp = tmp_path_factory.mktemp("memory")
    registry = load_registry()
    a = matmul_chain(tmp / "a.onnx", depth=4, width=64, batch=16)
    b = matmul_chain(tmp / "b.onnx", depth=6, width=64, batch=16)
    first = _search(a, tmp / "out-a", tmp / "a.sqlite", registry)
    second = _search(b, tmp / "out-b", tmp / "b.sqlite", registry)
    return {"tmp": tmp, "a": a, "b": b, "first": first, "second": second}


def test_a_search_adds_each_steps_effect_over_its_parent(searched: dict) -> None:
    first: TuneResult = searched["first"]
    memory = RouteMemory.open(searched["tmp"] / "a.sqlite")
    lessons = list(memory.lessons())
    memory.close()
    record = json.loads(first.files["run"].read_text())
    assert record["search"]["lessons_added"] == len(lessons) > 0
    by_route = {t.route: t for t in first.trials}
    for lesson in lessons:
        assert lesson.backend == "onnxruntime" and lesson.device == first.base.device
        # a trial whose route, less the step, is the parent
        assert any(str(s) == lesson.step and str(Route(t.steps.steps[:i] + t.steps.steps[
            i + 1:])) == lesson.parent for t in first.trials for i, s in enumerate(t.steps))
        if lesson.outcome == Outcome.TIMED and lesson.parent == "base":
            # a single step's effect is its paired speed-up over the base route
            assert lesson.speedup == pytest.approx(by_route[lesson.step].speedup, rel=1e-9)
            assert lesson.margin is not None and lesson.margin > 0
    # read back, its prior knows every step timed on this model
    memory = RouteMemory.open(searched["tmp"] / "a.sqlite")
    sig = lessons[0].signature
    prior = memory.prior(sig, "onnxruntime", first.base.device)
    assert {lesson.step for lesson in lessons if lesson.speedup} <= set(prior.steps)
    # the same lessons again add nothing
    assert memory.add(lessons) == 0
    memory.close()


def test_two_files_merge_and_merging_again_adds_nothing(searched: dict,
                                                        tmp_path: Path) -> None:
    tmp = searched["tmp"]
    merged = tmp_path / "team.sqlite"
    assert routetune("memory", "merge", str(tmp / "a.sqlite"), str(tmp / "b.sqlite"),
                     "--memory", str(merged)).returncode == 0
    counts = []
    for name in ("a.sqlite", "b.sqlite", merged):
        memory = RouteMemory.open(tmp / name if isinstance(name, str) else name)
        counts.append(memory.count())
        memory.close()
    assert counts[2] == counts[0] + counts[1]
    memory = RouteMemory.open(merged)
    assert memory.merge(tmp / "a.sqlite") == (0, 0)
    memory.export(tmp_path / "copy.sqlite")
    with pytest.raises(StorageError, match="exists"):
        memory.export(tmp_path / "copy.sqlite")
    memory.close()
    copy = RouteMemory.open(tmp_path / "copy.sqlite", read_only=True)
    assert copy.count() == counts[2]
    copy.close()


def test_a_learned_search_starts_from_a_memory_of_another_model(searched: dict,
                                                                registry: Registry,
                                                                tmp_path: Path) -> None:
    tmp = searched["tmp"]
    model = matmul_chain(tmp_path / "c.onnx", depth=5, width=64, batch=16)
    result = _search(model, tmp_path / "out", tmp / "a.sqlite", registry, search="learned")
    record = json.loads(result.files["run"].read_text())
    assert "lessons on 1 model" in record["search"]["memory"]
    assert result.base.status == "ok"
    # every figure of the run was measured by it
    assert {t.fingerprint for t in result.trials if t.latency} <= result.fresh


@pytest.mark.parametrize("content", [b"\x00garbage" * 400, b""])
def test_a_garbage_memory_file_is_refused_in_one_line_and_left_as_it_was(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "memory.sqlite"
    path.write_bytes(content or b"not sqlite at all")
    before = path.read_bytes()
    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=16, batch=2)
    proc = routetune("tune", str(model), "--output", str(tmp_path / "out"), "--memory",
                     str(path), "--max-trials", "1", *QUICK_FLAGS)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a route memory" in lines[0] and "--memory off" in lines[0]
    assert "Traceback" not in proc.stderr
    assert path.read_bytes() == before


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE lessons (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="not a routetune route memory"):
        RouteMemory.open(path)


def _plant(path: Path, rows: list[tuple]) -> None:
    """Rows written straight into a memory file, as a hostile colleague could."""
    RouteMemory.open(path).close()
    conn = sqlite3.connect(path)
    conn.executemany("INSERT INTO lessons VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()


def _row(sig: ModelSignature, step: str, speedup: object, n: int, device: str = "d",
         signature: str | None = None, outcome: str = "timed") -> tuple:
    model = sig.key if signature is None else "f" * 64  # a key its signature must hash to
    return (f"k{n}", model, signature or json.dumps(sig.to_json()), "onnxruntime", "1",
            device, "base", step, outcome, speedup, speedup, speedup, 0.1, "", time.time())


def test_malformed_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    sig = ModelSignature({"MatMul": 4}, 100, (("float32", (1, 4)),))
    path = tmp_path / "planted.sqlite"
    _plant(path, [_row(sig, "fp16", 2.0, 0), _row(sig, "fp16", float("nan"), 1),
                  _row(sig, "fp16", 1e9, 2), _row(sig, "fp16", -3.0, 3),
                  _row(sig, "fp16", "fast", 4), _row(sig, "fp16{", 2.0, 5),
                  _row(sig, "fp16", 2.0, 6, signature="{}"),
                  _row(sig, "fp16", 2.0, 7, outcome="wins"),
                  _row(sig, "x" * 5000, 2.0, 8)])
    memory = RouteMemory.open(path)
    lessons = list(memory.lessons())
    assert len(lessons) == 1 and memory.skipped == 8
    prior = memory.prior(sig, "onnxruntime", "d")
    assert "8 malformed rows skipped" in prior.describe()
    memory.close()


@pytest.mark.slow
def test_a_huge_memory_file_is_read_only_in_part(tmp_path: Path) -> None:
    sig = ModelSignature({"MatMul": 4}, 100, (("float32", (1, 4)),))
    path = tmp_path / "huge.sqlite"
    _plant(path, [_row(sig, "fp16", 1.5, n) for n in range(MAX_LESSONS + 5000)])
    memory = RouteMemory.open(path)
    started = time.monotonic()
    prior = memory.prior(sig, "onnxruntime", "d")
    assert prior.lessons == MAX_LESSONS
    assert time.monotonic() - started < 60  # bounded, not a timing target
    memory.close()


def test_planted_figures_never_make_an_unmeasured_or_inaccurate_route_win(
        registry: Registry, tmp_path: Path) -> None:
    """A memory that says fp16 is 50x faster on this very model: the learned search
    tries it first, and it loses, because what wins is measured and judged here."""
    model = matmul_chain(tmp_path / "m.onnx", depth=4, width=64, batch=16)
    spec = quick_spec(model=model, output=tmp_path / "out", search="learned",
                      seasonings=SEASONINGS, accuracy="cos>=0.99,rel_l2<=1e-7",
                      memory=str(tmp_path / "planted.sqlite"))
    from routetune.run.preparation import prepare_run
    from routetune.run.route_memory import open_memory

    run = prepare_run(spec, registry)
    use = open_memory(spec, run)
    device = run.backend.device()
    use.close()
    planted = [_row(use.signature, "fp16", 50.0, n, device=device) for n in range(50)]
    planted += [_row(replace(use.signature, parameters=use.signature.parameters + n),
                     "fp16", 50.0, 100 + n, device=device) for n in range(50)]
    _plant(tmp_path / "planted.sqlite", planted)
    result = tune(spec, registry)
    fp16 = next(t for t in result.trials if t.route == "fp16")
    assert fp16.status == "accuracy-failed"  # measured, judged, and so it cannot win
    assert result.trials.index(fp16) > 0 and result.winner.route != "fp16"
    assert result.winner.fingerprint in result.fresh
    assert fp16.speedup is None or fp16.speedup < 50  # its figure is this run's
    record = json.loads(result.files["run"].read_text())
    assert "lessons on 2 models" in record["search"]["memory"] or "lessons on" in record[
        "search"]["memory"]


def test_a_lesson_key_ignores_when_it_was_learned() -> None:
    sig = ModelSignature({"Conv": 1}, 1, ())
    a = Lesson(sig, "b", "1", "d", "base", "fp16", Outcome.TIMED, 1.2, 1.1, 1.3, 0.1,
               created_at=1.0)
    assert a.key == replace(a, created_at=2.0).key != replace(a, speedup=1.3).key
