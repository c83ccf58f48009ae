"""Libraries a run loads because the user named them: custom ops, TensorRT plugins.

Custom-op libraries are for ONNX Runtime, plugin libraries for TensorRT.

A model whose operators no standard runtime has (``ai.onnx.contrib`` ops from
onnxruntime-extensions, a vendor's own domain) runs in ONNX Runtime once the shared
library that implements them is registered with each session
(``SessionOptions.register_custom_ops_library``). ``--custom-op-library`` names one; it is
checked here (`resolve`), hashed, recorded in ``run.json``, ``winner.toml`` and the report,
and registered with every ONNX Runtime session that routetune opens in a process that
calls `use`: the FP32 reference, each candidate, every worker and every fresh
confirmation process. ``--plugin-library`` names a TensorRT plugin library, checked and
recorded the same way, which the ``tensorrt`` backend loads into TensorRT's plugin
registry before each parse and each engine's deserialization (``in_use(PLUGINS)``).

A library is code. It is loaded only when the user names it (the command line, the API,
or a recipe the user runs); a stored run folder never loads one by itself: ``--resume``
needs the flag again, and `check_recorded` refuses a file whose sha256 is not the one
recorded.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routetune.digests import file_sha256
from routetune.errors import UsageError

CONTRIB = "ai.onnx.contrib"
"""onnxruntime-extensions' operator domain."""

EXTENSIONS_DOMAINS = frozenset({CONTRIB, "com.microsoft.extensions"})
"""The domains of onnxruntime-extensions' operators: its own, and the one its
pre/post-processing tools write (``DecodeImage``, ``EncodeImage``)."""

ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc",
                         "ai.onnx.preview.training"})
"""The operator domains ONNX Runtime's own kernels implement (onnxruntime/core/graph/
constants.h: kOnnxDomain and its alias, kMLDomain, kMSDomain, kMSNchwcDomain,
kPreviewTrainingDomain). An op of any other domain is a custom operator."""

CUSTOM_OPS = "custom_ops"
"""The kind of an ONNX Runtime custom-op library (``--custom-op-library``)."""

PLUGINS = "plugins"
"""The kind of a TensorRT plugin library (``--plugin-library``)."""

KINDS = {CUSTOM_OPS: "custom-op library", PLUGINS: "plugin library"}
"""Each kind, as the records key it, and in words."""

EXTENSIONS = "onnxruntime-extensions"
"""The name that stands for onnxruntime-extensions' own library, without a path."""

MAGIC = {b"\x7fELF": "ELF", b"\xfe\xed\xfa\xce": "Mach-O", b"\xfe\xed\xfa\xcf": "Mach-O",
         b"\xce\xfa\xed\xfe": "Mach-O", b"\xcf\xfa\xed\xfe": "Mach-O",
         b"\xca\xfe\xba\xbe": "Mach-O", b"MZ": "PE"}
"""The first bytes of a shared library, by format: ELF (Linux), Mach-O (macOS, the
universal one included), PE (Windows DLL)."""


def custom_ops(nodes: Iterable[Any]) -> list[str]:
    """The custom operators among `nodes`, sorted, as ``domain:op``.

    Args:
        nodes: ``onnx.NodeProto`` (``domain``, ``op_type``) or onnx-graphsurgeon nodes
            (``domain``, ``op``) of one graph level.
    """
    found = set()
    for node in nodes:
        domain = getattr(node, "domain", "") or ""
        if domain not in ORT_DOMAINS:
            found.add(f"{domain}:{getattr(node, 'op_type', None) or node.op}")
    return sorted(found)


@dataclass(frozen=True)
class Library:
    """A library file the user named, as checked.

    Args:
        named: As the user named it: a path, or `EXTENSIONS`.
        path: The file, absolute.
        sha256: The sha256 of its bytes, hex.
        kind: `CUSTOM_OPS` or `PLUGINS`.
    """

    named: str
    path: Path
    sha256: str
    kind: str = CUSTOM_OPS

    def record(self) -> dict[str, str]:
        """What ``run.json``, ``winner.toml`` and the report say of it."""
        return {"named": self.named, "path": str(self.path), "sha256": self.sha256}


def records(libraries: Iterable[Library]) -> dict[str, list[dict[str, str]]]:
    """What ``run.json`` and ``winner.toml`` say of `libraries`, by kind (empty kinds too)."""
    return {kind: [lib.record() for lib in libraries if lib.kind == kind] for kind in KINDS}


