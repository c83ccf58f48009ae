"""What the executors with worker processes share: the job feed, the timeline, failures.

`routetune.execution.local_pool.LocalPool` (worker subprocesses on this machine) and
`routetune.plugins.ray.pool.RayPool` (Ray tasks and actors on a cluster) schedule the same
way and record the same things:

- `JobFeed`: jobs are pulled from the search lazily; a job whose model steps extend a
  running build's waits for it (to reuse its model), while up to `LOOKAHEAD` later jobs
  may start meanwhile.
- `Timeline`: every phase is one JSON line in ``artifacts/timeline.jsonl``.
- `timed_out` and `died`: the outcome of a phase that ran past ``--trial-timeout``, or
  whose worker died.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from routetune.candidate.records import Measured, Outcome
from routetune.errors import UsageError
from routetune.execution.executor import Job
from routetune.records.trial import Status
from routetune.registry import Registry

TIMELINE = "timeline.jsonl"
"""The phase log under ``OUTDIR/artifacts/`` (`Timeline`)."""

LOOKAHEAD = 16
"""Jobs pulled ahead at most, to find one that does not wait for a running build."""


class JobFeed:
    """The search's jobs, pulled only when one can start.

    Args:
        jobs: The search's job iterator (`routetune.execution.executor.Executor.run`).
    """

    def __init__(self, jobs: Iterator[Job]) -> None:
        self._jobs = jobs
        self.pending: list[Job] = []  # pulled, held while a running build makes their model
        self.more = True

    def next_ready(self, building: Iterable[Job]) -> Job | None:
        """The first job that extends none of `building`, pulling more as needed.

        Returns:
            The job, now taken from the feed; None when every held job waits for a
            running build (or `LOOKAHEAD` are held) or the search has no more.
        """
        building = list(building)
        while True:
            ready = next((j for j in self.pending
                          if not any(j.extends(b) for b in building)), None)
            if ready is not None:
                self.pending.remove(ready)
                return ready
            if not self.more or len(self.pending) >= LOOKAHEAD:
                return None
            pulled = next(self._jobs, None)
            if pulled is None:
                self.more = False
            else:
                self.pending.append(pulled)

    def exhausted(self) -> bool:
        """Whether every job has been taken and the search has no more."""
        return not self.more and not self.pending


class Timeline:
    """The phase log, ``OUTDIR/artifacts/timeline.jsonl``, one JSON object a line.

    Each: ``phase`` (``build``, ``measure``, or a final ``confirm``/``outputs`` call),
    ``route``, ``status``, ``start`` and ``end`` (Unix time, s, rounded to 0.1 ms),
    ``pid`` and ``gpu``; `RayPool` adds ``node`` (the Ray node's IP address).

    Args:
        outdir: The run's output directory.
    """

    def __init__(self, outdir: Path) -> None:
        self.path = outdir / "artifacts" / TIMELINE

    def add(self, event: dict[str, Any]) -> None:
        """Append one phase (``start`` and ``end`` are rounded here)."""
        event.update(start=round(event["start"], 4), end=round(event["end"], 4))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def timed_out(phase: str, timeout_s: float, fields: Measured, tail: str = ""
              ) -> Outcome:
    """The outcome of a phase that ran past ``--trial-timeout`` (its worker was killed).

    Args:
        phase: ``build`` or ``measure``.
        timeout_s: The timeout (s).
        fields: The trial's fields found so far.
        tail: What the worker last wrote, as ``"; stderr: …"``, or empty.
    """
    return Outcome(Status.TIMED_OUT, f"{phase} ran past --trial-timeout {timeout_s:g} s; "
                   f"the worker was killed{tail}", fields)


def died(phase: str, how: str, fields: Measured, tail: str = "") -> Outcome:
    """The ``crashed`` outcome of a phase whose worker died.

    Args:
        phase: ``build`` or ``measure``.
        how: How it died: `exit_text`, or the cluster's word for it.
        fields: The trial's fields found so far.
        tail: What the worker last wrote, as ``"; stderr: …"``, or empty.
    """
    return Outcome(Status.CRASHED, f"the {phase} worker died: {how}{tail}", fields)


def exit_text(code: int | None) -> str:
    """A worker's exit: ``signal SIGSEGV (exit code -11)`` or ``exit code 3``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exit code {code}"


def check_plugins_travel(registry: Registry) -> None:
    """Refuse plugins that worker processes cannot load (registered in this process only).

    Raises:
        UsageError: Some are, with their names and the two ways out.
    """
    added = registry.added()
    if added:
        raise UsageError(
            f"plugins registered in this process only ({', '.join(added)}) cannot be "
            "loaded by worker processes; install them as a package with a 'routetune' "
            "entry point, or run trials in this process (--in-process)")


TAIL_LINES = 6
"""Lines of a dead worker's stderr kept in the trial's reason."""


def log_tail(text: str, where: str) -> str:
    """What a worker wrote to a trial's log in its last phase, shortened for a reason.

    After a fatal signal, or the stack dump a worker writes just before its timeout,
    `faulthandler`'s first line and the innermost frames (it prints the most recent
    call first) of the thread that faulted, else of the main thread (listed last; a Ray
    worker has several threads); otherwise the last `TAIL_LINES` lines.

    Args:
        text: The trial's log (phases start with ``== HH:MM:SS pid N: …`` lines).
        where: Where the log is, for the reason (``log artifacts/logs/ab12.log``).

    Returns:
        ``"; stderr: … (WHERE)"``, or ``"; stderr empty (WHERE)"``.
    """
    lines = [line.strip() for line in text.rsplit("\n== ", 1)[-1].splitlines()[1:]]
    lines = [line for line in lines if line]
    fatal = [i for i, line in enumerate(lines)
             if line.startswith(("Fatal Python error", "Timeout ("))]
    if fatal:
        blocks: list[list[str]] = [[]]
        for line in lines[fatal[-1] + 1:]:
            if line.startswith(("Thread 0x", "Current thread 0x")):
                blocks.append([line])
            else:
                blocks[-1].append(line)
        block = next((b for b in blocks if b and b[0].startswith("Current thread")),
                     blocks[-1])
        frames = [line for line in block if line.startswith("File ")]
        lines = [lines[fatal[-1]], *frames[:2]]
    lines = lines[-TAIL_LINES:]
    if not lines:
        return f"; stderr empty ({where})"
    return f"; stderr: {' | '.join(lines)[-500:]} ({where})"
