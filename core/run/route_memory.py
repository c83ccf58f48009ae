"""A run's use of the route memory: which file, the prior its search starts from, what it adds.

``--memory`` (recipe ``search.memory``, keyword ``memory``) names the file; default:
``$ROUTETUNE_MEMORY``, else ``memory.sqlite`` in routetune's cache; ``off``: none. The
strategy is given the memory's prior before its first ask
(`routetune.search.strategy.Strategy.learn`), and after the confirmations every trial
of the run adds its lessons (`routetune.records.lessons.lessons_of`). A memory never
gives a figure or a verdict.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from routetune.errors import StorageError
from routetune.feeds.examples import cache_dir
from routetune.model.signature import ModelSignature
from routetune.records.lessons import lessons_of
from routetune.records.memory import FILENAME, RouteMemory
from routetune.records.prior import Prior
from routetune.records.trial import Trial
from routetune.run.preparation import Prepared
from routetune.run.run_spec import RunSpec

logger = logging.getLogger(__name__)

OFF = "off"


def default_path() -> Path:
    """The default route memory file.

    ``$ROUTETUNE_MEMORY`` if set (a team's shared file, say), else ``memory.sqlite`` in
    routetune's cache (`routetune.feeds.examples.cache_dir`).
    """
    env = os.environ.get("ROUTETUNE_MEMORY")
    return Path(env).expanduser() if env else cache_dir() / FILENAME


@dataclass
class MemoryUse:
    """The route memory of one run.

    Args:
        memory: The open file; None when off, or when the default file could not be
            opened (`note` says why).
        signature: The model's, as the run feeds it.
        note: One line for the run's header: the file and what it knows here, or why
            there is none.
    """

    memory: RouteMemory | None
    signature: ModelSignature
    note: str
    added: int = 0

    def prior(self, run: Prepared, device: str) -> Prior:
        """What the memory expects of each step here; empty without a memory.

        A file that turns out unreadable halfway is dropped with a note, not an error:
        a prior only orders the search.
        """
        if self.memory is None:
            return Prior()
        try:
            prior = self.memory.prior(self.signature, run.backend.name, device)
        except StorageError as e:
            self.note = f"not used: {e}"
            self.close()
            return Prior()
        self.note = f"{self.memory.path} · {prior.describe()}"
        return prior

    def teach(self, run: Prepared, trials: Sequence[Trial]) -> None:
        """Add what `trials` taught to the memory.

        A failure to write (a full disk) is logged, not raised: the run's own records
        are written already.
        """
        if self.memory is None:
            return
        lessons = lessons_of(trials, self.signature, run.backend.version(),
                             lambda t: run.constraint.margin(t.accuracy))
        try:
            self.added = self.memory.add(lessons)
        except StorageError as e:
            logger.warning("route memory not updated: %s", e)

    def close(self) -> None:
        """Close the file."""
        if self.memory is not None:
            self.memory.close()
            self.memory = None


def open_memory(opts: RunSpec, run: Prepared) -> MemoryUse:
    """The run's route memory, as ``--memory`` asks.

    Raises:
        StorageError: A file named with ``--memory`` is not a route memory or cannot be
            created (its message gives the fix). The default file failing is not an
            error: the run goes on without a memory, and says so.
    """
    signature = ModelSignature.of(run.model.proto, run.feeds[0] if run.feeds else {})
    if opts.memory == OFF:
        return MemoryUse(None, signature, "off (--memory off)")
    path = Path(opts.memory).expanduser() if opts.memory else default_path()
    try:
        return MemoryUse(RouteMemory.open(path), signature, str(path))
    except StorageError as e:
        if opts.memory:
            raise
        return MemoryUse(None, signature, f"not used: {e}")
