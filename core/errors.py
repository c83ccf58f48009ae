"""The error hierarchy. Every error routetune raises on purpose is a `RoutetuneError`.

The CLI prints a `UsageError` as one line, ``<input>: <problem>; <fix>``, and exits
with code 2 and no traceback (pytest's ``UsageError`` convention). When one input has
several problems (a recipe's fields), each is a line of its own below it.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from pathlib import Path


class RoutetuneError(Exception):
    """Base class of every error routetune raises on purpose."""


class UsageError(RoutetuneError):
    """Bad user input: a file, a flag or an expression. Shown as one line, exit code 2.

    Args:
        message: The line.
        problems: Each problem of the input, when there are several: shown one per
            line below `message`, indented.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__("\n  ".join([message, *problems]))
        self.problems = tuple(problems)

    def lines(self) -> list[str]:
        """The message, then each problem, each on one line (whitespace runs joined)."""
        return [" ".join(text.split()) for text in str(self).split("\n  ")] if (
            self.problems) else [" ".join(str(self).split())]


class PluginError(RoutetuneError):
    """A plugin failed to load, or registered something invalid or clashing."""


class SeasoningError(RoutetuneError):
    """A seasoning failed while it was applied to a route.

    Args:
        seasoning: The name of the seasoning that failed.
        applied: The route text of the steps applied before it.
        message: What went wrong.
    """

    def __init__(self, seasoning: str, applied: str, message: str) -> None:
        self.seasoning = seasoning
        self.applied = applied
        super().__init__(f"seasoning '{seasoning}' failed after '{applied}': {message}")


class PostconditionError(RoutetuneError):
    """A rewritten model failed the ONNX checker or changed its input/output signature."""


class BackendError(RoutetuneError):
    """A backend is unavailable, or rejected its options."""


class BuildError(BackendError):
    """A backend could not build an engine from a candidate model."""


class EngineNotRunnable(BackendError):
    """The engine was built, but this device or runtime cannot run it.

    The search records the trial as ``build-only`` with this message (for example
    TensorRT-RTX on a compute capability 9.0 GPU, or no GPU at all).
    """


class StorageError(RoutetuneError):
    """The trial store could not be opened, read or written."""


ONE_LINE = 400
"""Characters at most of a third-party message quoted in a one-line error."""


def one_line(error: BaseException | str, limit: int = ONE_LINE) -> str:
    """A message on one line, whole: its lines joined, shortened at a word with "…".

    Third-party messages (the ONNX checker's, ONNX Runtime's) span several lines; the
    first line alone can end mid-sentence ("input 'res' of node:").
    """
    text = " ".join(str(error).split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


class SeasoningCrashed(Exception):
    """A seasoning raised something other than `ValueError` or a routetune error."""

    def __init__(self, seasoning: str, applied: str, error: BaseException) -> None:
        super().__init__(f"seasoning '{seasoning}' crashed after '{applied}': "
                         f"{describe(error, where=True)}")


def describe(e: BaseException, where: bool = False) -> str:
    """One line about an exception: its type (unless a routetune error) and message.

    Args:
        e: The exception.
        where: Add the innermost traceback frame (file:line in function).
    """
    if isinstance(e, (RoutetuneError, SeasoningCrashed)):
        text = " ".join(str(e).split())
    elif isinstance(e, MemoryError):
        text = f"out of memory (MemoryError{': ' if str(e) else ''}{str(e)[:200]})"
    else:
        text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    frames = traceback.extract_tb(e.__traceback__) if where else []
    if frames:
        f = frames[-1]
        file = Path(f.filename)
        text += f" (at {file.parent.name}/{file.name}:{f.lineno} in {f.name})"
    return one_line(text, 600)


def with_flag_value(message: str, error: Exception, argv: list[str]) -> str:
    """The command-line framework's `message` on a bad flag value, with the value given.

    Typer's type checks say "Invalid value for '--time-budget': Input should be a valid
    number, …" without the value; this gives "… '--time-budget' 'abc': …".

    Args:
        message: The framework's message, on one line.
        error: Its exception (Click's ``BadParameter`` has the flag in ``param.opts``).
        argv: The command line's arguments, after the program name.

    Returns:
        `message`, with the value after the flag's name where it is not there already.
    """
    opts = getattr(getattr(error, "param", None), "opts", None) or []
    given = [arg.split("=", 1)[1] if "=" in arg else argv[i + 1] if i + 1 < len(argv) else None
             for i, arg in enumerate(argv) if arg.split("=", 1)[0] in opts]
    value = given[-1] if given else None
    named = f"Invalid value for '{opts[-1]}'" if opts else ""
    if value is None or not named or f"'{value}'" in message or named not in message:
        return message
    return message.replace(named, f"{named} '{value}'", 1)
