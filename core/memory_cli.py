"""``routetune memory``: show, export, merge and clear the route memory.

The file is the one ``routetune tune`` uses (`routetune.run.route_memory`): ``--memory
PATH`` names another. Sharing a memory is copying a file: ``export`` writes a compact
copy for a colleague, ``merge`` adds the well-formed lessons of theirs (an untrusted
file: a malformed row is skipped and counted), ``clear`` moves the file aside (it is
renamed, not deleted).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from routetune.errors import UsageError

# RouteMemory (and with it ONNX) is imported by each command: `routetune --help` stays fast.

app = typer.Typer(help="Show, export, merge or clear the route memory (what earlier "
                  "searches learned).", no_args_is_help=True)
console = Console(soft_wrap=True)  # a line with file paths is never broken inside one

MemoryPath = Annotated[Path | None, typer.Option(
    "--memory", help="The memory file (default: $ROUTETUNE_MEMORY, else memory.sqlite in "
    "routetune's cache).")]


FIX = "give another --memory PATH"


def _path(memory: Path | None) -> Path:
    """The memory file these commands work on.

    Raises:
        UsageError: The memory is off (``--memory off`` or ``$ROUTETUNE_MEMORY=off``).
    """
    from routetune.run.route_memory import ENV, OFF, default_path

    if memory is not None and str(memory) == OFF:
        raise UsageError("--memory off: these commands work on a memory file; give "
                         "--memory PATH")
    path = memory if memory is not None else default_path()
    if path is None:
        raise UsageError(f"${ENV} is off: these commands work on a memory file; give "
                         f"--memory PATH, or unset ${ENV}")
    return path


@app.command("show")
def show_command(memory: MemoryPath = None) -> None:
    """What the memory holds: lessons per backend and device, models, outcomes."""
    from routetune.records.memory import RouteMemory

    path = _path(memory)
    if not path.exists():
        console.print(f"{escape(str(path))}: no route memory yet (a search adds to it)")
        return
    store = RouteMemory.open(path, read_only=True, fix=FIX)
    try:
        lessons = list(store.lessons())
        skipped, rows = store.skipped, store.count()
    finally:
        store.close()
    table = Table(title=f"{escape(str(path))}: {len(lessons):,} lessons"
                  + (f" ({skipped:,} malformed rows skipped)" if skipped else ""))
    for column in ("backend", "device", "models", "lessons", "timed", "inaccurate", "failed",
                   "no-op"):
        table.add_column(column, justify="right" if column not in ("backend", "device")
                         else "left")
    groups: dict[tuple[str, str], Counter[str]] = {}
    models: dict[tuple[str, str], set[str]] = {}
    for lesson in lessons:
        key = (lesson.backend, lesson.device)
        groups.setdefault(key, Counter())[str(lesson.outcome)] += 1
        models.setdefault(key, set()).add(lesson.signature.key)
    for (backend, device), counts in sorted(groups.items()):
        table.add_row(escape(backend), escape(device), str(len(models[(backend, device)])),
                      str(sum(counts.values())),
                      *(str(counts[k]) for k in ("timed", "inaccurate", "failed", "no-op")))
    console.print(table)
    if rows > len(lessons) + skipped:
        console.print(f"{rows - len(lessons) - skipped:,} older rows not read (a search "
                      "reads the newest 200,000)")


@app.command("export")
def export_command(
    target: Annotated[Path, typer.Argument(help="A new file to write the copy to.")],
    memory: MemoryPath = None,
) -> None:
    """Write the memory's well-formed lessons to a new file to share."""
    from routetune.records.memory import RouteMemory

    path = _path(memory)
    if not path.is_file():
        raise UsageError(f"{path}: no route memory to export; run a search first, or give "
                         "--memory PATH")
    store = RouteMemory.open(path, read_only=True, fix=FIX)
    try:
        written, skipped = store.export(target)
    finally:
        store.close()
    console.print(f"exported {written:,} lessons of {escape(str(path))} to "
                  f"{escape(str(target))}"
                  + (f" ({skipped:,} malformed rows left out)" if skipped else ""))


@app.command("merge")
def merge_command(
    files: Annotated[list[Path], typer.Argument(help="Route memory files to add.")],
    memory: MemoryPath = None,
) -> None:
    """Add the lessons of other memory files (a colleague's export) to this one.

    Every file is checked and read before anything is written: all are merged, or none.
    """
    from routetune.records.memory import merge_into

    path = _path(memory)
    for other, (added, skipped) in zip(files, merge_into(path, files), strict=True):
        console.print(f"{escape(str(other))}: {added:,} new lessons"
                      + (f", {skipped:,} malformed rows skipped" if skipped else ""))


@app.command("clear")
def clear_command(memory: MemoryPath = None) -> None:
    """Start from an empty memory: the file is moved aside (renamed), not deleted."""
    from routetune.records.memory import RouteMemory
    from routetune.run.outdir import move_aside

    path = _path(memory)
    if path.exists():  # one that is not a memory is refused, not renamed
        RouteMemory.open(path, read_only=True, fix=FIX).close()
    moved = move_aside(path)
    console.print(f"{escape(str(path))}: " + (f"moved aside to {escape(str(moved))}" if moved
                                              else "no route memory to clear"))
