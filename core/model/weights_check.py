"""Checks of a model's external data before it is used.

Every data file present and readable, every tensor in bounds, inside the model's folder
(unless allowed), and the model valid with its data in place.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from routetune.errors import UsageError
from routetune.model.weights import _entry, has_external_data, is_external, tensors


def check_files(model: onnx.ModelProto, base: Path, path: Path,
                allow_outside: bool = False) -> None:
    """Check that every external tensor's file exists, is readable and long enough.

    A location must name a file inside `base` (relative, without ``..``, and not a
    symbolic link that leads out of it): a model from elsewhere must not make routetune
    read, and copy into an output folder, any file the user can read (SECURITY.md).

    Args:
        model: The model, read without its external data.
        base: The folder the locations are relative to (the model file's).
        path: The model file, for the message.
        allow_outside: Accept locations outside `base` (``--allow-external-data-outside``).

    Raises:
        UsageError: A location is empty, or leaves `base` without `allow_outside`; a
            file is missing or unreadable, or shorter than a tensor's offset plus length.
    """
    fix = "keep the data files next to the model, as onnx.save_model wrote them"
    inside = base.resolve()
    for tensor in tensors(model):
        if not is_external(tensor):
            continue
        name = repr(tensor.name)  # quoted and escaped: a name may hold a line break
        try:
            location, offset, length = _entry(tensor)
        except ValueError:
            location, offset, length = "", -1, None
        if offset < 0 or (length is not None and length < 0):
            raise UsageError(f"{path}: tensor {name} has an external data offset or length "
                             "that is not a number of bytes; save the model again with "
                             "onnx.save_model")
        if not location or "\0" in location:
            raise UsageError(f"{path}: tensor {name} has no usable external data location; "
                             "save the model again with onnx.save_model")
        file = base / location
        if not allow_outside and not file.resolve().is_relative_to(inside):
            raise UsageError(f"{path}: tensor {name} has the external data location "
                             f"{location!r}, which leads outside the model's folder {base}; "
                             "move the data file next to the model, or pass "
                             "--allow-external-data-outside if you trust this model")
        try:
            info = file.stat()
            if not stat.S_ISREG(info.st_mode):  # a FIFO blocks the open below forever
                raise UsageError(f"{path}: external data file {str(file)!r} is not a regular "
                                 f"file (tensor {name}); {fix}")
            with open(file, "rb"):
                pass
        except FileNotFoundError:
            raise UsageError(f"{path}: external data file {str(file)!r} is missing (tensor "
                             f"{name}); {fix}") from None
        except OSError as e:
            raise UsageError(f"{path}: cannot read external data file {str(file)!r} "
                             f"({e.strerror}); {fix}") from None
        if offset + (length or 0) > info.st_size:
            raise UsageError(f"{path}: external data file {str(file)!r} holds {info.st_size} "
                             f"bytes, but tensor {name} needs bytes "
                             f"{offset}–{offset + (length or 0)} (truncated?); {fix}")


def check_model(model: onnx.ModelProto, folder: Path | None,
                allow_outside: bool = False) -> None:
    """``onnx.checker.check_model(model, full_check=True)``, external data read in `folder`.

    The checker resolves an in-memory model's external data locations against the
    working directory and refuses symbolic links, so for a model with external data
    it runs with `folder` as the working directory (`resolving_in`), briefly.

    The checker also refuses locations outside that folder. With `allow_outside`
    (``--allow-external-data-outside``; `check_files` has checked the real files),
    it checks a copy whose locations name sparse stand-in files of the same sizes in a
    temporary folder, so the rest of its checks still run.

    Raises:
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: As the
            checker.
    """
    if not (allow_outside and folder is not None and has_external_data(model)):
        with resolving_in(folder if has_external_data(model) else None):
            onnx.checker.check_model(model, full_check=True)
        return
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    with tempfile.TemporaryDirectory(prefix="routetune-check-") as tmp:
        stand_ins: dict[str, str] = {}
        for tensor in tensors(proto):
            if not is_external(tensor):
                continue
            location = _entry(tensor)[0]
            if location not in stand_ins:
                stand_ins[location] = f"data{len(stand_ins)}.bin"
                with open(Path(tmp) / stand_ins[location], "wb") as f:
                    f.truncate((folder / location).stat().st_size)  # sparse: no disk used
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = stand_ins[location]
        with resolving_in(Path(tmp)):
            onnx.checker.check_model(proto, full_check=True)


@contextlib.contextmanager
def resolving_in(folder: Path | None) -> Iterator[None]:
    """A context in which in-memory models resolve external data in `folder`.

    The onnx checker and ONNX Runtime given a model as bytes (as onnx-graphsurgeon's
    ``fold_constants`` gives it) resolve external data locations against the working
    directory, so this changes into `folder` and back (`contextlib.chdir`, which
    Python 3.10 lacks); with `folder` None, nothing.
    """
    if folder is None:
        yield
        return
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
