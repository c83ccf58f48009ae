"""External data: models whose weights live in files beside the ``.onnx`` file.

A protobuf message cannot exceed 2 GiB, so larger models keep their initializers in
external data files (ONNX IR: ``TensorProto.data_location = EXTERNAL`` with
``location``, ``offset`` and ``length`` entries, the location relative to the model's
folder; https://onnx.ai/onnx/repo-docs/ExternalData.html). Such a model is never held
as one serialized message here:

- `prepare` reads the graph without its data, checks every data file and hashes the
  model file and its data by streaming (`source_sha256`);
- the run copies each external tensor once into a content-addressed store,
  ``OUTDIR/artifacts/models/weights/<sha256>.bin`` (`adopt`), so that every candidate
  model under ``artifacts/models/`` is a small ``.onnx`` file whose locations
  (``weights/<sha256>.bin``) resolve there, and two candidates share unchanged weights;
- passes see the weights through onnx-graphsurgeon's lazy values, read from that store
  only when a pass asks for them (`import_graph`); what a pass writes is moved to the
  store before the model is serialized (`externalize`);
- ONNX Runtime and TensorRT open candidates from their path, next to ``weights/``;
- a winner is written as ``winner.onnx`` plus one ``winner.onnx.data`` (`save_standalone`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto
from onnx_graphsurgeon.ir.tensor import LazyValues

WEIGHTS = "weights"
"""The store's folder, beside the candidate models (``artifacts/models/weights``)."""

MIN_EXTERNAL_BYTES = 1024
"""Tensors of at least this many bytes are kept external: ``onnx.save_model``'s default
``size_threshold``."""

CHUNK = 16 * 2**20
"""Bytes read at a time when hashing or copying data files (16 MiB)."""


def tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every initializer of the model, in subgraphs too."""
    def visit(graph: onnx.GraphProto) -> Iterator[TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    yield from visit(attr.g)
                for sub in attr.graphs:
                    yield from visit(sub)
                if attr.HasField("t"):
                    yield attr.t
    return visit(model.graph)


def is_external(tensor: TensorProto) -> bool:
    """Whether the tensor's data lives in an external file."""
    return tensor.data_location == TensorProto.EXTERNAL


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of the model lives in an external file."""
    return any(is_external(t) for t in tensors(model))


def locations(model: onnx.ModelProto) -> set[str]:
    """The external data files the model names, relative to the folder it is read from."""
    return {_entry(t)[0] for t in tensors(model) if is_external(t)}


def _entry(tensor: TensorProto) -> tuple[str, int, int | None]:
    """A tensor's external ``location``, ``offset`` (bytes) and ``length`` (None: to the end)."""
    info = {e.key: e.value for e in tensor.external_data}
    length = info.get("length")
    return info.get("location", ""), int(info.get("offset", 0)), (
        int(length) if length is not None else None)


