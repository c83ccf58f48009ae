"""The output directory: created and checked up front, locked while a run uses it.

One run at a time per directory: a second run on the same directory is refused with
a clear message instead of racing the first for the trial store.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from routetune.options import OptionError
from routetune.records.run_record import refuse_links

LOCK_NAME = ".routetune.lock"


def make_outdir(output: Path | None, model_path: Path, model_sha256: str = "",
                backend: str = "", created: list[Path] | None = None) -> Path:
    """Create the output directory and check that it can be written.

    Args:
        output: ``--output``, or None for the default folder.
        model_path: The model, for the default name.
        model_sha256: The model file's sha256, for the default name.
        backend: The backend's name, for the default name.
        created: Gets each folder this call created, the deepest last, so that a run
            refused later can remove them again (`remove_empty`).

    Returns:
        `output`, or ``routetune-out/<model stem>-<sha256[:8]>-<backend>``: one folder per
        model and backend, so that two models with the same file name (every Hugging
        Face Optimum export is ``model.onnx``) or two backends never share one.

    Raises:
        UsageError: An empty path, a directory that cannot be created or written, one
            that holds a symbolic link (`refuse_links`), or one that holds other files
            and no routetune run (`refuse_foreign`).
    """
    if output is not None and not str(output).strip():
        raise OptionError("output", " '': empty path; give a directory name")
    name = "-".join(filter(None, (model_path.stem, model_sha256[:8], backend)))
    outdir = output if output is not None else Path("routetune-out") / name
    new = [p for p in (outdir, *outdir.parents) if not p.exists()]
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        if created is not None:
            created.extend(reversed(new))
    except OSError as e:
        raise OptionError(
            "output", f" {outdir}: cannot create or write this directory ({e.strerror}); "
            "choose a directory you can write"
        ) from e
    refuse_links(outdir)  # before anything is written there
    refuse_foreign(outdir)
    try:
        probe = outdir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OptionError(
            "output", f" {outdir}: cannot create or write this directory ({e.strerror}); "
            "choose a directory you can write"
        ) from e
    return outdir


def remove_empty(created: list[Path]) -> None:
    """Remove the folders `make_outdir` created (`created`) that are still empty.

    A refused run (bad input, exit 2) leaves no empty output folder behind; a folder
    that holds anything stays.
    """
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty one


def remove_refused(outdir: Path, created: tuple[Path, ...] | list[Path]) -> None:
    """Remove the output folder of a run refused after it was made (`created`).

    A run refused once it holds its folder (an all-NaN reference, an empty input) has
    written its lock, its logs and its prepared model there, nothing recorded; the
    folder goes, with the folders made for it. A folder this run did not create, or one
    that holds a trial store or a run record (`RECORDS`, a backend's of a run of
    several included), stays as it is.
    """
    if outdir not in created or not outdir.is_dir():
        return
    if any(path.name in RECORDS for path in outdir.rglob("*")):
        return
    shutil.rmtree(outdir, ignore_errors=True)
    remove_empty(list(created))


RECORDS = ("trials.sqlite", "run.json")
"""What a run records in its folder: a folder that holds either is never removed."""


MARKERS = ("trials.sqlite", "run.json", LOCK_NAME)
"""Files that only a routetune run leaves in its output directory."""


def refuse_foreign(outdir: Path) -> None:
    """Refuse an existing directory that holds files but no routetune run.

    A run writes ``run.json``, ``report.*``, ``winner.*`` and ``trials.sqlite`` into its
    directory, replacing files of those names: pointed at a folder of the user's own
    (``--output .``, or a recipe's ``output`` from someone else), it could replace the
    user's files.

    Raises:
        UsageError: `outdir` is not empty and holds none of `MARKERS`.
    """
    with os.scandir(outdir) as entries:
        names = {e.name for e in entries}
    if names and not names & set(MARKERS):
        raise OptionError(
            "output", f" {outdir}: this folder holds other files and no routetune run; a run "
            "writes run.json, report.* and winner.* there and could replace files of yours: "
            "choose a new or empty folder")


@contextmanager
def locked(outdir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `outdir` (``flock`` on ``.routetune.lock``) while inside.

    The lock goes with the process: a killed run leaves no stale lock behind.

    Raises:
        UsageError: Another run holds the lock.
    """
    path = outdir / LOCK_NAME
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            raise OptionError(
                "output", f" {outdir}: another routetune run (pid {owner}) is using this "
                "directory; wait for it to finish or choose another --output"
            ) from e
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def move_aside(store: Path) -> Path | None:
    """Rename a trial store (and its WAL files) to a free ``trials.<time>[-n].sqlite``.

    Any other file of a run (the phase timeline) is renamed the same way.

    Returns:
        The new path, or None when there was no store.
    """
    if not store.exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 0
    while True:
        name = f"{store.stem}.{stamp}{f'-{n}' if n else ''}{store.suffix}"
        target = store.with_name(name)
        if not any(Path(f"{target}{s}").exists() for s in ("", "-wal", "-shm")):
            break
        n += 1
    for suffix in ("-wal", "-shm", ""):  # the database last: it is what marks a store
        old = Path(f"{store}{suffix}")
        if old.exists():
            old.rename(f"{target}{suffix}")
    return target


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under `folder`, links not followed (as ``du -b``)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                st = os.lstat(os.path.join(root, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total
