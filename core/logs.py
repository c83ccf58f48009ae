"""Third-party output kept out of the terminal: it goes to a log file, whole.

ONNX Runtime, TensorRT, onnx-graphsurgeon and ONNX Runtime's quantizer write their own
lines: C++ logs on file descriptor 2, ``print`` calls (``[W] colored module is not
installed``), and ``logging.warning`` on the root logger (``WARNING:root:The original
model opset version is 17 …``). Ahead of routetune's one-line error, they bury it.
`captured` sends file descriptors 1 and 2, and so every one of these, to a log file
while a phase runs; the one-line error then names that file.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOGS = Path("artifacts") / "logs"
"""Where, under the output directory, the trial and build logs are written."""


@contextmanager
def captured(log: Path, what: str, restore: bool = True) -> Iterator[Path]:
    """Send file descriptors 1 and 2 to `log` (appended) while the block runs.

    A header line ``== HH:MM:SS pid N: <what>`` starts each capture.

    Args:
        log: The log file; its folder is made.
        what: What runs, for the header (``build fp16``).
        restore: Give the terminal its descriptors back afterwards. A worker process
            keeps writing to its last log instead (False), so that a library's thread
            that prints between two tasks still writes to a log.

    Yields:
        `log`.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2)) if restore else None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(f"== {time.strftime('%H:%M:%S')} pid {os.getpid()}: {what}\n".encode())
        f.flush()
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield log
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if saved is not None:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def quietly(what: str, call: Callable[[], T]) -> tuple[T, bytes]:
    """Run `call` with file descriptors 1 and 2 captured, before a log's folder is known.

    Preparing a run (loading the model, onnx-graphsurgeon's import and its ``[W] Could
    not convert: FLOAT8E5M2 …`` lines) happens before the output directory is chosen;
    what the libraries print meanwhile is returned, for `keep` to write into the run's
    log. If `call` raises, its output is dropped and the exception propagates.

    Returns:
        `call`'s result, and the captured output with its header line.
    """
    fd, name = tempfile.mkstemp(prefix="routetune-", suffix=".log")
    os.close(fd)
    path = Path(name)
    try:
        with captured(path, what):
            result = call()
        return result, path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def keep(log: Path, output: bytes) -> None:
    """Append output captured by `quietly` to `log` (its folder is made)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(output)