def resolve(names: Iterable[str], flag: str, kind: str = CUSTOM_OPS) -> tuple[Library, ...]:
    """Check each named library and hash it.

    Args:
        names: Paths; for `CUSTOM_OPS`, `EXTENSIONS` too, for onnxruntime-extensions'
            library.
        flag: The option as the user wrote it, for the error.
        kind: `CUSTOM_OPS` or `PLUGINS`.

    Returns:
        One `Library` per name, in order, each once.

    Raises:
        UsageError: A file missing, unreadable, not a shared library, or
            onnxruntime-extensions named but not installed (one line each: the file and
            the fix).
    """
    libraries: dict[Path, Library] = {}
    for named in names:
        path = (_extensions_path(flag) if named == EXTENSIONS and kind == CUSTOM_OPS
                else Path(named).expanduser())
        problem = _problem(path)
        if problem:
            raise UsageError(f"{flag} {named}: {problem}")
        path = path.resolve()
        libraries.setdefault(path, Library(named, path, file_sha256(path), kind))
    return tuple(libraries.values())


def _extensions_path(flag: str) -> Path:
    try:
        import onnxruntime_extensions
    except ImportError as e:
        raise UsageError(f"{flag} {EXTENSIONS}: onnxruntime-extensions is not installed; "
                         "pip install onnxruntime-extensions, or give its library's path"
                         ) from e
    return Path(onnxruntime_extensions.get_library_path())


def _problem(path: Path) -> str:
    """Why `path` cannot be a shared library to load, or ""."""
    if not path.exists():
        return "no such file; give the path of the shared library (.so, .dylib or .dll)"
    if not path.is_file():
        return "not a file; give the path of the shared library itself"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied); make it readable to this user"
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"cannot be read ({e.strerror}); make it readable to this user"
    if not any(head.startswith(m) for m in MAGIC):
        return ("not a shared library (it starts with neither ELF, Mach-O nor PE bytes); "
                "give the compiled library (.so, .dylib or .dll)")
    return ""


def check_recorded(record: Mapping[str, Any], given: Sequence[Library],
                   where: Path, flags: Mapping[str, str]) -> None:
    """Refuse to resume a run with other libraries than it recorded.

    Args:
        record: The folder's ``run.json``; its ``libraries`` lists, per kind
            (`CUSTOM_OPS`, `PLUGINS`), each library's ``named``, ``path`` and
            ``sha256``. Untrusted: entries of another shape are passed over.
        given: The libraries this run was given.
        where: The run folder, for the error.
        flags: Per kind, the option as the user wrote it.

    Raises:
        UsageError: A recorded library not given again, or given with another sha256.
    """
    libraries = record.get("libraries")
    by_path = {(lib.kind, str(lib.path)): lib for lib in given}
    for kind, words in KINDS.items():
        recorded = libraries.get(kind) if isinstance(libraries, dict) else None
        for old in recorded if isinstance(recorded, list) else ():
            if not isinstance(old, dict):
                continue
            lib = by_path.get((kind, str(old.get("path"))))
            if lib is None:
                raise UsageError(f"{where}: its run loaded {words} {old.get('path')} "
                                 f"(sha256 {str(old.get('sha256'))[:12]}…); a stored run "
                                 f"loads none by itself: give {flags[kind]} "
                                 f"{old.get('named')} again, or --fresh")
            if lib.sha256 != old.get("sha256"):
                raise UsageError(f"{flags[kind]} {lib.named}: sha256 {lib.sha256[:12]}… is "
                                 f"not the {str(old.get('sha256'))[:12]}… that "
                                 f"{where}/run.json recorded; the library changed since: "
                                 "tune again with --fresh (or give the recorded file)")


_in_use: tuple[Library, ...] = ()
_pinned: dict[Path, ctypes.CDLL] = {}


def use(libraries: Sequence[Library]) -> None:
    """Use `libraries` in every session, build and engine this process makes from now.

    Each file is hashed again first: one that changed since it was checked is refused.
    Each custom-op library is also loaded once here and kept loaded until the process
    ends: ONNX Runtime
    unloads a library when the last session that registered it is released
    (``RegisterCustomOpsLibrary_V2``, onnxruntime PR 14099), and onnxruntime-extensions
    0.15.2 loaded again after that crashes the process (a segmentation fault, seen here
    with ONNX Runtime 1.32). The pin keeps the loader's count above zero.

    Raises:
        UsageError: A library's file changed or went away since `resolve`.
    """
    global _in_use
    for lib in libraries:
        try:
            now = file_sha256(lib.path)
        except OSError as e:
            raise UsageError(f"{KINDS[lib.kind]} {lib.path}: cannot be read now "
                             f"({e.strerror}); it was there when the run started") from e
        if now != lib.sha256:
            raise UsageError(f"{KINDS[lib.kind]} {lib.path}: its sha256 changed while the "
                             "run went on; leave the file alone during a run")
        if lib.kind == CUSTOM_OPS and lib.path not in _pinned:
            _pinned[lib.path] = ctypes.CDLL(str(lib.path))
    _in_use = tuple(libraries)


def in_use(kind: str = CUSTOM_OPS) -> tuple[Library, ...]:
    """The libraries of `kind` this process uses (`use`).

    The custom-op libraries registered with each ONNX Runtime session, or TensorRT's
    plugin libraries.
    """
    return tuple(lib for lib in _in_use if lib.kind == kind)
