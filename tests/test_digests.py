"""A file's sha256, read in pieces."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from routetune.digests import CHUNK, file_sha256


def test_it_is_the_sha256_of_the_whole_file_across_pieces(tmp_path: Path) -> None:
    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # two pieces and a part
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert file_sha256(empty) == hashlib.sha256(b"").hexdigest()


def test_a_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        file_sha256(tmp_path / "none")
