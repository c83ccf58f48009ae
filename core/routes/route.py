"""Routes: an ordered tuple of seasonings with parameters, after the preflight.

The canonical text reads like an MLIR pass pipeline or a trtexec build route::

    fold-constants,fuse-bn-into-conv,ort-opt-level{level=basic},ort-threads{intra_op=1}

Steps are separated by commas; parameters go in braces as ``name=value``, sorted by
name; the canonical form leaves out parameters at their default. Values are
``true``/``false``, integers, floats, bare words (``[A-Za-z0-9_.:/+-]``), JSON-quoted
strings, or lists in brackets (``[Softmax,Pow]``).
The route with no seasonings is written ``base``. `parse_route` reads the same text
back: ``parse_route(str(r)) == r``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from routetune.errors import UsageError
from routetune.seasoning import ParamValue

BASE_TEXT = "base"
_BARE = re.compile(r"[A-Za-z0-9_.:/+\-]+")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|[+-]?inf|nan")


@dataclass(frozen=True, order=True)
class Step:
    """One seasoning in a route, with its parameter values sorted by name.

    Args:
        name: The seasoning's name.
        params: ``(name, value)`` pairs, sorted by name.
    """

    name: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @classmethod
    def of(cls, name: str, params: Mapping[str, ParamValue] | None = None) -> Step:
        """Build a step from a mapping of parameter values."""
        return cls(name, tuple(sorted((params or {}).items())))

    def __str__(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={format_value(v)}" for k, v in self.params)
        return f"{self.name}{{{inner}}}"


@dataclass(frozen=True)
class Route:
    """An immutable, hashable sequence of steps applied after the backend's preflight.

    Args:
        steps: The seasonings in the order they run.
    """

    steps: tuple[Step, ...] = ()

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.steps) or BASE_TEXT

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    @property
    def names(self) -> tuple[str, ...]:
        """The seasoning names, in order."""
        return tuple(s.name for s in self.steps)

    @property
    def is_base(self) -> bool:
        """Whether this is the route with no seasonings."""
        return not self.steps


def parse_route(text: str) -> Route:
    """Parse route text into a `Route`, without checking names against a registry.

    Args:
        text: Canonical or hand-written route text, e.g. ``a,b{x=1,y=[p,q]}``.

    Returns:
        The route. ``""`` and ``"base"`` give the empty route.

    Raises:
        UsageError: The text does not parse; the message shows where.
    """
    text = text.strip()
    if text in ("", BASE_TEXT):
        return Route()
    parser = _Parser(text)
    steps = [parser.step()]
    while parser.peek() == ",":
        parser.pos += 1
        steps.append(parser.step())
    parser.expect_end()
    return Route(tuple(steps))


def parse_value(text: str, where: str) -> ParamValue:
    """Parse one parameter value as route text writes it (``1``, ``on``, ``[a,b]``).

    Raises:
        UsageError: The text is not one value; the message starts with `where`.
    """
    parser = _Parser(text)
    try:
        value = parser.value()
        parser.expect_end()
    except UsageError as e:
        raise UsageError(f"{where}: cannot read value '{text}' (write 1, on, \"text\" or "
                         f"[a,b]): {str(e).split(': ', 1)[-1]}") from e
    return value


def format_value(value: ParamValue) -> str:
    """A parameter value as route text writes it (``true``, ``[a,b]``, a quoted string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if _BARE.fullmatch(value) and parse_scalar(value) == value:
        return value
    return json.dumps(value)


def parse_scalar(word: str) -> ParamValue:
    """Read one bare word as route text does: ``true``/``false``, int, float, or str."""
    if word in ("true", "false"):
        return word == "true"
    if _INT.fullmatch(word):
        return int(word)
    if _FLOAT.fullmatch(word):
        return float(word)
    return word


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, problem: str) -> UsageError:
        return UsageError(
            f"route '{self.text}': {problem} at character {self.pos + 1}; "
            "write steps as name or name{param=value,...}, separated by commas"
        )

    def peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect_end(self) -> None:
        if self.peek():
            raise self.fail(f"unexpected {self.peek()!r}")

    def word(self) -> str:
        self.peek()
        match = _BARE.match(self.text, self.pos)
        if not match:
            raise self.fail("expected a name or a value")
        self.pos = match.end()
        return match.group()

    def step(self) -> Step:
        name = self.word()
        params: dict[str, ParamValue] = {}
        if self.peek() == "{":
            self.pos += 1
            while True:
                key = self.word()
                if self.peek() != "=":
                    raise self.fail(f"expected '=' after parameter '{key}'")
                self.pos += 1
                if key in params:
                    raise self.fail(f"parameter '{key}' given twice")
                params[key] = self.value()
                sep = self.peek()
                self.pos += 1
                if sep == "}":
                    break
                if sep != ",":
                    self.pos -= 1
                    raise self.fail("expected ',' or '}'")
        return Step.of(name, params)

    def value(self) -> ParamValue:
        head = self.peek()
        if head == "[":
            self.pos += 1
            items: list[ParamValue] = []
            if self.peek() == "]":
                self.pos += 1
                return ()
            while True:
                items.append(self.value())
                sep = self.peek()
                self.pos += 1
                if sep == "]":
                    return tuple(items)
                if sep != ",":
                    self.pos -= 1
                    raise self.fail("expected ',' or ']'")
        if head == '"':
            decoder = json.JSONDecoder()
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as e:
                raise self.fail(f"bad quoted string ({e.msg})") from e
            self.pos = end
            return str(value)
        return parse_scalar(self.word())
