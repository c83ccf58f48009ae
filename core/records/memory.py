"""The route memory: what every search taught, kept across runs, models and output folders.

One SQLite file (stdlib `sqlite3`), by default ``memory.sqlite`` in routetune's cache
(``$ROUTETUNE_CACHE``, else ``~/.cache/routetune``); ``--memory PATH`` chooses another
and ``--memory off`` turns it off. Each row is a `Lesson`: one step's measured effect
over its parent route on one model, backend and device, or the step's failure there.
Rows are keyed by their content, so adding or merging the same lesson twice adds it once.

A memory file is data, never code, and may come from someone else: every row is
checked as it is read (types, finite figures within bounds, text lengths), a row that
fails is skipped and counted, and at most `MAX_LESSONS` rows are read. What the memory
says only orders and prunes a search (`routetune.records.prior`,
`routetune.search.learned`): no figure of a run and no verdict comes from it.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from routetune.errors import StorageError, UsageError, one_line
from routetune.model.signature import ModelSignature
from routetune.records.lessons import MAX_TEXT, Lesson, Outcome
from routetune.records.prior import Prior, prior_of
from routetune.routes.route import parse_route

APPLICATION_ID = 0x52544D30  # "RTM0"
SCHEMA_VERSION = 1
FILENAME = "memory.sqlite"
MAX_LESSONS = 200_000
"""Rows read at most, the newest first: a huge shared file costs bounded time."""
MAX_EFFECT = 1000.0
"""Speed-ups outside [1/MAX_EFFECT, MAX_EFFECT] are not measurements; such rows are skipped."""

_SCHEMA = """
CREATE TABLE lessons (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    signature TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    device TEXT NOT NULL,
    parent TEXT NOT NULL,
    step TEXT NOT NULL,
    outcome TEXT NOT NULL,
    speedup REAL,
    low REAL,
    high REAL,
    margin REAL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


class RouteMemory:
    """A route memory file. Open with `RouteMemory.open`; close when done.

    Raises:
        StorageError: On any SQLite failure, with the file's path.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self.skipped = 0
        """Rows skipped as malformed by the last read."""

    @classmethod
    def open(cls, path: Path, read_only: bool = False) -> RouteMemory:
        """Open the memory at `path`, creating it (and its folder) unless `read_only`.

        Refused, never overwritten: a link or anything but a regular file, a SQLite file
        routetune did not write (its ``application_id``), one with views or triggers
        or without the ``lessons`` table, and one of a newer schema.

        Raises:
            StorageError: One of the above, or the file cannot be opened or created.
        """
        fix = ("give a route memory file (`routetune memory export` writes one)" if read_only
               else "give another --memory PATH, or --memory off")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise StorageError(f"{path}: not a regular file (a link, a folder, a FIFO), not a "
                               f"route memory; {fix}")
        if read_only and not path.is_file():
            raise StorageError(f"{path}: no such file; give a route memory file")
        try:
            if not read_only:
                path.parent.mkdir(parents=True, exist_ok=True)
            uri = f"file:{path}?mode=ro" if read_only else f"file:{path}"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            names = conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        except (sqlite3.Error, OSError) as e:
            raise StorageError(f"{path}: not a route memory ({one_line(e, 200)}); "
                               f"{fix}") from e
        kinds = {kind for kind, _ in names}
        if names and (app_id != APPLICATION_ID or ("table", "lessons") not in names
                      or kinds & {"view", "trigger"}):
            conn.close()
            raise StorageError(f"{path}: a SQLite file that is not a routetune route memory; "
                               f"{fix}")
        if version > SCHEMA_VERSION:
            conn.close()
            raise StorageError(f"{path}: written by a newer routetune (memory schema "
                               f"{version} > {SCHEMA_VERSION}); upgrade routetune, or {fix}")
        if not names and not read_only:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} "
                                   f"PRAGMA application_id={APPLICATION_ID}; "
                                   f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
            except sqlite3.Error as e:
                conn.close()
                raise StorageError(f"{path}: cannot create the route memory "
                                   f"({one_line(e, 200)}); {fix}") from e
        return cls(path, conn)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def add(self, lessons: Iterable[Lesson]) -> int:
        """Write lessons in one transaction; one already there (equal `key`) is not added.

        Returns:
            How many were new.

        Raises:
            StorageError: SQLite failed (a full disk, a read-only file); nothing written.
        """
        rows = [(lesson.key, lesson.signature.key, json.dumps(lesson.signature.to_json()),
                 lesson.backend, lesson.backend_version, lesson.device, lesson.parent,
                 lesson.step, str(lesson.outcome), lesson.speedup, lesson.low, lesson.high,
                 lesson.margin, lesson.reason[:MAX_TEXT], lesson.created_at or time.time())
                for lesson in lessons]
        try:
            before = self.conn.total_changes
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "INSERT OR IGNORE INTO lessons VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            self.conn.execute("COMMIT")
            return self.conn.total_changes - before
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise StorageError(f"{self.path}: cannot write the route memory "
                               f"({one_line(e, 200)}); nothing was written to it") from e

    def lessons(self, backend: str | None = None) -> Iterator[Lesson]:
        """The lessons, newest first, at most `MAX_LESSONS`; only `backend`'s if given.

        A row that is not a well-formed lesson is skipped and counted in `skipped`.

        Raises:
            StorageError: The file cannot be read.
        """
        self.skipped = 0
        where = "WHERE backend = ?" if backend is not None else ""
        args = (backend,) if backend is not None else ()
        signatures: dict[str, ModelSignature | None] = {}
        try:
            rows = self.conn.execute(
                "SELECT model, CASE WHEN length(signature) <= 200000 THEN signature END, "
                "backend, backend_version, device, parent, step, outcome, speedup, low, "
                "high, margin, reason, created_at FROM lessons "
                f"{where} ORDER BY created_at DESC LIMIT {MAX_LESSONS}", args)
            for row in rows:
                lesson = _lesson(row, signatures)
                if lesson is None:
                    self.skipped += 1
                else:
                    yield lesson
        except sqlite3.Error as e:
            raise StorageError(f"{self.path}: cannot read the route memory "
                               f"({one_line(e, 200)}); give another --memory PATH, or "
                               "--memory off") from e

    def count(self) -> int:
        """Rows in the file (well-formed or not)."""
        return int(self.conn.execute("SELECT count(*) FROM lessons").fetchone()[0])

    def merge(self, other: Path) -> tuple[int, int]:
        """Add another memory file's well-formed lessons to this one.

        Returns:
            Lessons new to this file, and rows of the other skipped as malformed.

        Raises:
            StorageError: The other file is not a route memory, or this one cannot be
                written.
        """
        source = RouteMemory.open(other, read_only=True)
        try:
            added = self.add(source.lessons())
            return added, source.skipped
        finally:
            source.close()

    def prior(self, signature: ModelSignature, backend: str, device: str) -> Prior:
        """What this memory expects of each step on `backend`, for a model like `signature`.

        `routetune.records.prior.prior_of` over `backend`'s well-formed lessons.

        Raises:
            StorageError: The file cannot be read.
        """
        lessons = list(self.lessons(backend))
        return prior_of(lessons, signature, device, self.skipped)

    def export(self, target: Path) -> None:
        """Write a compact copy of this memory to `target` (a new file).

        Raises:
            StorageError: `target` exists (it is never overwritten), or the copy failed.
        """
        if target.exists() or target.is_symlink():
            raise StorageError(f"{target}: exists; give a new file to export to")
        try:
            self.conn.execute("VACUUM INTO ?", (os.fspath(target),))
        except sqlite3.Error as e:
            raise StorageError(f"{target}: cannot export the route memory "
                               f"({one_line(e, 200)})") from e

def _lesson(row: Sequence[object], signatures: dict[str, ModelSignature | None]
            ) -> Lesson | None:
    """A row as a lesson; None when it is not a well-formed one (untrusted input)."""
    (model, signature, backend, version, device, parent, step, outcome, speedup, low, high,
     margin, reason, created) = row
    texts = (model, backend, version, device, parent, step, reason)
    if not all(isinstance(t, str) and len(t) <= MAX_TEXT for t in texts):
        return None
    if not isinstance(signature, str) or not isinstance(created, (int, float)):
        return None
    assert isinstance(model, str)
    if model not in signatures:
        try:
            parsed = ModelSignature.from_json(json.loads(signature))
            signatures[model] = parsed if parsed.key == model else None
        except ValueError:  # json's errors are ValueErrors too
            signatures[model] = None
    sig = signatures[model]
    try:
        kind = Outcome(outcome)
        parse_route(str(parent)), parse_route(str(step))
    except (ValueError, UsageError):  # not an outcome; a route text the parser refuses
        return None
    figures = (speedup, low, high)
    if sig is None or not all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)
                                            and 1 / MAX_EFFECT <= v <= MAX_EFFECT)
                              for v in figures):
        return None
    if kind in (Outcome.TIMED, Outcome.INACCURATE) and speedup is None:
        return None
    if margin is not None and not (isinstance(margin, (int, float)) and math.isfinite(margin)):
        return None
    number = [None if v is None else float(v)  # type: ignore[arg-type]
              for v in (speedup, low, high, margin)]
    return Lesson(sig, str(backend), str(version), str(device), str(parent), str(step), kind,
                  number[0], number[1], number[2], number[3], str(reason), float(created))


