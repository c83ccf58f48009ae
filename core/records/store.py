"""The trial store: every trial of every search, in one SQLite file per output directory.

stdlib `sqlite3`, WAL mode, one transaction per trial. The schema version lives in
``PRAGMA user_version`` and the file is marked with ``PRAGMA application_id``, so a
foreign SQLite file is refused rather than overwritten. A written trial is never
updated in place; ``--fresh`` moves the old file aside instead of deleting it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from routetune.errors import StorageError, one_line
from routetune.records.trial import Status, Trial
from routetune.timing.measure import LATENCIES, Latency, Speedup

APPLICATION_ID = 0x52545430  # "RTT0"
SCHEMA_VERSION = 5
FILENAME = "trials.sqlite"

_SCHEMA = """
CREATE TABLE trials (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL UNIQUE,
    model_sha256 TEXT NOT NULL,
    route TEXT NOT NULL,
    backend TEXT NOT NULL,
    device TEXT NOT NULL,
    settings_hash TEXT NOT NULL,
    candidate_sha256 TEXT,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    latency TEXT,
    base_latency TEXT,
    build_ms REAL,
    engine_bytes INTEGER,
    accuracy TEXT,
    passes TEXT,
    settings TEXT,
    artifact TEXT,
    versions TEXT NOT NULL,
    created_at REAL NOT NULL,
    paired TEXT,
    conditions TEXT,
    noisy TEXT NOT NULL DEFAULT '',
    engine_sha256 TEXT,
    measurement TEXT,
    timing TEXT,
    UNIQUE (model_sha256, route, backend, device, settings_hash)
);
"""

_MIGRATIONS = {
    1: "ALTER TABLE trials ADD COLUMN paired TEXT; "
       "ALTER TABLE trials ADD COLUMN conditions TEXT; "
       "ALTER TABLE trials ADD COLUMN noisy TEXT NOT NULL DEFAULT '';",
    2: "ALTER TABLE trials ADD COLUMN engine_sha256 TEXT;",
    3: "ALTER TABLE trials ADD COLUMN measurement TEXT;",
    4: "ALTER TABLE trials ADD COLUMN timing TEXT;",
}
"""Per schema version, the SQL that brings a store to the next version: version 2 adds
the paired speed-up, the machine conditions and the noisy mark of each trial; version 3
the sha256 of a kept engine file; version 4 the accuracy measurement's faults, notes
and tolerances, so that a trial can be judged again under another constraint (a trial
written before has none, and keeps the verdict it was stored with); version 5 what was
timed (``--latency``), the other latency and the engine's device memory (a trial written
before has device compute and neither)."""


class TrialStore:
    """A SQLite file of trials. Open with `TrialStore.open`; close when done.

    Raises:
        StorageError: On any SQLite failure, with the file's path.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn

    @classmethod
    def open(cls, path: Path) -> TrialStore:
        """Open or create the store at `path`.

        A symbolic link is refused: the store is the output folder's own, and SQLite
        would write beside the file it leads to. So is anything else but a regular file
        (reading a FIFO never ends), a file whose ``trials`` is not a table, or whose
        schema holds views or triggers (a view can make every read run forever):
        routetune writes neither.

        Raises:
            StorageError: The file is not a routetune store, has a newer schema, or
                cannot be opened.
        """
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise StorageError(f"{path}: not a regular file (a link, a folder, a FIFO), not a "
                               "trial store; move it away or use another --output")
        try:
            conn = sqlite3.connect(path, isolation_level=None)
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            kinds = conn.execute("SELECT type FROM sqlite_master WHERE name = 'trials' OR "
                                 "type IN ('view', 'trigger')").fetchall()
        except sqlite3.DatabaseError as e:
            if disk_full(e):
                raise full_disk(path, e) from e
            if path.exists() and not os.access(path.parent, os.W_OK):
                raise StorageError(
                    f"{path.parent}: a read-only folder, and SQLite writes its -wal and -shm "
                    f"files beside {path.name} even to read it; make the folder writable "
                    f"(chmod u+w {path.parent}), or copy it and use the copy") from e
            raise StorageError(f"{path}: not a routetune trial store ({one_line(e, 200)}); "
                               "move it away or use another --output") from e
        if tables and app_id != APPLICATION_ID:
            conn.close()
            raise StorageError(
                f"{path}: a SQLite file that routetune did not write; "
                "move it away or use another --output"
            )
        if tables and kinds != [("table",)]:
            conn.close()
            raise StorageError(f"{path}: not a routetune trial store (its schema holds views "
                               "or triggers, or no trials table); move it away or use another "
                               "--output")
        if tables and version < SCHEMA_VERSION and version not in _MIGRATIONS:
            conn.close()
            raise StorageError(f"{path}: schema version {version}, which no routetune wrote; "
                               "move it away or use another --output")
        if version > SCHEMA_VERSION:
            conn.close()
            raise StorageError(
                f"{path}: written by a newer routetune (schema {version} > {SCHEMA_VERSION}); "
                "upgrade routetune or use another --output"
            )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            if not tables:
                conn.executescript(
                    f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA application_id={APPLICATION_ID}; "
                    f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
                )
            while tables and version < SCHEMA_VERSION:  # migrate on open, step by step
                conn.executescript(f"BEGIN IMMEDIATE; {_MIGRATIONS[version]} "
                                   f"PRAGMA user_version={version + 1}; COMMIT;")
                version += 1
        except sqlite3.Error as e:
            conn.close()
            if disk_full(e):
                raise full_disk(path, e) from e
            raise StorageError(f"{path}: cannot create the trial store ({one_line(e, 200)})") from e
        return cls(path, conn)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction: commit on success, roll back on error.

        Raises:
            StorageError: SQLite failed; the transaction was rolled back.
        """
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            yield self.conn
            self.conn.execute("COMMIT")
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if disk_full(e):
                raise full_disk(self.path, e) from e
            raise StorageError(f"{self.path}: {e}") from e
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def add(self, trial: Trial) -> Trial:
        """Write one trial in its own transaction and return it with its timestamp.

        Raises:
            StorageError: A trial with the same fingerprint exists, or SQLite failed.
        """
        row = asdict(trial)
        row["status"] = Status(trial.status).value
        row["created_at"] = trial.created_at or time.time()
        measured = {"faults": list(row.pop("faults")), "notes": list(row.pop("notes")),
                    "tolerances": {k: list(v) for k, v in row.pop("tolerances").items()},
                    "per_set": {k: list(v) for k, v in row.pop("accuracy_per_set").items()}}
        row["measurement"] = json.dumps(measured) if trial.tolerances else None
        for key in ("latency", "base_latency", "paired"):
            value = getattr(trial, key)
            row[key] = json.dumps(asdict(value)) if value else None
        other = row.pop("other_latency")
        row["timing"] = json.dumps({"kind": row.pop("latency_kind"), "other": other,
                                    "device_memory_bytes": row.pop("device_memory_bytes"),
                                    "raced": row.pop("raced")})
        for key in ("accuracy", "passes", "settings", "versions", "conditions"):
            row[key] = json.dumps(row[key])
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self.transaction() as conn:
            conn.execute(f"INSERT INTO trials ({cols}) VALUES ({marks})", row)
        return replace(trial, created_at=row["created_at"])

    def get(self, fingerprint: str) -> Trial | None:
        """Return the trial with this fingerprint, or None."""
        rows = self._select("WHERE fingerprint = ?", (fingerprint,))
        return rows[0] if rows else None

    def trials(self) -> list[Trial]:
        """Every stored trial, oldest first."""
        return self._select("ORDER BY id", ())

    def _select(self, where: str, args: tuple[Any, ...]) -> list[Trial]:
        try:
            cur = self.conn.execute(f"SELECT * FROM trials {where}", args)
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        except sqlite3.Error as e:
            raise StorageError(f"{self.path}: {e}") from e
        return [_trial(r, self.path) for r in rows]


def _trial(row: dict[str, Any], path: Path | str = FILENAME) -> Trial:
    """A stored row as a `Trial`, every column checked for what routetune writes there.

    Args:
        row: The row, by column name.
        path: The store, for the message.

    Raises:
        StorageError: A column is corrupt (a hand-edited or planted store): not JSON
            where JSON is kept, or a value of another type or shape, or a latency or
            speed-up that is not a positive number (it divides).
    """
    try:
        return _checked_trial(dict(row))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else one_line(e, 200)
        raise StorageError(f"{path}: trial {row.get('id')!r} is corrupt ({what}); move the "
                           "file away, or run `routetune tune --fresh`") from e


_TEXT = ("fingerprint", "model_sha256", "route", "backend", "device", "settings_hash",
         "status", "reason", "noisy")
_TEXT_OR_NULL = ("candidate_sha256", "artifact", "engine_sha256")
ARTIFACT = r"artifacts/models/[0-9a-f]{16}\.onnx"
"""What a stored ``artifact`` may be: a path routetune's `save_model` writes, inside the
output folder (a planted ``/dev/zero`` or ``../x`` would be read from outside it)."""
_MAPPINGS = ("accuracy", "settings", "versions", "conditions")
_NUMERIC_CONDITIONS = ("waited_s", "foreign_cores", "steal_pct")
"""Condition entries that reports and verdicts do arithmetic with
(`routetune.timing.conditions`)."""


def _number(value: Any, what: str, positive: bool = False) -> None:
    """Check that `value` is a real number (with `positive`, finite and above 0).

    Raises:
        TypeError: It is not a number (a bool is not one).
        ValueError: It is not positive, finite, as `positive` asks.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} is {type(value).__name__}, not a number")
    if positive and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} is {value}, not a positive number")


