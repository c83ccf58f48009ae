"""The typed per-route stash: typed keys, copies, and what may travel to other workers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from routetune.stash import Codec, Stash, StashContext, StashKey


@dataclass(frozen=True)
class Note:
    text: str


NOTE: StashKey[Note] = StashKey("test.note", Codec(lambda note, ctx: {"text": note.text},
                                                   lambda data, ctx: Note(data["text"])))
LOCAL: StashKey[int] = StashKey("test.local")  # no codec: stays in its worker


class Context:
    """A `StashContext` without models (the codecs here keep none)."""

    registry: Any = None

    def keep(self, data: bytes) -> str:
        raise AssertionError("not used")

    def stored(self, digest: str) -> bytes:
        raise AssertionError("not used")

    def graph(self, data: bytes) -> Any:
        raise AssertionError("not used")

    def serialized(self, graph: Any) -> bytes:
        raise AssertionError("not used")


def test_values_are_found_by_their_key_and_a_copy_leaves_the_prefix_alone() -> None:
    stash = Stash()
    assert stash.get(NOTE) is None and NOTE not in stash
    with pytest.raises(KeyError):
        stash[NOTE]
    stash[NOTE] = Note("fp16 of 12 nodes")
    route = stash.copy()
    route[NOTE] = Note("redone")
    assert stash[NOTE] == Note("fp16 of 12 nodes") and route[NOTE] == Note("redone")
    assert list(stash) == [NOTE] and len(stash) == 1


def test_only_keys_with_a_codec_travel_and_as_json_data() -> None:
    context: StashContext = Context()
    stash = Stash({NOTE: Note("a")})
    encoded = stash.encode(context)
    assert json.loads(json.dumps(encoded)) == {"test.note": {"text": "a"}}
    assert Stash.decode(encoded, context)[NOTE] == Note("a")
    stash[LOCAL] = 3
    assert stash.encode(context) is None  # the prefix is not shared: built again
    with pytest.raises(KeyError):
        Stash.decode({"test.unknown": {}}, context)  # a key no loaded plugin defines
