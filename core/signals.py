"""SIGTERM handled like Ctrl-C: what `timeout`, CI cancellation and Kubernetes send.

`routetune tune` installs `handle_sigterm`; the search then stops as it does on Ctrl-C
(`KeyboardInterrupt`): no new trial, the running ones cancelled, the best so far written.
"""

from __future__ import annotations

import signal
from types import FrameType

_received: list[str] = []


def handle_sigterm() -> None:
    """Raise `KeyboardInterrupt` on SIGTERM, as Python does on SIGINT (main thread only)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.append("SIGTERM")
    raise KeyboardInterrupt


def interrupted() -> str:
    """What interrupted the run: ``SIGTERM`` or ``Ctrl-C``."""
    return _received[-1] if _received else "Ctrl-C"


def exit_code() -> int:
    """The shell's code for the signal that interrupted the run: 143 or 130."""
    return 128 + (signal.SIGTERM if _received else signal.SIGINT)