def _checked_trial(row: dict[str, Any]) -> Trial:
    row.pop("id")
    for key in _TEXT:
        if not isinstance(row[key], str):
            raise TypeError(f"{key} is {type(row[key]).__name__}, not text")
    if row.get("artifact") is not None and not re.fullmatch(ARTIFACT, str(row["artifact"])):
        raise ValueError(f"artifact {str(row['artifact'])[:80]!r} is not a candidate model "
                         "path (artifacts/models/<sha256[:16]>.onnx)")
    for key in _TEXT_OR_NULL:
        if row.get(key) is not None and not isinstance(row[key], str):
            raise TypeError(f"{key} is {type(row[key]).__name__}, not text")
    for key in ("build_ms", "engine_bytes"):
        if row[key] is not None:
            _number(row[key], key)
    _number(row["created_at"], "created_at")
    for key in ("latency", "base_latency", "paired", *_MAPPINGS, "passes"):
        if row[key] is not None and not isinstance(row[key], str):
            raise TypeError(f"{key} is {type(row[key]).__name__}, not JSON text")
    latency, base, paired = (json.loads(raw) if (raw := row.pop(k)) else None
                             for k in ("latency", "base_latency", "paired"))
    for name, lat in (("latency", latency), ("base_latency", base)):
        if lat is not None:
            lat["blocks"] = tuple(lat.get("blocks", ()))
            for key, value in lat.items():
                for v in value if key == "blocks" else (value,):
                    _number(v, f"{name}.{key}", positive=key == "p50")
    if paired:
        for key, value in paired.items():
            _number(value, f"paired.{key}", positive=key in ("value", "ci_low", "ci_high"))
    mappings = {k: json.loads(row[k] or "{}") for k in _MAPPINGS}
    for key, value in mappings.items():
        if not isinstance(value, dict):
            raise TypeError(f"{key} is not a JSON object")
    for output, metrics in mappings["accuracy"].items():
        if not isinstance(metrics, dict):
            raise TypeError(f"accuracy of {output!r} is not a JSON object")
        for metric, value in metrics.items():
            _number(value, f"accuracy {output!r} {metric}")
    for key in _NUMERIC_CONDITIONS:
        if mappings["conditions"].get(key) is not None:
            _number(mappings["conditions"][key], f"conditions.{key}")
    passes = json.loads(row["passes"] or "[]")
    if not isinstance(passes, list) or not all(isinstance(p, dict) for p in passes):
        raise TypeError("passes is not a JSON list of objects")
    measured = _measurement(row.pop("measurement", None))
    timing = _timing(row.pop("timing", None))
    row["status"] = Status(row["status"])
    return Trial(
        **{k: v for k, v in row.items() if k not in (*_MAPPINGS, "passes")}, **measured,
        latency=Latency(**latency) if latency else None,
        base_latency=Latency(**base) if base else None,
        paired=Speedup(**paired) if paired else None,
        passes=tuple(passes), **mappings, **timing,
    )


