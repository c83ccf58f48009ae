"""The route memory: what every search taught, kept across runs, models and output folders.

One SQLite file (stdlib `sqlite3`, rollback journal: a reader leaves no ``-wal`` or
``-shm`` file behind), by default ``memory.sqlite`` in routetune's cache
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
"""Speed-ups outside [1/MAX_EFFECT, MAX_EFFECT] are not measurements; such rows are skipped.
An interval's ends need only be finite and positive: a step measured over a hopeless
parent route (0.014x) has a real estimate of 81x with an interval of [3.6, 1804]."""

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

    def __init__(self, path: Path, conn: sqlite3.Connection, fix: str) -> None:
        self.path = path
        self.conn = conn
        self.fix = fix
        """What the user can do when this file fails, for messages."""
        self.skipped = 0
        """Rows skipped as malformed by the last read."""

    @classmethod
    def open(cls, path: Path, read_only: bool = False, fix: str = "") -> RouteMemory:
        """Open the memory at `path`, creating it (and its folder) unless `read_only`.

        Refused, never overwritten: a link or anything but a regular file, an empty
        file opened `read_only`, a SQLite file routetune did not write (its
        ``application_id``), one with views or triggers or without the ``lessons``
        table, and one of a newer schema.

        Args:
            path: The file.
            read_only: Open it to read only: it must exist, nothing is created.
            fix: What the user can do when it fails, ending each error message; by
                default ``give another --memory PATH, or --memory off``.

        Raises:
            StorageError: One of the above, or the file cannot be opened or created.
        """
        fix = fix or "give another --memory PATH, or --memory off"
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise StorageError(f"{path}: not a regular file (a link, a folder, a FIFO), not a "
                               f"route memory; {fix}")
        if read_only and not path.is_file():
            raise StorageError(f"{path}: no such file; {fix}")
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
        if read_only and not names:
            conn.close()
            raise StorageError(f"{path}: an empty file, not a route memory; {fix}")
        if names and (app_id != APPLICATION_ID or ("table", "lessons") not in names
                      or kinds & {"view", "trigger"}):
            conn.close()
            raise StorageError(f"{path}: a SQLite file that is not a routetune route memory; "
                               f"{fix}")
        if version > SCHEMA_VERSION:
            conn.close()
            raise StorageError(f"{path}: written by a newer routetune (memory schema "
                               f"{version} > {SCHEMA_VERSION}); upgrade routetune, or {fix}")
        if not read_only:
            try:
                conn.execute("PRAGMA journal_mode=DELETE")  # a file written in WAL mode
            except sqlite3.Error:
                pass  # another connection holds it: it stays as it is
        if not names and not read_only:
            try:
                conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} "
                                   f"PRAGMA application_id={APPLICATION_ID}; "
                                   f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
            except sqlite3.Error as e:
                conn.close()
                raise StorageError(f"{path}: cannot create the route memory "
                                   f"({one_line(e, 200)}); {fix}") from e
        return cls(path, conn, fix)

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
        return self.add_groups([lessons])[0]

    def add_groups(self, groups: Sequence[Iterable[Lesson]]) -> list[int]:
        """Write several groups of lessons (several files' merged) in one transaction.

        Returns:
            How many of each group were new, in order.

        Raises:
            StorageError: SQLite failed (a full disk, a read-only file); nothing written.
        """
        rows = [[(lesson.key, lesson.signature.key, json.dumps(lesson.signature.to_json()),
                  lesson.backend, lesson.backend_version, lesson.device, lesson.parent,
                  lesson.step, str(lesson.outcome), lesson.speedup, lesson.low, lesson.high,
                  lesson.margin, lesson.reason[:MAX_TEXT], lesson.created_at or time.time())
                 for lesson in group] for group in groups]
        added = []
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            for group in rows:
                before = self.conn.total_changes
                self.conn.executemany(
                    "INSERT OR IGNORE INTO lessons VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    group)
                added.append(self.conn.total_changes - before)
            self.conn.execute("COMMIT")
            return added
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise StorageError(f"{self.path}: cannot write the route memory "
                               f"({one_line(e, 200)}); nothing was written to it") from e

    def lessons(self, backend: str | None = None) -> Iterator[Lesson]:
        """The lessons, newest first, at most `MAX_LESSONS`; only `backend`'s if given.

        Each row is checked on its own (`_lesson`); one that is not a well-formed
        lesson is skipped and counted in `skipped`.

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
                               f"({one_line(e, 200)}); {self.fix}") from e

    def count(self) -> int:
        """Rows in the file (well-formed or not)."""
        return int(self.conn.execute("SELECT count(*) FROM lessons").fetchone()[0])

    def prior(self, signature: ModelSignature, backend: str, device: str) -> Prior:
        """What this memory expects of each step on `backend`, for a model like `signature`.

        `routetune.records.prior.prior_of` over `backend`'s well-formed lessons.

        Raises:
            StorageError: The file cannot be read.
        """
        lessons = list(self.lessons(backend))
        return prior_of(lessons, signature, device, self.skipped)

    def export(self, target: Path) -> tuple[int, int]:
        """Write this memory's well-formed lessons to `target`, a new memory file.

        A malformed row is not copied: what is shared has been checked.

        Returns:
            Lessons written, and rows skipped as malformed.

        Raises:
            StorageError: `target` exists (it is never overwritten), its folder does not,
                or the copy failed (then no `target` is left).
        """
        if target.exists() or target.is_symlink():
            raise StorageError(f"{target}: exists; give a new file to export to")
        if not target.parent.is_dir():
            raise StorageError(f"{target.parent}: no such folder; create it, or export to "
                               "a file in a folder that exists")
        lessons = list(self.lessons())
        copy = RouteMemory.open(target, fix="give another file to export to")
        try:
            written = copy.add(lessons)
        except StorageError:
            copy.close()
            target.unlink(missing_ok=True)
            raise
        copy.close()
        return written, self.skipped


