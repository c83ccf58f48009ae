"""The FP32 reference from a file: outputs the user saved, instead of a run here.

``--reference-outputs`` is for a model that the reference runtime (ONNX Runtime on the
CPU) cannot run, such as one whose operators only a TensorRT plugin implements, or for a
reference that was checked elsewhere. It reads, as Polygraphy's ``--load-outputs`` does:

- an ``.npz`` file: one input set's outputs (output name to array), for a run of one
  input set;
- a folder of ``.npz`` files: one per input set, in name order, which is the order
  ``--inputs`` reads a folder of input sets in;
- a ``.json`` file of Polygraphy's saved run results (``polygraphy run
  --save-outputs``), read with Polygraphy's own loader
  (``polygraphy.comparator.RunResults.load``): one runner, one iteration per input set.

Names, dtypes, ranks and fixed dimensions are checked against the model's outputs, and
the number of sets against the input sets; a mismatch is one line. Values are not
checked: a wrong-valued reference leaves every route, the base route included, outside
the accuracy constraint, and the run says that its reference came from this file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routetune.errors import one_line
from routetune.feeds.inputs import read_npz
from routetune.model.loading import TensorSpec
from routetune.options import OptionError

OPTION = "reference_outputs"
POLYGRAPHY = "polygraphy"
"""The format name of Polygraphy's saved run results (``format`` in the records)."""


@dataclass(frozen=True)
class SavedReference:
    """The reference outputs read from the user's file, as checked.

    Args:
        path: The file or folder, absolute.
        sha256: Hex sha256 of the file's bytes; of a folder, of each ``.npz`` file's
            name and bytes in name order.
        format: ``npz`` or `POLYGRAPHY`.
        outputs: Per input set, output name to array, in the input sets' order.
    """

    path: Path
    sha256: str
    format: str
    outputs: tuple[dict[str, np.ndarray], ...]

    def record(self) -> dict[str, Any]:
        """What ``run.json``, ``winner.toml`` and the report say of it."""
        return {"path": str(self.path), "sha256": self.sha256, "format": self.format,
                "sets": len(self.outputs)}


def load_reference(path: Path, outputs: Sequence[TensorSpec], sets: int) -> SavedReference:
    """Read and check the reference outputs of `sets` input sets from `path`.

    Args:
        path: An ``.npz`` file, a folder of them, or Polygraphy's saved results (``.json``).
        outputs: The model's graph outputs.
        sets: The number of input sets the run judges on.

    Returns:
        The reference, its arrays as saved.

    Raises:
        OptionError: A missing path, an unreadable file, Polygraphy not installed for a
            ``.json`` file, several runners in it, a number of sets other than `sets`,
            or a set with a missing or unknown output, a non-array, or a dtype, rank or
            fixed dimension other than the model's (one line each).
    """
    path = path.expanduser().resolve()
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise OptionError(OPTION, f" {path}: no .npz files in this folder; save one per "
                              "input set with numpy.savez(path, output_name=array)")
        found = [_arrays(read_npz(f, OPTION), f) for f in files]
        digest = hashlib.sha256()
        for f in files:
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
        saved = SavedReference(path, digest.hexdigest(), "npz", tuple(found))
    elif not path.exists():
        raise OptionError(OPTION, f" {path}: no such file or folder")
    elif path.suffix.lower() == ".json":
        saved = SavedReference(path, _sha256(path), POLYGRAPHY, tuple(_polygraphy(path)))
    else:
        saved = SavedReference(path, _sha256(path), "npz",
                               (_arrays(read_npz(path, OPTION), path),))
    if len(saved.outputs) != sets:
        unit = "input set's outputs" if len(saved.outputs) == 1 else "input sets' outputs"
        raise OptionError(OPTION, f" {path}: holds {len(saved.outputs)} {unit}, and the run "
                          f"judges on {sets} input set{'s' * (sets != 1)}; save the outputs "
                          "of the same input sets as --inputs, one per set")
    for i, arrays in enumerate(saved.outputs):
        where = f"{path}" + (f" (input set {i + 1})" if sets > 1 else "")
        _check_set(arrays, outputs, where)
    return saved


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise OptionError(OPTION, f" {path}: cannot be read ({e.strerror})") from e


def _arrays(members: Mapping[str, np.ndarray | bytes], path: Path) -> dict[str, np.ndarray]:
    for name, value in members.items():
        if not isinstance(value, np.ndarray):
            raise OptionError(OPTION, f" {path}: {name!r} is not a NumPy array (not an .npy "
                              "member); save with numpy.savez")
    return dict(members)  # type: ignore[arg-type]


def _polygraphy(path: Path) -> list[dict[str, np.ndarray]]:
    """The iterations of the one runner in Polygraphy's saved run results."""
    try:
        from polygraphy.comparator import RunResults
        from polygraphy.logger import G_LOGGER
    except ImportError as e:
        raise OptionError(OPTION, f" {path}: Polygraphy's saved run results are read with "
                          "Polygraphy, which is not installed; pip install polygraphy") from e
    try:
        # Polygraphy logs what it loads, and its errors, to the terminal: the one line
        # below says it instead
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL), \
                contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            results = RunResults.load(str(path))
        runners = [(name, list(iterations)) for name, iterations in results.items()]
    except Exception as e:  # Polygraphy raises its own PolygraphyException, and JSON's
        raise OptionError(OPTION, f" {path}: not Polygraphy's saved run results "
                          f"({one_line(e, 200)}); save them with polygraphy run "
                          "--save-outputs FILE.json") from e
    if len(runners) != 1:
        names = ", ".join(name for name, _ in runners) or "none"
        raise OptionError(OPTION, f" {path}: holds the results of {len(runners)} runners "
                          f"({names}); save one runner's outputs (polygraphy run with one "
                          "runner, such as --onnxrt)")
    found = []
    for iteration in runners[0][1]:
        arrays = {name: np.asarray(value) for name, value in dict(iteration).items()}
        found.append(arrays)
    return found


def _check_set(arrays: Mapping[str, np.ndarray], outputs: Sequence[TensorSpec],
               where: str) -> None:
    names = [o.name for o in outputs]
    for extra in sorted(set(arrays) - set(names)):
        raise OptionError(OPTION, f" {where}: {extra!r} is not a model output; the "
                          f"outputs: {', '.join(names)}")
    for spec in outputs:
        if spec.name not in arrays:
            raise OptionError(OPTION, f" {where}: missing output '{spec.name}' ({spec}); "
                              f"save every output of the model")
        if spec.dtype is None:
            raise OptionError(OPTION, f" {where}: output '{spec.name}' is a sequence or "
                              "optional value; a saved reference holds tensors only")
        array = arrays[spec.name]
        if array.dtype != spec.dtype:
            raise OptionError(OPTION, f" {where}: output '{spec.name}' is {array.dtype}, "
                              f"the model gives {spec.dtype}; save the model's own outputs")
        if array.ndim != len(spec.shape) or any(
                isinstance(want, int) and want != got
                for want, got in zip(spec.shape, array.shape, strict=False)):
            got = "x".join(map(str, array.shape)) or "scalar"
            raise OptionError(OPTION, f" {where}: output '{spec.name}' has shape {got}, "
                              f"the model gives {spec}; save the model's own outputs")
