"""Validation inputs: read from ``.npz`` files, or synthesised from the input specs.

Shapes use trtexec's spelling: ``--shapes x:1x3x320x320,mask:1x128``.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from routetune.errors import UsageError, one_line
from routetune.model.loading import TensorSpec
from routetune.options import OptionError

Feed = dict[str, np.ndarray]

MAX_INPUT_BYTES = 2 * 2**30
"""The largest synthesised input, 2 GiB: a guard against a typo in ``--shapes``."""

SYNTH_SEED = 0
SYNTH_SETS = 2
"""Synthesised inputs: two sets from ``numpy.random.default_rng(0)``. Floats are uniform
in [0, 1) and integers and booleans uniform in {0, 1}: Polygraphy's ``DataLoader``
default value range (polygraphy/comparator/data_loader.py, ``val_range=(0.0, 1.0)``),
chosen because it is safe for index-like integer inputs."""


def parse_shapes(text: str | None, flag: str = "--shapes") -> dict[str, tuple[int, ...]]:
    """Parse ``name:1x3x224x224[,name2:…]`` into a mapping.

    ``name:`` with no dims is a scalar (rank 0), such as a VAD's sample rate; a size may
    be 0 (an empty tensor).

    Raises:
        UsageError: A term is not ``name:dims`` with non-negative integer dims.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    if not text:
        return shapes
    for term in text.split(","):
        if term.strip().rpartition(":")[0] in shapes:
            raise UsageError(f"{flag} '{text}': input '{term.split(':')[0]}' given twice")
        name, sep, dims = term.strip().rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims.strip() else ()
        except ValueError:
            shape = (-1,)
        if not sep or not name or (shape and min(shape) < 0):
            raise UsageError(
                f"{flag} '{text}': cannot read '{term}'; write name:1x3x224x224 "
                "(name: for a scalar), several separated by commas"
            )
        shapes[name] = shape
    return shapes