def _set_entry(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def source_sha256(path: Path, model: onnx.ModelProto) -> str:
    """sha256 of the model file followed by each of its data files once (in order of use).

    Read in `CHUNK` pieces: the model is never held twice in memory. For a model
    without external data it is the file's sha256.
    """
    digest = hashlib.sha256()
    files = [path] + [path.parent / loc for loc in dict.fromkeys(
        _entry(t)[0] for t in tensors(model) if is_external(t))]
    for file in files:
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _store(data: bytes | Iterable[bytes], store: Path) -> tuple[str, int]:
    """Write bytes to ``store/weights/<sha256>.bin`` (atomically, once); location and length.

    Streamed to a temporary file while hashed, then renamed: never held whole. The new
    file always takes the name, so a file already there under that hash (damaged, or
    planted in a shared output folder) is never read in its place; a reader that has
    the old file open keeps its own copy (a rename replaces the entry, not the inode).
    """
    folder = store / WEIGHTS
    folder.mkdir(parents=True, exist_ok=True)
    digest, length = hashlib.sha256(), 0
    tmp = folder / f".{os.getpid()}.{time.monotonic_ns()}.tmp"
    with open(tmp, "wb") as f:
        for part in ([data] if isinstance(data, bytes) else data):
            digest.update(part)
            f.write(part)
            length += len(part)
    name = f"{digest.hexdigest()}.bin"
    tmp.replace(folder / name)  # even over a file of that name: it may be planted
    return f"{WEIGHTS}/{name}", length


def _read(file: Path, offset: int, length: int | None) -> Iterator[bytes]:
    with open(file, "rb") as f:
        f.seek(offset)
        left = length if length is not None else -1
        while left:
            chunk = f.read(CHUNK if left < 0 else min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk


def adopt(model: onnx.ModelProto, base: Path, store: Path) -> None:
    """Copy every external tensor from `base` into the store, in place.

    Args:
        model: A model read without its external data; its locations are rewritten to
            ``weights/<sha256>.bin``, relative to `store`.
        base: The folder the model's locations are relative to now.
        store: The folder of the candidate models (``artifacts/models``).
    """
    for tensor in tensors(model):
        if is_external(tensor):
            location, offset, length = _entry(tensor)
            new, size = _store(_read(base / location, offset, length), store)
            _set_entry(tensor, new, 0, size)


def externalize(model: onnx.ModelProto, store: Path,
                min_bytes: int = MIN_EXTERNAL_BYTES) -> None:
    """Move each tensor of at least `min_bytes` of raw data into the store, in place.

    Afterwards the model serializes small; its locations are relative to `store`.
    """
    for tensor in tensors(model):
        if not is_external(tensor) and tensor.HasField("raw_data") and (
                len(tensor.raw_data) >= min_bytes):
            location, size = _store(tensor.raw_data, store)
            tensor.ClearField("raw_data")
            _set_entry(tensor, location, 0, size)


class StoredValues(LazyValues):
    """onnx-graphsurgeon's lazy values, read from a given folder instead of the cwd."""

    def __init__(self, tensor: TensorProto, base: Path) -> None:
        super().__init__(tensor)
        self.base = base

    def load(self):  # noqa: ANN201 - numpy array, as LazyValues.load
        """Read the tensor's values from its external file under `base`.

        A plain numeric tensor is read straight into its array (``numpy.fromfile``): one
        copy in memory, where going through a ``TensorProto`` held three at once.
        """
        import numpy as np

        location, offset, length = _entry(self.tensor)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)
        count = int(np.prod(self.tensor.dims, dtype=np.int64))
        if dtype.kind in "fiub" and dtype.isbuiltin and (
                length is None or length == count * dtype.itemsize):
            array = np.fromfile(self.base / location, dtype=dtype.newbyteorder("<"),
                                count=count, offset=offset)
            if array.size != count:
                raise ValueError(f"tensor '{self.tensor.name}': {self.base / location} holds "
                                 f"{array.size} of its {count} values")
            return array.astype(dtype, copy=False).reshape(tuple(self.tensor.dims))
        copy = TensorProto()
        copy.CopyFrom(self.tensor)
        onnx.external_data_helper.load_external_data_for_tensor(copy, str(self.base))
        copy.data_location = TensorProto.DEFAULT
        del copy.external_data[:]
        return np.array(onnx.numpy_helper.to_array(copy))


def import_graph(model: onnx.ModelProto, store: Path | None) -> gs.Graph:
    """`gs.import_onnx`, with external tensors read from `store` when a pass asks.

    Tensors that no pass reads are exported again as they came (still external):
    untouched weights are never loaded.
    """
    graph = gs.import_onnx(model)
    if store is not None:
        _lazy_from(graph, store)
    return graph


def _lazy_from(graph: gs.Graph, store: Path) -> None:
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if isinstance(values, LazyValues) and not isinstance(values, StoredValues) and (
                is_external(values.tensor)):
            tensor._values = StoredValues(values.tensor, store)
    for node in graph.nodes:
        for value in node.attrs.values():
            for sub in (value if isinstance(value, list) else [value]):
                if isinstance(sub, gs.Graph):
                    _lazy_from(sub, store)


def save_standalone(model: onnx.ModelProto, store: Path | None, path: Path) -> None:
    """Write a model as `path`, with its external tensors in one ``<name>.data`` beside it.

    Data is copied in `CHUNK` pieces, never loaded whole. `model` is not changed.

    Args:
        model: A model whose external locations are relative to `store`.
        store: The folder its locations are relative to; None when it has none.
        path: The ``.onnx`` file to write (``winner.onnx``).
    """
    if store is None or not has_external_data(model):
        path.write_bytes(model.SerializeToString())
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data_path = path.with_name(path.name + ".data")
    offset = 0
    with open(data_path, "wb") as out:
        for tensor in tensors(copy):
            if not is_external(tensor):
                continue
            location, start, length = _entry(tensor)
            pad = -offset % 4096  # aligned, as onnx.save_model aligns large tensors
            out.write(b"\0" * pad)
            offset += pad
            size = 0
            for chunk in _read(store / location, start, length):
                out.write(chunk)
                size += len(chunk)
            _set_entry(tensor, data_path.name, offset, size)
            offset += size
    path.write_bytes(copy.SerializeToString())


def intact(model: onnx.ModelProto, store: Path) -> bool:
    """Whether every external tensor of `model` is in `store` under its own sha256.

    The store's files are named by their content's hash (`_store`); a file whose bytes
    no longer hash to its name was damaged or planted. Each file is hashed once,
    streamed in `CHUNK` pieces.

    Args:
        model: A model under ``artifacts/models/``, read without its external data.
        store: That folder.
    """
    for location in dict.fromkeys(_entry(t)[0] for t in tensors(model) if is_external(t)):
        name = Path(location)
        if name.parent != Path(WEIGHTS) or name.suffix != ".bin":
            return False
        digest = hashlib.sha256()
        try:
            for chunk in _read(store / name, 0, None):
                digest.update(chunk)
        except OSError:
            return False
        if digest.hexdigest() != name.stem:
            return False
    return True


def copy_model(src: Path, dest: Path) -> None:
    """Copy a model file out of a run: as is, or with its weights as ``<dest>.data``.

    Args:
        src: A model under ``artifacts/models/`` (its locations relative to its folder).
        dest: The file to write (``winner.onnx``, ``built.onnx``).
    """
    model = onnx.load(str(src), load_external_data=False)
    if has_external_data(model):
        save_standalone(model, src.parent, dest)
    else:
        dest.write_bytes(src.read_bytes())


