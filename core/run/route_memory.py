"""A run's use of the route memory: which file, the prior its search starts from, what it adds.

``--memory`` (recipe ``search.memory``, keyword ``memory``) names the file; default:
``$ROUTETUNE_MEMORY``, else ``memory.sqlite`` in routetune's cache; ``off`` (as the
option or as ``$ROUTETUNE_MEMORY``): none. The file is checked before the search and
read once for the strategy's prior (`routetune.search.strategy.Strategy.learn`); it is
created, or written, only after the confirmations, when every trial of the run adds its
lessons (`routetune.records.lessons.lessons_of`). A run refused before that leaves no
memory file behind. A memory never gives a figure or a verdict.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routetune.errors import StorageError
from routetune.feeds.examples import cache_dir
from routetune.model.signature import ModelSignature
from routetune.options import OptionError
from routetune.records.lessons import lessons_of
from routetune.records.memory import FILENAME, RouteMemory
from routetune.records.prior import Prior
from routetune.records.trial import Trial
from routetune.run.preparation import Prepared
from routetune.run.run_spec import RunSpec

logger = logging.getLogger(__name__)

OFF = "off"
ENV = "ROUTETUNE_MEMORY"
FIX = "give another file, or off"
"""The end of a message about a memory file the user named (the option is named before)."""


def default_path() -> Path | None:
    """The default route memory file; None when ``$ROUTETUNE_MEMORY`` is ``off``.

    ``$ROUTETUNE_MEMORY`` if set (a team's shared file, say), else ``memory.sqlite`` in
    routetune's cache (`routetune.feeds.examples.cache_dir`).
    """
    env = os.environ.get(ENV)
    if env == OFF:
        return None
    return Path(env).expanduser() if env else cache_dir() / FILENAME


@dataclass
class MemoryUse:
    """The route memory of one run.

    Args:
        path: The file (absolute); None when the memory is off.
        signature: The model's, as the run feeds it.
        chosen_by: Where the choice came from, for messages: the option as the user
            wrote it, ``$ROUTETUNE_MEMORY``, or ``the default``.
        note: One line for the run's header: the file and what it knows here, or why
            there is none.
        used: False when off, or when the file could not be read (`note` says why).
    """

    path: Path | None
    signature: ModelSignature
    chosen_by: str
    note: str
    used: bool = True
    known: Prior = field(default_factory=Prior)
    added: int = 0

    def prior(self, run: Prepared, device: str) -> Prior:
        """What the memory expects of each step here; empty without a memory.

        A file that cannot be read is dropped with a note, not an error: a prior only
        orders the search.
        """
        if self.path is None or not self.used:
            return Prior()
        if not self.path.exists():
            self.note = f"{self.path} · nothing yet (the file is written when this run ends)"
            return Prior()
        try:
            store = RouteMemory.open(self.path, read_only=True)
            try:
                self.known = store.prior(self.signature, run.backend.name, device)
            finally:
                store.close()
        except StorageError as e:
            self.used, self.note = False, f"not used: {e}"
            return Prior()
        self.note = f"{self.path} · {self.known.describe()}"
        return self.known

    def teach(self, run: Prepared, trials: Sequence[Trial]) -> None:
        """Add what `trials` taught to the memory, creating its file if need be.

        A failure to write (a full disk) is logged and noted, not raised: the run's
        own records are written already.
        """
        if self.path is None or not self.used:
            return
        lessons = lessons_of(trials, self.signature, run.backend.version(),
                             lambda t: run.constraint.margin(t.accuracy))
        try:
            store = RouteMemory.open(self.path)
            try:
                self.added = store.add(lessons)
            finally:
                store.close()
        except StorageError as e:
            logger.warning("route memory not updated: %s", e)
            self.note += f"; not updated: {e}"

    def record(self) -> dict[str, Any]:
        """The memory's part of ``run.json`` (``search.memory``)."""
        return {"used": self.used, "path": None if self.path is None else str(self.path),
                "chosen_by": self.chosen_by, "note": self.note,
                "knew": {"lessons": self.known.lessons, "models": self.known.models,
                         "models_on_another_device": self.known.elsewhere,
                         "steps": len(self.known.steps),
                         "malformed_rows_skipped": self.known.skipped},
                "lessons_added": self.added}


def open_memory(opts: RunSpec, run: Prepared) -> MemoryUse:
    """The run's route memory, as ``--memory`` asks, checked; nothing is created yet.

    Raises:
        OptionError: A file named with ``--memory`` (or the recipe's field, or the
            keyword) is not a route memory, or could not be created (the message
            names the option and the fix). The default file, or
            ``$ROUTETUNE_MEMORY``'s, failing is not an error: the run goes on without
            a memory, and says so.
    """
    signature = ModelSignature.of(run.model.proto, run.feeds[0] if run.feeds else {})
    named = opts.memory is not None
    chosen_by = opts.spelled("memory") if named else (f"${ENV}" if ENV in os.environ
                                                      else "the default")
    if opts.memory == "":
        raise OptionError("memory", f": empty; {FIX}")
    if opts.memory == OFF or (not named and default_path() is None):
        return MemoryUse(None, signature, chosen_by, f"off ({chosen_by} off)", used=False)
    path = (Path(str(opts.memory)).expanduser() if named else default_path())
    assert path is not None
    path = path.absolute()
    problem = _problem(path)
    if problem is None:
        return MemoryUse(path, signature, chosen_by, str(path))
    if named:
        raise OptionError("memory", f" {problem}")
    return MemoryUse(path, signature, chosen_by, f"not used ({chosen_by}): {problem}",
                     used=False)


def _problem(path: Path) -> str | None:
    """Why `path` cannot serve as a route memory, with the fix; None if it can.

    Nothing is created: a run refused later leaves no memory file behind.
    """
    if path.exists() or path.is_symlink():
        try:
            RouteMemory.open(path, read_only=True, fix=FIX).close()
        except StorageError as e:
            return str(e)
        if not os.access(path, os.W_OK):
            return f"{path}: not writable (a search adds its lessons to it); {FIX}"
        return None
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{path}: cannot be created, {folder} is a file; {FIX}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{path}: cannot be created, {folder} is not writable; {FIX}"
    return None