def resolve_shapes(
    specs: Sequence[TensorSpec], given: Mapping[str, tuple[int, ...]], flag: str = "--shapes"
) -> dict[str, tuple[int, ...]]:
    """Fix every input's shape from the model and `flag` (``--shapes`` or another).

    A named dynamic dimension (``dim_param``) has one size in every input that names
    it: an input left out whose dynamic dimensions all appear in given inputs takes
    their sizes (``--shapes input_ids:2x128`` sizes a BERT export's
    ``attention_mask`` too), and the hint for one still unsized uses them.

    Raises:
        UsageError: An unknown input name, a wrong rank, a size that contradicts a fixed
            dimension, one named dimension given two sizes, or a dynamic dimension with
            no size given.
    """
    names = [s.name for s in specs]
    for name in given:
        if name not in names:
            raise UsageError(
                f"{flag}: the model has no input '{name}'; inputs: {', '.join(names)}"
            )
    conflict = shared_dim_conflict(specs, given)
    if conflict:
        raise UsageError(f"{flag}: {conflict}; give them one size (or feed the arrays "
                         "with --inputs, if the model runs on them)")
    known = _named_sizes(specs, given)
    given = {**{s.name: tuple(known[d] if isinstance(d, str) else d for d in s.shape)
                for s in specs if s.name not in given
                and all(isinstance(d, int) or d in known for d in s.shape)}, **given}
    unsized = [s for s in specs if s.name not in given
               and any(not isinstance(d, int) for d in s.shape)]
    if unsized:  # every one in the message, so that one retry is enough
        first = unsized[0]
        i = next(i for i, d in enumerate(first.shape) if not isinstance(d, int))
        more = (f" ({len(unsized)} inputs are dynamic)" if len(unsized) > 1 else "")
        raise UsageError(
            f"input '{first.name}' ({first}): dimension {i} ('{first.shape[i]}') is "
            f"dynamic{more}; give {'the sizes' if more else 'its size'} with {flag} "
            + ",".join(s.name + ":" + "x".join(str(known.get(d, 1)) if isinstance(d, str)
                                               else str(d) for d in s.shape)
                       for s in unsized)
            + " (1 stands for the size you want)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        shape = given.get(spec.name)
        if shape is None:
            shape = tuple(int(d) for d in spec.shape)
        _check_shape(spec, shape, flag)
        itemsize = spec.dtype.itemsize if spec.dtype is not None else 8  # not a tensor: a bound
        size = int(np.prod(shape, dtype=np.float64)) * itemsize
        if size > MAX_INPUT_BYTES:
            raise UsageError(
                f"{flag} {spec.name}:{'x'.join(map(str, shape))}: one input set would take "
                f"{size / 2**30:.1f} GiB; give smaller sizes (at most "
                f"{MAX_INPUT_BYTES // 2**30} GiB per input)"
            )
        shapes[spec.name] = shape
    return shapes


def shared_dim_conflict(specs: Sequence[TensorSpec],
                        shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The first named dynamic dimension given two sizes, described; None if none is.

    ONNX names a dynamic dimension (``dim_param``) so that every tensor with that name
    has the same size there, e.g. a BERT export's ``input_ids`` and ``attention_mask``
    share ``batch`` and ``sequence``. Unnamed dimensions have names of their own
    (`routetune.model.loading`), so they never conflict. Sizes given as shapes are
    refused up front (`resolve_shapes`); arrays fed with ``--inputs`` are not, since an
    exporter may reuse a name by mistake for a model that runs: a reference that
    fails says why.

    Args:
        specs: The model's inputs.
        shapes: The size of every input, as given (`resolve_shapes`) or as fed.
    """
    seen: dict[str, tuple[str, int]] = {}
    for spec in specs:
        shape = shapes.get(spec.name)
        if shape is None or len(shape) != len(spec.shape):
            continue
        for dim, size in zip(spec.shape, shape, strict=True):
            if isinstance(dim, int):
                continue
            where, first = seen.setdefault(dim, (spec.name, size))
            if first != size:
                if where == spec.name:
                    return (f"input '{spec.name}' names dimension '{dim}' twice but has "
                            f"sizes {first} and {size} there")
                return (f"inputs '{where}' and '{spec.name}' share dimension '{dim}' but have "
                        f"sizes {first} and {size} there")
    return None


def _named_sizes(specs: Sequence[TensorSpec],
                 shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The size of each named dynamic dimension in `shapes` (of the right rank)."""
    sizes: dict[str, int] = {}
    for spec in specs:
        shape = shapes.get(spec.name)
        if shape is not None and len(shape) == len(spec.shape):
            sizes.update((d, n) for d, n in zip(spec.shape, shape, strict=True)
                         if isinstance(d, str))
    return sizes


def _check_shape(spec: TensorSpec, shape: tuple[int, ...], source: str) -> None:
    if len(shape) != len(spec.shape):
        raise UsageError(
            f"{source}: input '{spec.name}' has rank {len(spec.shape)} ({spec}), "
            f"got shape {'x'.join(map(str, shape)) or 'scalar'}; give {len(spec.shape)} dims"
        )
    for i, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise UsageError(
                f"{source}: input '{spec.name}' dimension {i} is {got} but the model fixes "
                f"it at {want} ({spec}); use {want}"
            )


def synthesize(
    specs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]],
    seed: int = SYNTH_SEED, count: int = SYNTH_SETS,
) -> list[Feed]:
    """Make `count` seeded input sets (see `SYNTH_SETS` for the value ranges).

    Returns:
        One feed per set, each mapping input name to an array of the resolved shape.
    """
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    for _ in range(count):
        feed: Feed = {}
        for spec in specs:
            shape = shapes[spec.name]
            value: np.ndarray
            if np.issubdtype(spec.dtype, np.floating):
                value = rng.random(shape)
            else:
                value = rng.integers(0, 2, size=shape)
            feed[spec.name] = np.asarray(value, dtype=spec.dtype)  # rank 0 stays an array
        feeds.append(feed)
    return feeds


def load_npz(path: Path, specs: Sequence[TensorSpec]) -> list[Feed]:
    """Read validation inputs from one ``.npz`` file or a directory of them.

    Each file is one input set mapping input names to arrays. Files load with
    ``allow_pickle=False``; a string input is therefore given as a NumPy ``str`` array
    (dtype ``<U``) and handed to the runtime as the object array it takes, and a bfloat16,
    float8 or int4 input as its ``ml_dtypes`` array, which ``.npz`` stores as raw bytes,
    or as those bytes (``array.view(numpy.uint8)``; NumPy cannot load the ``<f1`` that
    float8 e5m2 arrays save as), read back as the model's type.

    Raises:
        UsageError: A missing path, an empty directory, a file that is not an ``.npz``,
            a missing or unknown input, or an array of the wrong dtype or shape.
    """
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise OptionError("inputs", f" {path}: no .npz files in this directory; add some")
    elif path.exists():
        files = [path]
    else:
        raise OptionError("inputs", f" {path}: no such file or directory")
    return [_load_one(f, specs) for f in files]


_UNREADABLE = (OSError, ValueError, EOFError, MemoryError, RuntimeError, NotImplementedError,
               zipfile.BadZipFile, zlib.error)
"""What NumPy and zipfile raise on a file that is not a readable ``.npz``: a bad zip, a
bad or pickled ``.npy`` member, a header that claims more memory than there is, a bad
deflate stream, an encrypted or unknown-compression member."""