def _timing(raw: Any) -> dict[str, Any]:
    """The ``timing`` column as `Trial` fields.

    The latency kind, the other latency, the device memory, and the bar it left the
    race under (absent before racing: timed in full).

    Raises:
        TypeError: It is not a JSON object of a known kind, a latency or null, and a
            byte count or null.
        ValueError: It is not JSON, or a figure is not positive.
    """
    if raw is None:
        return {}
    doc = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(doc, dict) or doc.get("kind") not in LATENCIES:
        raise TypeError(f"timing is not an object with a kind of {', '.join(LATENCIES)}")
    other = doc.get("other")
    if other is not None:
        if not isinstance(other, dict):
            raise TypeError("timing.other is not a JSON object")
        other["blocks"] = tuple(other.get("blocks", ()))
        for key, value in other.items():
            for v in value if key == "blocks" else (value,):
                _number(v, f"timing.other.{key}", positive=key == "p50")
    memory = doc.get("device_memory_bytes")
    if memory is not None:
        _number(memory, "timing.device_memory_bytes")
    raced = doc.get("raced")
    if raced is not None:
        _number(raced, "timing.raced", positive=True)
    return {"latency_kind": doc["kind"], "other_latency": Latency(**other) if other else None,
            "device_memory_bytes": memory, "raced": raced}


