"""Ctrl-C and SIGTERM for ``routetune tune``: one stop that keeps the results, then a hard one.

`install` (called by the CLI, never by the API) makes the first SIGINT or SIGTERM raise
`KeyboardInterrupt`: the search stops as on a budget, the trials in flight are cancelled,
the best so far is confirmed and written. Signals that arrive within `SAME_PRESS_S` of
the one before are the same press: GNU ``timeout -s INT`` signals the child and then its
whole process group, and a terminal's Ctrl-C reaches every process of the foreground
group, so one request often arrives twice. A later signal stops at once: one line
on standard error, the exit code, and no cleanup (every stored trial is already a
committed SQLite transaction; the workers die with the process, `worker._die_with_parent`).

Worker processes must not see Ctrl-C at all (a traceback from each otherwise):
`spawning_quietly` blocks SIGINT while they are started, so that they start with it
blocked, and `worker.init` ignores it before unblocking it. It also holds back this
process's own stop until the workers are started: a stop raised in the middle of
``multiprocessing``'s launch, after the child is started and before it is sent what to
run, leaves the child reading an empty pipe (``EOFError: Ran out of input``, a traceback
on the terminal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

SAME_PRESS_S = 1.0
"""Signals closer together than this (seconds) count as one request to stop."""

_received: list[str] = []
_last: list[float] = []
_stored: list[Callable[[], int]] = []
_answered: list[bool] = []


def install(stored: Callable[[], int] | None = None) -> None:
    """Handle SIGINT and SIGTERM as above (main thread only).

    Args:
        stored: How many trials the store holds now, for the hard stop's line; it is
            called inside the signal handler, so it must only read memory.
    """
    _received.clear()
    _last.clear()
    _answered.clear()
    counting(stored)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def counting(stored: Callable[[], int] | None) -> None:
    """Set what the hard stop's line reports as the number of trials stored."""
    _stored[:] = [stored] if stored is not None else []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _last and now - _last[-1] < SAME_PRESS_S:
        return  # the same press, delivered again
    _last.append(now)
    _received.append("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")
    if len(_received) == 1:
        raise KeyboardInterrupt
    fresh_line = "\n" if os.isatty(2) else ""  # below a progress bar's last frame
    os.write(2, f"{fresh_line}routetune: stopped at once ({_received[-1]} again); "
                f"{_count()}; run the same command to resume\n".encode())
    os._exit(exit_code())


def _count() -> str:
    if not _stored:
        return "every finished trial is stored"
    n = _stored[0]()
    return f"{n} trial{'s' * (n != 1)} stored"


def answered() -> None:
    """Note that the interrupt was answered (the results of the trials so far written)."""
    _answered.append(True)


def unanswered() -> str | None:
    """The line for an interrupt that stopped the command before it could answer it."""
    if not _received or _answered:
        return None
    return (f"routetune: interrupted ({interrupted()}); {_count()}; run the same command "
            "to resume")


def interrupted_by() -> str | None:
    """``SIGTERM`` or ``Ctrl-C`` if the run was interrupted, else None."""
    return _received[0] if _received else None


def exit_now() -> None:
    """Exit with `exit_code` at once, standard streams flushed, without Python's shutdown.

    Python's shutdown gives SIGINT its default action back (a repeated press during it
    would kill the process with no word, exit -2), and waits for the worker processes,
    which the stored results do not need: they die with this process.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(exit_code())


def interrupted() -> str:
    """What interrupted the run: ``SIGTERM`` or ``Ctrl-C``."""
    return _received[0] if _received else "Ctrl-C"


def exit_code() -> int:
    """The shell's code for the signal that interrupted the run: 143 or 130."""
    return 128 + (signal.SIGTERM if interrupted() == "SIGTERM" else signal.SIGINT)


@contextlib.contextmanager
def spawning_quietly() -> Iterator[None]:
    """Block SIGINT in this thread while child processes (and threads) are started.

    A process spawned meanwhile, and a thread started meanwhile (pebble's pool manager,
    which starts replacement workers later), inherit the blocked signal. A SIGINT or
    SIGTERM that arrives meanwhile is not lost, but held back: another thread may take
    it from the kernel, yet Python runs its handler in the main thread, in the middle of
    the launch; so, in the main thread, the handler only notes it, and the handlers run
    on the way out, in the order the signals came (after the block's body, or after the
    exception that ends it).
    """
    from multiprocessing import resource_tracker

    # The tracker's first start unblocks SIGINT in this thread when it is done
    # (CPython's multiprocessing/resource_tracker.py, `ensure_running`): start it first,
    # with /dev/null as its standard error, since after a stop at once (`os._exit`) it
    # warns of the "leaked semaphore objects" that it then removes.
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    with _held_back():
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _held_back() -> Iterator[None]:
    """Note SIGINT and SIGTERM meanwhile; run their handlers after (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, FrameType | None]] = []
    handlers = {s: h for s in (signal.SIGINT, signal.SIGTERM)  # None: set outside Python
                if (h := signal.getsignal(s)) is not None}
    for signum in handlers:
        signal.signal(signum, lambda s, frame: held.append((s, frame)))
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for came, frame in held:
            handler = handlers[signal.Signals(came)]
            if callable(handler):
                handler(came, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(came)  # as it would have: the default action
