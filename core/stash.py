"""A typed per-route stash: what one seasoning leaves for a later one on the same route.

In the style of pytest's ``Stash`` (``_pytest/stash.py``): a plugin defines a
`StashKey` of the value's type, and the seasonings that share it read and write
``state.stash[KEY]``. Core never knows what is stored; precision-repair's protocol (a
precision seasoning's `Lowering`, ``routetune.passes.precision.lowering``) lives with
its passes.

A route prefix's state is kept on disk for the other workers of a search
(`routetune.candidate.artifacts.PrefixCache`); a key that can travel gives a `codec`. A
stash holding a value whose key has none is not shared: the prefix is built again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

T = TypeVar("T")


class StashContext(Protocol):
    """What a codec may use to keep a value on disk: models by sha256, the plugins."""

    registry: Any

    def keep(self, data: bytes) -> str:
        """Keep a serialized ONNX model; its sha256 (hex)."""

    def stored(self, digest: str) -> bytes:
        """The model kept under this sha256, checked against it."""

    def graph(self, data: bytes) -> Any:
        """A serialized model as an onnx-graphsurgeon graph, external data resolved."""

    def serialized(self, graph: Any) -> bytes:
        """An onnx-graphsurgeon graph as a serialized model."""


@dataclass(frozen=True)
class Codec(Generic[T]):
    """How a stash value is written as JSON data (never a pickle) and read back.

    Args:
        encode: The value as JSON-able data; models go through `StashContext.keep`.
        decode: The value again from that data.
    """

    encode: Callable[[T, StashContext], Any]
    decode: Callable[[Any, StashContext], T]


class StashKey(Generic[T]):
    """A typed key of a `Stash`.

    Args:
        name: What a prefix's index entry names it by; prefix it with your plugin's
            name (``"precision.lowering"``). A key defined again under one name (a
            module imported twice) replaces the first for decoding.
        codec: How the value travels to other workers; None: it does not.
    """

    known: ClassVar[dict[str, StashKey[Any]]] = {}

    def __init__(self, name: str, codec: Codec[T] | None = None) -> None:
        self.name = name
        self.codec = codec
        StashKey.known[name] = self

    def __repr__(self) -> str:
        return f"StashKey({self.name!r})"


class Stash:
    """Values by `StashKey`; ``stash[key]`` has the key's type.

    Raises:
        KeyError: ``stash[key]`` for a key that holds nothing (use `get`).
    """

    def __init__(self, values: Mapping[StashKey[Any], Any] | None = None) -> None:
        self._values: dict[StashKey[Any], Any] = dict(values or {})

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._values[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return self._values[key]  # type: ignore[no-any-return]

    def get(self, key: StashKey[T], default: T | None = None) -> T | None:
        """The value of `key`, or `default`."""
        return self._values.get(key, default)

    def __contains__(self, key: StashKey[Any]) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[StashKey[Any]]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def copy(self) -> Stash:
        """A shallow copy: a route goes on from a prefix without changing it."""
        return Stash(self._values)

    def encode(self, context: StashContext) -> dict[str, Any] | None:
        """The stash as JSON-able data by key name; None if a value cannot travel."""
        out = {}
        for key, value in self._values.items():
            if key.codec is None:
                return None
            out[key.name] = key.codec.encode(value, context)
        return out

    @classmethod
    def decode(cls, data: Mapping[str, Any], context: StashContext) -> Stash:
        """A stash from `encode`'s data.

        Raises:
            KeyError: A key name no loaded plugin defines.
            Exception: Whatever the key's codec raises on bad data.
        """
        stash = cls()
        for name, value in data.items():
            key = StashKey.known[name]
            if key.codec is None:
                raise KeyError(name)
            stash[key] = key.codec.decode(value, context)
        return stash
