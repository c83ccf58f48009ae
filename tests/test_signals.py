"""`routetune.signals`: a stop that arrives while workers are spawned waits for the spawn."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from routetune import signals


@pytest.fixture
def handlers() -> Iterator[None]:
    """`signals.install`'s handlers for the test, the previous ones after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals.install()
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def other_thread() -> tuple[threading.Thread, threading.Event]:
    """A thread with SIGINT unblocked, as the handoff's server thread has it."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    return thread, done


@pytest.mark.parametrize(("signum", "said", "code"), [
    (signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_a_stop_taken_by_another_thread_is_raised_after_the_spawn(
        handlers: None, signum: int, said: str, code: int) -> None:
    """Python runs the handler in the main thread, wherever the kernel delivered the
    signal; in the middle of `multiprocessing`'s launch its KeyboardInterrupt left a
    child reading an empty pipe (``EOFError: Ran out of input``, a traceback on the
    terminal; CI, 2026-12-07)."""
    thread, done = other_thread()
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt), signals.spawning_quietly():
            assert thread.ident is not None
            signal.pthread_kill(thread.ident, signum)
            time.sleep(0.2)  # the handler would have run in this time
            steps.append("spawned")
    finally:
        done.set()
    assert steps == ["spawned"]
    assert signals.interrupted_by() == said and signals.exit_code() == code


def test_without_a_signal_nothing_is_raised_and_the_handlers_are_back(handlers: None) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with signals.spawning_quietly():
        pass
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert signals.interrupted_by() is None