def read_all(paths: Sequence[Path]) -> list[tuple[list[Lesson], int]]:
    """The well-formed lessons of each file, and its rows skipped as malformed.

    Every file is read before anything is written anywhere: a merge of several files
    that one of them cannot join stops before it starts.

    Raises:
        StorageError: A file is not a route memory, or cannot be read.
    """
    out = []
    for path in paths:
        source = RouteMemory.open(path, read_only=True,
                                  fix="give a route memory file (`routetune memory "
                                  "export` writes one)")
        try:
            out.append((list(source.lessons()), source.skipped))
        finally:
            source.close()
    return out


def merge_into(target: Path, sources: Sequence[Path]) -> list[tuple[int, int]]:
    """Add the well-formed lessons of `sources` to the memory `target`, all or none.

    Every source is checked and read first; `target` is created only then, and all
    is written in one transaction.

    Returns:
        Per source, in order: lessons new to `target`, rows skipped as malformed.

    Raises:
        StorageError: A source is `target`, is not a route memory or cannot be read
            (`target` is then untouched, and not created), or `target` cannot be written.
    """
    for source in sources:
        if source.exists() and target.exists() and source.resolve() == target.resolve():
            raise StorageError(f"{source}: is the memory merged into; give another file")
    read = read_all(sources)
    store = RouteMemory.open(target)
    try:
        added = store.add_groups([lessons for lessons, _ in read])
    finally:
        store.close()
    return [(n, skipped) for n, (_, skipped) in zip(added, read, strict=True)]


def _lesson(row: Sequence[object], signatures: dict[str, ModelSignature | None]
            ) -> Lesson | None:
    """A row as a lesson; None when it is not a well-formed one (untrusted input).

    Every row is judged on its own: its signature must parse and hash to its own
    ``model`` key (`signatures` caches the parse by the signature's text only).
    """
    (model, signature, backend, version, device, parent, step, outcome, speedup, low, high,
     margin, reason, created) = row
    texts = (model, backend, version, device, parent, step, reason)
    if not all(isinstance(t, str) and len(t) <= MAX_TEXT for t in texts):
        return None
    if not isinstance(signature, str) or not _finite(created) or created < 0:  # type: ignore[operator]
        return None
    if signature not in signatures:
        try:
            signatures[signature] = ModelSignature.from_json(json.loads(signature))
        except ValueError:  # json's errors are ValueErrors too
            signatures[signature] = None
    sig = signatures[signature]
    if sig is None or sig.key != model:
        return None
    try:
        kind = Outcome(outcome)
        parse_route(str(parent)), parse_route(str(step))
    except (ValueError, UsageError):  # not an outcome; a route text the parser refuses
        return None
    if speedup is not None and not (
            _finite(speedup) and 1 / MAX_EFFECT <= speedup <= MAX_EFFECT):  # type: ignore[operator]
        return None
    if not all(v is None or (_finite(v) and v > 0) for v in (low, high)):  # type: ignore[operator]
        return None  # an interval's end may lie far out (a hopeless parent: [3.6, 1804])
    if kind in (Outcome.TIMED, Outcome.INACCURATE) and speedup is None:
        return None
    if margin is not None and not _finite(margin):
        return None
    number = [None if v is None else float(v)  # type: ignore[arg-type]
              for v in (speedup, low, high, margin)]
    return Lesson(sig, str(backend), str(version), str(device), str(parent), str(step), kind,
                  number[0], number[1], number[2], number[3], str(reason),
                  float(created))  # type: ignore[arg-type]


def _finite(value: object) -> bool:
    """A real number (not a bool, not text), finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)