def _measurement(raw: Any) -> dict[str, Any]:
    """The ``measurement`` column as `Trial` fields: faults, notes, tolerances, per set.

    Raises:
        TypeError: It is not a JSON object of a list of faults, a list of notes and
            ``(atol, rtol)`` per output.
        ValueError: It is not JSON.
    """
    if raw is None:
        return {}
    if not isinstance(raw, str):
        raise TypeError(f"measurement is {type(raw).__name__}, not JSON text")
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise TypeError("measurement is not a JSON object")
    faults, notes, tolerances = (value.get(k) for k in ("faults", "notes", "tolerances"))
    for key, lines in (("faults", faults), ("notes", notes)):
        if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            raise TypeError(f"measurement.{key} is not a list of text")
    if not isinstance(tolerances, dict):
        raise TypeError("measurement.tolerances is not a JSON object")
    pairs: dict[str, tuple[float, float]] = {}
    for output, pair in tolerances.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise TypeError(f"measurement.tolerances of {output!r} is not [atol, rtol]")
        for v in pair:
            _number(v, f"measurement.tolerances of {output!r}")
        pairs[output] = (float(pair[0]), float(pair[1]))
    per_set = value.get("per_set", {})  # absent in rows written before 2026-12-01
    if not isinstance(per_set, dict) or not all(
            isinstance(sets, list) and all(isinstance(m, dict) for m in sets)
            for sets in per_set.values()):
        raise TypeError("measurement.per_set is not per output a list of objects")
    for output, sets in per_set.items():
        for values in sets:
            for metric, v in values.items():
                _number(v, f"measurement.per_set of {output!r}: {metric}")
    return {"faults": tuple(faults or ()), "notes": tuple(notes or ()), "tolerances": pairs,
            "accuracy_per_set": {k: tuple(v) for k, v in per_set.items()}}


def disk_full(error: BaseException) -> bool:
    """Whether `error` says the disk (or the file system's quota) is full.

    SQLite's ``SQLITE_FULL``, or ``ENOSPC``/``EDQUOT`` from the operating system.
    """
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return (getattr(error, "sqlite_errorname", "") == "SQLITE_FULL"
            or "database or disk is full" in str(error))


FULL = "the disk is full"
"""What `full_disk`'s line says, and a worker's crash reason with it."""


def full_disk(path: Path, error: BaseException) -> StorageError:
    """The one line for a write that a full disk refused, with its fix."""
    return StorageError(
        f"{path}: {FULL} ({one_line(error, 120)}); free space on the disk that "
        f"holds {path.parent} and run the same command again (the trials stored so far "
        "are kept and not run again), or use another --output")
