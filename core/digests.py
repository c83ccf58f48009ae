"""sha256 digests of files, read in pieces: a file is never held whole in memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20
"""Bytes read at a time (1 MiB)."""


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex.

    Raises:
        OSError: The file cannot be read.
    """
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
