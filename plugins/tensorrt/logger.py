"""A TensorRT logger that keeps the messages a failure is explained with."""

from __future__ import annotations

import functools
import logging
from typing import Any

logger_ = logging.getLogger(__name__)


@functools.cache
def _logger_class(trt: Any) -> type:
    class KeepingLogger(trt.ILogger):  # type: ignore[name-defined,misc]
        """Keeps warnings and errors, for failure messages; logs them at DEBUG level.

        A failure's message is its errors, not the warnings TensorRT logs on every build
        (``nbStreams -1 should not be negative`` for the default aux-stream count).
        """

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []
            self._errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            text = " ".join(msg.split())
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self._errors.append(text)
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                self.messages.append(text)
                logger_.debug("TensorRT: %s", text)

        def errors(self) -> str:
            return ("; ".join(self._errors[-3:]) or "; ".join(self.messages[-3:])
                    or "no message from TensorRT")

    return KeepingLogger


def make_logger(trt: Any) -> Any:
    """A TensorRT logger (``trt.ILogger``) whose ``errors()`` gives its last messages."""
    return _logger_class(trt)()
