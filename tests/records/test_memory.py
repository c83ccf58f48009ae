"""The route memory: lessons from real searches, kept in real SQLite files, shared and merged.

A memory file is untrusted input: garbage, a foreign SQLite file, a huge one and planted
figures are refused or skipped, and none can make an unmeasured route win.
"""

from __future__ import annotations

import json
import re
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
from routetune.records.memory import MAX_LESSONS, RouteMemory, merge_into
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
    assert record["search"]["memory"]["lessons_added"] == len(lessons) > 0
    assert record["search"]["memory"]["path"] == str(searched["tmp"] / "a.sqlite")
    report = (first.files["run"].parent / "report.md").read_text()
    assert f"route memory: {searched['tmp'] / 'a.sqlite'}" in report
    assert f"this run added {len(lessons)} lessons" in report
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
    assert merge_into(merged, [tmp / "a.sqlite"]) == [(0, 0)]
    memory = RouteMemory.open(merged)
    assert memory.export(tmp_path / "copy.sqlite") == (counts[2], 0)
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
    assert "lessons on 1 model" in record["search"]["memory"]["note"]
    assert record["search"]["memory"]["knew"]["models"] == 1
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
    assert len(lines) == 1 and lines[0].startswith(f"routetune: error: --memory {path}: ")
    assert "not a route memory" in lines[0] and lines[0].endswith("give another file, or off")
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
         signature: str | None = None, outcome: str = "timed", model: str | None = None,
         created: object = None) -> tuple:
    model = model or (sig.key if signature is None else "f" * 64)  # its signature's hash
    return (f"k{n}", model, signature or json.dumps(sig.to_json()), "onnxruntime", "1",
            device, "base", step, outcome, speedup, speedup, speedup, 0.1, "",
            time.time() if created is None else created)


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
    assert record["search"]["memory"]["knew"]["models"] == 50  # this one and 49 planted


def test_a_lesson_key_ignores_when_it_was_learned() -> None:
    sig = ModelSignature({"Conv": 1}, 1, ())
    a = Lesson(sig, "b", "1", "d", "base", "fp16", Outcome.TIMED, 1.2, 1.1, 1.3, 0.1,
               created_at=1.0)
    assert a.key == replace(a, created_at=2.0).key != replace(a, speedup=1.3).key


def test_each_row_is_judged_on_its_own(tmp_path: Path) -> None:
    """A malformed row, read first, hides no good row of its model, and a row whose
    signature is another model's is not taken for it."""
    sig = ModelSignature({"MatMul": 4}, 100, (("float32", (1, 4)),))
    other = ModelSignature({"Conv": 9}, 5000, (("float32", (1, 3, 8, 8)),))
    now = time.time()
    path = tmp_path / "mixed.sqlite"
    _plant(path, [_row(sig, "fp16", 2.0, 0, created=now - 10),
                  _row(sig, "fp16", 2.0, 1, signature="{}", model=sig.key, created=now),
                  _row(other, "fp16", 3.0, 2, model=sig.key, created=now + 1),
                  _row(sig, "fp16", 2.0, 3, created=float("inf")),
                  _row(sig, "fp16", 2.0, 4, created=-1.0)])
    memory = RouteMemory.open(path)
    lessons = list(memory.lessons())
    memory.close()
    assert [lesson.signature for lesson in lessons] == [sig] and memory.skipped == 4