def read_npz(path: Path, option: str = "inputs") -> dict[str, np.ndarray | bytes]:
    """The members of an ``.npz`` file, each read as an array where it is one.

    Args:
        path: The file.
        option: The option that named it (its API keyword), for the messages.

    Raises:
        UsageError: The file is not an ``.npz`` (a bare ``.npy`` included), a member
            is unreadable, or one would take more than `MAX_INPUT_BYTES`.
    """
    fix = "save with numpy.savez"
    if not path.is_file():  # a folder named x.npz, a FIFO (reading it never ends)
        raise OptionError(option, f" {path}: not a regular file; {fix}")
    try:
        data = np.load(path, allow_pickle=False)
    except _UNREADABLE as e:
        raise OptionError(option, f" {path}: not a readable .npz file ({one_line(e)}); "
                          f"{fix}") from e
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise OptionError(option, f" {path}: one .npy array, not an .npz file of named "
                          f"inputs; {fix}(path, name=array)")
    with data:
        assert data.zip is not None  # open until the with block ends
        for info in data.zip.infolist():
            if info.file_size > MAX_INPUT_BYTES:
                raise OptionError(option, f" {path}: {info.filename!r} takes "
                                  f"{info.file_size / 2**30:.1f} GiB; give inputs of at most "
                                  f"{MAX_INPUT_BYTES // 2**30} GiB each")
        try:
            return {k: data[k] for k in data.files}
        except _UNREADABLE as e:
            raise OptionError(option, f" {path}: not a readable .npz file ({one_line(e)}); "
                              f"{fix}") from e


def fed_names(path: Path) -> set[str]:
    """The input names an ``.npz`` file, or a folder of them, holds.

    Empty where a file cannot be read (`load_npz` says why later). Read from the zip's
    member names, without loading an array, so that the model's preparation knows
    which overridable initializers the user feeds.
    """
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    names: set[str] = set()
    for file in files:
        try:
            with zipfile.ZipFile(file) as archive:
                names.update(n.removesuffix(".npy") for n in archive.namelist())
        except (OSError, zipfile.BadZipFile):
            continue
    return names


def _load_one(path: Path, specs: Sequence[TensorSpec]) -> Feed:
    arrays: dict[str, np.ndarray] = {}
    for name, value in read_npz(path).items():
        if not isinstance(value, np.ndarray):  # a member that is not .npy: its raw bytes
            raise OptionError("inputs", f" {path}: {name!r} is not a NumPy array (not an .npy "
                              "member); save with numpy.savez")
        arrays[name] = value
    names = [s.name for s in specs]
    for extra in set(arrays) - set(names):
        raise OptionError(
            "inputs", f" {path}: {extra!r} is not a model input; inputs: {', '.join(names)}"
        )
    feed: Feed = {}
    for spec in specs:
        if spec.name not in arrays:
            raise OptionError(
                "inputs", f" {path}: missing input '{spec.name}' ({spec}); "
                f"add it with numpy.savez(..., {spec.name}=array)"
            )
        arr = arrays[spec.name]
        if spec.dtype is None:
            raise OptionError("inputs", f" {path}: input '{spec.name}' is a sequence or optional "
                              "value, which --inputs cannot give (tensors only)")
        if spec.dtype == np.dtype(object) and arr.dtype.kind == "U":
            arr = arr.astype(object)  # ONNX strings: NumPy str arrays, no pickle needed
        if arr.dtype.kind in "Vu" and spec.dtype.isbuiltin != 1 and (
                arr.dtype.itemsize == spec.dtype.itemsize):
            arr = arr.view(spec.dtype)  # bfloat16, float8, int4: .npz keeps their bytes
        if arr.dtype != spec.dtype:
            if spec.dtype.isbuiltin != 1:
                raise OptionError(
                    "inputs", f" {path}: input '{spec.name}' is {arr.dtype}, the model wants "
                    f"{spec.dtype}; save an ml_dtypes.{spec.dtype.name} array, or its bytes "
                    f"(array.view(numpy.uint{8 * spec.dtype.itemsize})), which routetune "
                    "reads as that type")
            if spec.dtype == np.dtype(object):
                raise OptionError(
                    "inputs", f" {path}: input '{spec.name}' is {arr.dtype}, the model wants "
                    "strings; save it as a NumPy str array (numpy.array([...], dtype=str))")
            raise OptionError(
                "inputs", f" {path}: input '{spec.name}' is {arr.dtype}, the model wants "
                f"{spec.dtype}; convert it with .astype(numpy.{spec.dtype})"
            )
        _check_shape(spec, tuple(arr.shape), f"--inputs {path}")
        feed[spec.name] = arr
    return feed
