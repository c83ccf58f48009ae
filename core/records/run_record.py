"""``run.json``, the record of a run beside its trial store: reading, writing, where.

The trial store holds trials; ``run.json`` the rest that a report needs
(`routetune.run.runinfo` says what a run writes in it). A run in a folder that holds
another run's record (another search space or strategy, constraint, inputs or pinned
routes: ``tune --recipe winner.toml`` re-measuring a winner, say) writes its records
(``run.json``, the reports and the winner files) into ``runs/<UTC time>/`` instead
(`record_dir`), so that the original run's stay as they were. Running the same command
again (a resume) updates the folder's own. Every file is written by replace
(`replace_text`), and a folder that holds a link is refused (`refuse_links`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from routetune.errors import UsageError, one_line

FILENAME = "run.json"


SAME_RUN = ("settings_hash", "accuracy", "profile", "pinned", "space", "search.strategy",
            "search.options", "backend.name", "backend.options", "model.sha256")
"""The fields of two records that must agree for them to be one run (a resume)."""


def _field(record: dict[str, Any], name: str) -> Any:
    for part in name.split("."):
        record = record.get(part, {}) if isinstance(record, dict) else {}
    return record


def record_dir(outdir: Path, record: dict[str, Any]) -> Path:
    """Where this run writes its records: `outdir`, or ``runs/<UTC time>/`` in it.

    The folder's own when it holds no run record or one of the same run (`SAME_RUN`);
    else the dated folder of an earlier run that was the same run (a repeated command
    resumes there); otherwise a new dated folder, so that another run's record is never
    overwritten.
    """
    try:
        old = read(outdir)
    except UsageError:
        old = {}
    if not old or all(_field(old, k) == _field(record, k) for k in SAME_RUN):
        return outdir
    runs = outdir / "runs"
    for folder in sorted(runs.iterdir()) if runs.is_dir() else ():
        if folder.is_symlink() or not folder.is_dir():
            continue
        try:  # the same run as one recorded there already: its folder, not a new one
            if all(_field(read(folder), k) == _field(record, k) for k in SAME_RUN):
                return folder
        except UsageError:
            continue
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = outdir / "runs" / stamp
    n = 1
    while path.exists():
        n += 1
        path = outdir / "runs" / f"{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def write(outdir: Path, record: dict[str, Any]) -> Path:
    """Write ``run.json`` atomically (`replace_text`); return its path."""
    path = outdir / FILENAME
    replace_text(path, json.dumps(record, indent=1, default=str) + "\n")
    return path


def replace_text(path: Path, text: str) -> None:
    """Write `text` as `path`, atomically: into a new file beside it, then renamed over it.

    The new file has a fresh name (``tempfile.mkstemp``), so a link planted in a
    results folder (``report.html`` pointing elsewhere) is replaced, never written
    through.

    Raises:
        UsageError: The folder or `path` cannot be written (`path` is a folder, say).
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UsageError(f"{path}: cannot write ({e.strerror}); check the folder") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write ({e.strerror}); move it away") from e


def read(outdir: Path) -> dict[str, Any]:
    """Read ``run.json``; an empty record when there is none (a store from an older run).

    Raises:
        UsageError: The file is not JSON, or not a run record.
    """
    path = outdir / FILENAME
    if not path.exists():
        return {}
    if not path.is_file():  # a FIFO or a device: reading it never ends
        raise UsageError(f"{path}: not a regular file; delete it, or run `routetune tune` "
                         "again to rewrite it")
    try:
        record = json.loads(path.read_text())
    except RecursionError as e:  # json recurses per nested array or object
        raise UsageError(f"{path}: not a readable run record (nested too deeply); delete "
                         "it, or run `routetune tune` again to rewrite it") from e
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable run record ({one_line(e)}); delete it, or "
                         "run `routetune tune` again to rewrite it") from e
    if not isinstance(record, dict) or not isinstance(record.get("model", {}), dict):
        raise UsageError(f"{path}: not a routetune run record; delete it, or run "
                         "`routetune tune` again to rewrite it")
    return record


def refuse_links(outdir: Path, label: str = "--output ") -> None:
    """Refuse an output directory that holds a symbolic or hard link anywhere inside it.

    routetune never makes links in its folders, and it writes, appends to and
    truncates files there (the lock file, logs, the winner's files); a link planted in a
    folder from elsewhere would make it write outside the folder (SECURITY.md). The
    folder itself may be a link: that is the user's own choice.

    Raises:
        UsageError: A link inside `outdir`, named, with the fix.
    """
    for root, dirs, files in os.walk(outdir):  # links to folders are listed, not entered
        for name in (*dirs, *files):
            entry = Path(root) / name
            if entry.is_symlink() or (name in files and entry.lstat().st_nlink > 1):
                raise UsageError(
                    f"{label}{outdir}: {entry} is a symbolic or hard link, which "
                    "routetune never makes (a folder from elsewhere may hold links that "
                    "lead out of it); remove it" + (", or choose another --output"
                                                    if label else ""))
