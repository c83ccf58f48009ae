from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from routetune.errors import StorageError
from routetune.records.store import SCHEMA_VERSION, TrialStore
from routetune.records.trial import Trial
from routetune.timing.measure import Latency


def trial(fp: str = "f1", route: str = "base") -> Trial:
    return Trial(fp, "m", route, "onnxruntime", "cpu", "s", "ok", "note",
                 candidate_sha256="c", latency=Latency(10, 1, 2, 3, 1.5, 0.9, 1.1),
                 build_ms=12.5, engine_bytes=1024, accuracy={"y": {"cos": 1.0}},
                 passes=({"step": "a", "modified": True, "stats": {"n": 1}},),
                 settings={"k": 1}, artifact="artifacts/models/0123456789abcdef.onnx",
                 versions={"onnx": "1"})


def test_round_trip(tmp_path: Path) -> None:
    store = TrialStore.open(tmp_path / "t.sqlite")
    written = store.add(trial())
    assert written.created_at > 0
    assert store.get("f1") == written
    assert store.trials() == [written]
    assert store.get("nope") is None
    store.close()
    again = TrialStore.open(tmp_path / "t.sqlite")
    assert again.trials() == [written]
    mode = again.conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_both_latencies_and_device_memory_round_trip(tmp_path: Path) -> None:
    store = TrialStore.open(tmp_path / "t.sqlite")
    gpu = replace(trial(), latency_kind="end-to-end", device_memory_bytes=123_456_789,
                  other_latency=Latency(8, 0.5, 0.6, 0.7, 0.55, 0.45, 0.6, (0.5, 0.52)))
    written = store.add(gpu)
    assert store.get(written.fingerprint) == written
    assert written.other_latency == gpu.other_latency and written.latency_kind == "end-to-end"
    store.conn.execute("UPDATE trials SET timing = '{\"kind\": \"wall\"}'")
    with pytest.raises(StorageError, match="corrupt .*timing is not an object with a kind"):
        store.trials()
    store.conn.execute("UPDATE trials SET timing = '{\"kind\": \"device\", "
                       "\"device_memory_bytes\": \"lots\"}'")
    with pytest.raises(StorageError, match="timing.device_memory_bytes is str"):
        store.trials()
    store.close()


def test_a_trial_is_never_overwritten(tmp_path: Path) -> None:
    store = TrialStore.open(tmp_path / "t.sqlite")
    store.add(trial())
    with pytest.raises(StorageError, match="UNIQUE"):
        store.add(trial(route="other"))
    assert [t.route for t in store.trials()] == ["base"]


def test_foreign_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE x (y)").connection.commit()
    with pytest.raises(StorageError, match="did not write"):
        TrialStore.open(foreign)
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StorageError, match="not a routetune trial store"):
        TrialStore.open(corrupt)
    assert corrupt.read_bytes() == b"not a database at all" * 100


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    TrialStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match="newer routetune"):
        TrialStore.open(path)


V1_SCHEMA = """
CREATE TABLE trials (
    id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL UNIQUE, model_sha256 TEXT NOT NULL,
    route TEXT NOT NULL, backend TEXT NOT NULL, device TEXT NOT NULL,
    settings_hash TEXT NOT NULL, candidate_sha256 TEXT, status TEXT NOT NULL,
    reason TEXT NOT NULL, latency TEXT, base_latency TEXT, build_ms REAL,
    engine_bytes INTEGER, accuracy TEXT, passes TEXT, settings TEXT, artifact TEXT,
    versions TEXT NOT NULL, created_at REAL NOT NULL,
    UNIQUE (model_sha256, route, backend, device, settings_hash)
);
PRAGMA application_id=1381258288; PRAGMA user_version=1;
"""
"""The store as routetune wrote it before paired speed-ups (schema 1, main 7f79101)."""


def test_a_schema_1_store_migrates_on_open(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.execute(
        "INSERT INTO trials (fingerprint, model_sha256, route, backend, device, settings_hash,"
        " status, reason, latency, base_latency, accuracy, passes, settings, versions,"
        " created_at) VALUES ('f', 'm', 'fp16', 'onnxruntime', 'cpu', 's', 'ok', '',"
        " '{\"n\": 10, \"p50\": 2.0, \"p90\": 2.1, \"p99\": 2.2, \"mean\": 2.0,"
        " \"ci_low\": 1.9, \"ci_high\": 2.1}', '{\"n\": 10, \"p50\": 3.0, \"p90\": 3.1,"
        " \"p99\": 3.2, \"mean\": 3.0, \"ci_low\": 2.9, \"ci_high\": 3.1}', '{}', '[]', '{}',"
        " '{}', 1.0)")
    conn.commit()
    conn.close()
    store = TrialStore.open(path)
    old = store.get("f")
    assert old.paired is None and old.conditions == {} and old.noisy == ""
    assert old.engine_sha256 is None  # schema 3: a plan it kept is not vouched for
    assert old.speedup == pytest.approx(1.5) and old.latency.blocks == ()
    assert (old.latency_kind, old.other_latency, old.device_memory_bytes) == (
        "device", None, None)  # schema 5: timed as device compute, the rest unknown
    store.add(trial("f2", "fp16,x"))  # the new columns take writes
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert len(TrialStore.open(path).trials()) == 2