def test_memory_commands_refuse_off_in_one_line(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    done = routetune("memory", "show", "--memory", "off")
    assert done.returncode == 2 and done.stderr.strip() == (
        "routetune: error: --memory off: these commands work on a memory file; give --memory PATH")
    monkeypatch.setenv("ROUTETUNE_MEMORY", "off")
    done = routetune("memory", "export", str(tmp_path / "x.sqlite"))
    assert done.returncode == 2 and done.stderr.startswith(
        "routetune: error: $ROUTETUNE_MEMORY is off")
    assert not (tmp_path / "x.sqlite").exists() and not Path("off").exists()


def test_a_merge_checks_every_file_first_and_writes_all_or_nothing(
        searched: dict, tmp_path: Path) -> None:
    tmp = searched["tmp"]
    empty, target = tmp_path / "empty.sqlite", tmp_path / "team.sqlite"
    empty.write_bytes(b"")
    done = routetune("memory", "merge", str(tmp / "a.sqlite"), str(empty), "--memory",
                     str(target))
    assert done.returncode == 2 and not target.exists()  # not created for nothing
    assert done.stderr.strip() == (
        f"routetune: error: {empty}: an empty file, not a route memory; give a "
        "route memory file (`routetune memory export` writes one)")
    assert routetune("memory", "merge", str(tmp / "b.sqlite"), "--memory",
                     str(target)).returncode == 0
    before = target.read_bytes()
    done = routetune("memory", "merge", str(tmp / "a.sqlite"), str(tmp_path / "missing"),
                     "--memory", str(target))
    assert done.returncode == 2 and target.read_bytes() == before  # a.sqlite not half-added


def test_an_export_copies_only_checked_rows_into_a_folder_that_exists(
        tmp_path: Path) -> None:
    sig = ModelSignature({"MatMul": 4}, 100, (("float32", (1, 4)),))
    path = tmp_path / "planted.sqlite"
    _plant(path, [_row(sig, "fp16", 2.0, 0), _row(sig, "fp16", float("inf"), 1)])
    done = routetune("memory", "export", str(tmp_path / "no" / "copy.sqlite"), "--memory",
                     str(path))
    assert done.returncode == 2 and "no such folder; create it" in done.stderr
    done = routetune("memory", "export", str(tmp_path / "copy.sqlite"), "--memory", str(path))
    assert done.returncode == 0 and "exported 1 lessons" in done.stdout
    assert "1 malformed rows left out" in done.stdout
    copy = RouteMemory.open(tmp_path / "copy.sqlite", read_only=True)
    assert copy.count() == 1
    copy.close()
    # reading left no journal files beside either file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.sqlite", "planted.sqlite"]


def test_a_memory_option_names_where_it_was_written_and_creates_nothing_early(
        registry: Registry, tmp_path: Path) -> None:
    from routetune.errors import UsageError
    from routetune.run.preparation import prepare_run
    from routetune.run.recipe import merge
    from routetune.run.route_memory import open_memory

    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=16, batch=2)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'schema_version = 2\n[model]\npath = "{model.name}"\n'
                      '[search]\nmemory = ""\n')
    spec = merge({"recipe": recipe}, "api", registry)
    with pytest.raises(UsageError, match=re.escape(f"{recipe} [search] memory: empty; give "
                                                   "another file, or off")), spec.worded():
        open_memory(spec, prepare_run(spec, registry))
    (tmp_path / "folder.sqlite").mkdir()
    spec = merge({"model": model, "memory": str(tmp_path / "folder.sqlite")}, "api",
                 registry)
    with pytest.raises(UsageError, match=r"^routetune.tune\(memory=...\) .*folder.sqlite: "
                       "not a regular file"), spec.worded():
        open_memory(spec, prepare_run(spec, registry))
    fresh = tmp_path / "new" / "memory.sqlite"
    spec = quick_spec(model=model, output=tmp_path / "out", memory=str(fresh))
    use = open_memory(spec, prepare_run(spec, registry))
    assert use.used and use.path == fresh and not fresh.parent.exists()


def test_a_real_step_over_a_hopeless_parent_is_read_back(tmp_path: Path) -> None:
    """A step measured over a 0.014x parent route (`ort-parallel` on a small
    transformer) is 81x [3.6, 1804]: a measurement, which the memory wrote and then
    counted as malformed when reading (11 of 843 rows of one user's memory)."""
    sig = ModelSignature({"MatMul": 4}, 100, (("float32", (1, 4)),))
    path = tmp_path / "m.sqlite"
    real = list(_row(sig, "fold-constants", 80.9, 0))
    real[10:12] = [3.6, 1804.3]  # low, high
    absurd = list(_row(sig, "fp16", 80.9, 1))
    absurd[9] = 5000.0  # the estimate itself: not a measurement
    _plant(path, [tuple(real), tuple(absurd)])
    memory = RouteMemory.open(path)
    lessons = list(memory.lessons())
    assert [(x.step, x.high) for x in lessons] == [("fold-constants", 1804.3)]
    assert memory.skipped == 1
