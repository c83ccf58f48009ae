"""Fuzzed loaders: every file a user hands routetune loads, or ends in one user error.

A results folder, a model folder, a recipe or an input set may come from someone else:
it is data, never code. Every loader a user's file reaches is fuzzed here in process
with Hypothesis (derandomized, bounded examples): ONNX models and their external data
(`routetune.model.loading.prepare`, `routetune.model.weights_check.check_files`), ``.npz`` inputs
(`routetune.feeds.inputs.load_npz`), recipes (`routetune.run.recipe.load_recipe`), ``run.json``
(`routetune.run.run_record.read` and the report) and ``trials.sqlite``
(`routetune.records.store.TrialStore` and the report). The contract, per input: the loader
succeeds, or raises a `RoutetuneError` whose message is one line naming the file; never
another exception (a traceback), never a hang, never a write outside the given folder.

Hostile inputs found on the way are kept in ``tests/corpus/<loader>/<case>`` (files, and
generated cases where the input is a folder with links or a database), each run once
through the real command line: exit 2, one line on stderr, no traceback, nothing
written outside its temporary folder.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import command
import ml_dtypes
import numpy as np
import onnx
import pytest
import tomli_w
from command import Done
from graphs import conv_bn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from quick import QUICK_FLAGS

from routetune.errors import RoutetuneError, UsageError
from routetune.feeds.inputs import load_npz, resolve_shapes
from routetune.model import weights, weights_check
from routetune.model.loading import TensorSpec, prepare, with_weights_in
from routetune.plugin_manager import load_registry
from routetune.records import run_record
from routetune.records.store import FILENAME as STORE
from routetune.records.store import TrialStore
from routetune.registry import Registry
from routetune.reporting.files import write_reports
from routetune.run.recipe import load_recipe, recipe_values

T = TypeVar("T")

CORPUS = Path(__file__).parent / "corpus"
HANG_S = 20.0
"""Seconds one loader call may take before the example fails as a hang (2 shared cores)."""
SECRET = b"SECRET-OUTSIDE-THE-FOLDER\n" * 2048
"""The sentinel file outside every case folder: ~52 KiB, so any offset can reach into it."""

FUZZ = settings(
    max_examples=30, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example],
)
"""Reproducible (derandomized, no example database written into the repo) and bounded."""


def fuzz(examples: int) -> settings:
    """`FUZZ` with `examples` examples."""
    return settings(FUZZ, max_examples=examples)


# The contract ------------------------------------------------------------------------


class Hang(BaseException):
    """A loader ran past `HANG_S` (a BaseException: no loader's ``except`` may eat it)."""


@contextmanager
def bounded(seconds: float = HANG_S) -> Iterator[None]:
    """Raise `Hang` in the block when it runs longer than `seconds` (SIGALRM)."""
    def alarm(signum: int, frame: object) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def tree(folder: Path, skip: Path | None = None) -> dict[str, tuple[int, int, str]]:
    """Every entry under `folder` (not following links): path to size, mtime and kind."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        if skip is not None and here == skip:
            dirnames.clear()
            continue
        for name in dirnames + filenames:
            path = here / name
            if path == skip:
                continue
            st_ = path.lstat()
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            out[str(path.relative_to(folder))] = (
                0 if kind == "dir" else st_.st_size, 0 if kind == "dir" else st_.st_mtime_ns,
                kind)
    return out


def outcome(load: Callable[[], T], folder: Path, names: tuple[str, ...],
            read_only: bool = True, hang_s: float = HANG_S) -> T | RoutetuneError:
    """Run a loader on a hostile input in `folder`: its result, or the user error it raised.

    Fails the test on any other exception (a traceback for the user), on a call longer
    than `hang_s`, on a message that is empty, spans lines or names none of `names`,
    on a write outside `folder` (its parent's other entries, the sentinel among them,
    stay as they were) and, with `read_only`, on any change inside `folder`.
    """
    outside, inside = tree(folder.parent, skip=folder), tree(folder)
    try:
        with bounded(hang_s):
            result: T | RoutetuneError = load()
    except RoutetuneError as e:
        message = str(e)
        problems = len(e.problems) if isinstance(e, UsageError) else 0  # one line each
        assert message.strip() and len(message.splitlines()) == 1 + problems, repr(message)
        assert any(name in message for name in names), (names, message)
        result = e
    assert tree(folder.parent, skip=folder) == outside, "wrote outside the given folder"
    if read_only:
        assert tree(folder) == inside, "a loader changed its input folder"
    return result


_cases = itertools.count()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fuzz folder: ``outside/secret.bin`` (the sentinel) and one folder per case."""
    path = tmp_path_factory.mktemp("fuzz")
    (path / "outside").mkdir()
    (path / "outside" / "secret.bin").write_bytes(SECRET)
    return path


@contextmanager
def case(root: Path) -> Iterator[Path]:
    """A fresh, empty case folder under `root`, removed afterwards."""
    folder = root / f"case{next(_cases)}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def assert_no_secret(folder: Path) -> None:
    """No file under `folder` holds bytes of the sentinel outside it (nothing read out)."""
    for dirpath, _, filenames in os.walk(folder):  # links to folders are not followed
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():  # no FIFO: reading it blocks
                assert SECRET[:26] not in path.read_bytes(), f"{path} holds outside bytes"


# Models --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_model(root: Path) -> bytes:
    """conv_bn (x f32[1,3,32,32] -> y f32[1,16,32,32]), serialized."""
    return conv_bn(root / "outside" / "conv_bn.onnx", batch=1).read_bytes()


def external_model(folder: Path, data: str = "w.bin") -> Path:
    """x f32[2,64] -> MatMul(W) -> Relu -> y; W (16 KiB) in `data` beside the model."""
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "m.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data, size_threshold=1024)
    return path


def set_entry(model: onnx.ModelProto, key: str, value: str) -> None:
    """Set one external data entry (``location``, ``offset``, ``length``) of every tensor."""
    for tensor in weights.tensors(model):
        if weights.is_external(tensor):
            entries = {e.key: e for e in tensor.external_data}
            if key in entries:
                entries[key].value = value
            else:
                tensor.external_data.add(key=key, value=value)


def load_model_chain(path: Path, folder: Path) -> object:
    """What ``routetune tune`` does with a model file before any trial.

    Prepare it, copy its external data into a store inside `folder`, and fix its input
    shapes from the model alone (huge declared dimensions must be refused there).
    """
    model = prepare(path)
    model = with_weights_in(model, folder / "store")
    if all(s.dtype is not None for s in model.inputs):
        try:
            resolve_shapes(model.inputs, {})
        except RoutetuneError:  # about --shapes, not the file: it quotes the model's names
            pass
    return model


def other_files(plain: bytes) -> st.SearchStrategy[bytes]:
    """Bytes that are not an ONNX model: random, truncated, or another kind of file."""
    npz = io.BytesIO()
    np.savez(npz, x=np.zeros(3, np.float32))
    return st.one_of(
        st.binary(max_size=512),
        st.integers(0, len(plain) - 1).map(lambda n: plain[:n]),
        st.sampled_from([
            b"", npz.getvalue(), b'schema_version = 2\n[model]\npath = "m.onnx"\n',
            b'{"model": {}}', b"SQLite format 3\x00" + bytes(84), plain * 2,
            b"\x08\x08" + b"\x12\xff\xff\xff\xff\x0f",  # a length past the end
        ]),
    )


@fuzz(300)
@given(data=st.data())
def test_bytes_that_are_not_a_model_are_refused_in_one_line(root: Path, plain_model: bytes,
                                                            data: st.DataObject) -> None:
    raw = data.draw(other_files(plain_model), "bytes")
    with case(root) as folder:
        path = folder / "m.onnx"
        path.write_bytes(raw)
        result = outcome(lambda: load_model_chain(path, folder), folder, (path.name,),
                         read_only=False)
        assert isinstance(result, RoutetuneError)


ELEM_TYPES = st.sampled_from(sorted(TensorProto.DataType.values())) | st.integers(-2, 64)
DIMS = st.sampled_from([0, -1, -(2**62), 2**62, 2**63 - 1, 2**31]) | st.integers(
    -(2**63), 2**63 - 1)
NAMES = st.sampled_from(["x", "y", "W", "c", "b", "", "../x", "a\nb"]) | st.text(max_size=6)
OPS = st.sampled_from(["Conv", "Relu", "Identity", "If", "Loop", "Cast", "Reshape", "Nope",
                       ""]) | st.text(max_size=6)


def _mutate(model: onnx.ModelProto, draw: Callable[..., Any]) -> None:
    """Change one field of `model`: a type, a dimension, a tensor, a node or the header."""
    g = model.graph
    values = [*g.input, *g.output, *g.value_info]
    kind = draw(st.sampled_from(["elem", "dim", "init", "node", "attr", "header", "drop",
                                 "dup"]))
    if kind == "elem" and values:
        draw(st.sampled_from(values)).type.tensor_type.elem_type = draw(ELEM_TYPES)
    elif kind == "dim" and values:
        shape = draw(st.sampled_from(values)).type.tensor_type.shape
        if shape.dim and draw(st.booleans()):
            dim = draw(st.sampled_from(list(shape.dim)))
            if draw(st.booleans()):
                dim.dim_value = draw(DIMS)
            else:
                dim.dim_param = draw(NAMES)
        else:
            shape.dim.add().dim_value = draw(DIMS)
    elif kind == "init" and g.initializer:
        t = draw(st.sampled_from(list(g.initializer)))
        field = draw(st.sampled_from(["type", "dims", "raw", "external", "name"]))
        if field == "type":
            t.data_type = draw(ELEM_TYPES)
        elif field == "dims":
            t.dims.append(draw(DIMS)) if not t.dims else t.dims.__setitem__(
                draw(st.integers(0, len(t.dims) - 1)), draw(DIMS))
        elif field == "raw":
            t.raw_data = t.raw_data[:draw(st.integers(0, max(len(t.raw_data) - 1, 0)))]
        elif field == "external":
            t.data_location = TensorProto.EXTERNAL
        else:
            t.name = draw(NAMES)
    elif kind == "node" and g.node:
        n = draw(st.sampled_from(list(g.node)))
        field = draw(st.sampled_from(["op", "domain", "input", "output"]))
        if field == "op":
            n.op_type = draw(OPS)
        elif field == "domain":
            n.domain = draw(st.sampled_from(["ai.onnx.ml", "com.microsoft", "x"]))
        elif field == "input":
            n.input.append(draw(NAMES))
        else:
            n.output.append(draw(NAMES))
    elif kind == "attr" and g.node:
        n = draw(st.sampled_from(list(g.node)))
        attr = n.attribute.add(name=draw(st.sampled_from(["pads", "axis", "to", "then_branch",
                                                           "value", "kernel_shape"])))
        attr.type = draw(st.integers(0, 14))
        attr.i = draw(DIMS)
        attr.ints.extend(draw(st.lists(DIMS, max_size=4)))
    elif kind == "header":
        which = draw(st.sampled_from(["ir", "opset", "domain"]))
        if which == "ir":
            model.ir_version = draw(st.integers(-1, 2**40))
        elif which == "opset":
            model.opset_import[0].version = draw(st.integers(-1, 2**40))
        else:
            model.opset_import.add(domain=draw(NAMES), version=draw(st.integers(-1, 99)))
    elif kind == "drop":
        field = draw(st.sampled_from([g.node, g.input, g.output, g.initializer]))
        if len(field):
            del field[draw(st.integers(0, len(field) - 1))]
    elif kind == "dup" and g.node:
        g.node.append(draw(st.sampled_from(list(g.node))))


@fuzz(1500)
@given(data=st.data())
def test_mutated_models_load_or_are_refused_in_one_line(root: Path, plain_model: bytes,
                                                        data: st.DataObject) -> None:
    model = onnx.load_from_string(plain_model)
    for _ in range(data.draw(st.integers(1, 4), "mutations")):
        _mutate(model, data.draw)
    raw = model.SerializeToString()
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)),
                               max_size=3), "byte flips")
    raw = bytearray(raw)
    for at, xor in flips:
        raw[at] ^= xor
    with case(root) as folder:
        path = folder / "m.onnx"
        path.write_bytes(bytes(raw))
        outcome(lambda: load_model_chain(path, folder), folder, (path.name,), read_only=False)


LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""What `str.splitlines` splits at."""
LOCATIONS = st.sampled_from([
    "w.bin", "./w.bin", "sub/../w.bin", "../outside/secret.bin", "/etc/hostname",
    "link.bin", "dirlink/secret.bin", "missing.bin", "sub", "", ".", "w.bin/", "a\0b",
    "//w.bin", "~/w.bin", "sub/../../outside/secret.bin",
]) | st.text(st.characters(exclude_categories=("Cs",), exclude_characters=LINE_BREAKS),
             max_size=12)
"""Locations; without line breaks, which `weights_check.check_files` quotes as they are (see
`test_a_location_with_a_line_break_is_refused_in_one_line`)."""
OFFSETS = st.sampled_from([0, 1, 4096, 16383, 16384, -1, 2**62, 2**63 - 1]) | st.integers(
    -(2**70), 2**70) | st.sampled_from(["abc", "", "0x10", "1e3", " 7", "１"])
"""Offsets and lengths: byte counts, negative, huge, and text that is not a number."""


@fuzz(800)
@given(data=st.data())
def test_external_data_is_read_only_inside_the_model_folder(root: Path,
                                                            data: st.DataObject) -> None:
    with case(root) as folder:
        path = external_model(folder)
        (folder / "sub").mkdir()
        (folder / "link.bin").symlink_to(root / "outside" / "secret.bin")
        (folder / "dirlink").symlink_to(root / "outside")
        data_file = folder / "w.bin"
        edit = data.draw(st.sampled_from(["none", "truncate", "delete", "to-link", "to-dir"]))
        if edit == "truncate":
            data_file.write_bytes(data_file.read_bytes()[:data.draw(st.integers(0, 16383))])
        elif edit == "delete":
            data_file.unlink()
        elif edit == "to-link":
            data_file.unlink()
            data_file.symlink_to(root / "outside" / "secret.bin")
        elif edit == "to-dir":
            data_file.unlink()
            data_file.mkdir()
        model = onnx.load(str(path), load_external_data=False)
        for key, values in (("location", LOCATIONS), ("offset", OFFSETS),
                            ("length", OFFSETS)):
            if data.draw(st.booleans(), f"change {key}"):
                set_entry(model, key, str(data.draw(values, key)))
        path.write_bytes(model.SerializeToString())

        def load() -> object:
            weights_check.check_files(onnx.load(str(path), load_external_data=False), folder, path)
            return load_model_chain(path, folder)

        result = outcome(load, folder, (path.name,), read_only=False)
        assert_no_secret(folder)
        if not isinstance(result, RoutetuneError):
            info = {e.key: e.value for e in onnx.load(
                str(path), load_external_data=False).graph.initializer[0].external_data}
            assert (folder / info["location"]).resolve().is_relative_to(folder.resolve())


@pytest.mark.parametrize("key, value", [("offset", "-100"), ("offset", "abc"),
                                        ("length", "0x10"), ("length", "-5")])
def test_external_data_entries_that_are_not_sizes_are_refused(root: Path, key: str,
                                                               value: str) -> None:
    with case(root) as folder:
        path = external_model(folder)
        model = onnx.load(str(path), load_external_data=False)
        set_entry(model, key, value)
        path.write_bytes(model.SerializeToString())
        result = outcome(lambda: load_model_chain(path, folder), folder, (path.name,),
                         read_only=False)
        assert isinstance(result, RoutetuneError)


def test_a_location_with_a_line_break_is_refused_in_one_line(root: Path) -> None:
    with case(root) as folder:
        path = external_model(folder)
        model = onnx.load(str(path), load_external_data=False)
        set_entry(model, "location", "w.bin\nmissing")
        path.write_bytes(model.SerializeToString())
        outcome(lambda: load_model_chain(path, folder), folder, (path.name,), read_only=False)


# Inputs (.npz) -------------------------------------------------------------------------

SPEC_SETS = [
    (TensorSpec("x", np.dtype(np.float32), (1, 3, 4, 4)),),
    (TensorSpec("x", np.dtype(np.float32), (1, "N")), TensorSpec("m", np.dtype(bool), (2,))),
    (TensorSpec("ids", np.dtype(np.int64), ()),
     TensorSpec("s", np.dtype(object), (2,))),
    (TensorSpec("h", np.dtype(ml_dtypes.bfloat16), (2, 2)),
     TensorSpec("q", np.dtype(ml_dtypes.float8_e5m2), (3,))),
    (TensorSpec("seq", None, ()),),  # a sequence input: --inputs cannot give it
]
"""Input specs as `routetune.model.loading` makes them from ONNX types."""

DTYPES = st.sampled_from([
    np.float32, np.float64, np.float16, np.int64, np.int8, np.uint8, np.uint16, bool,
    np.complex64, "U3", "S2", "V2", "M8[s]", ml_dtypes.bfloat16, ml_dtypes.float8_e5m2,
    ml_dtypes.int4,
]).map(np.dtype)


def _header(shape: tuple[int, ...], descr: str) -> bytes:
    """A ``.npy`` header claiming `shape` and `descr` (whatever data follows)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


@st.composite
def arrays_of_any_bytes(draw: Callable[..., Any]) -> np.ndarray:
    """An array of any `DTYPES` and a small shape (sizes 0 included), its bytes drawn."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    array = np.zeros(shape, draw(DTYPES))
    raw = draw(st.binary(min_size=array.nbytes, max_size=array.nbytes))
    if array.dtype.kind != "U":  # not every 4 bytes are a code point
        array.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    return array


@st.composite
def npz_bytes(draw: Callable[..., Any], names: list[str]) -> bytes:
    """An ``.npz`` (or not): arrays under the specs' and other names, crafted members,
    object arrays, a bare ``.npy``, random or truncated bytes."""
    kind = draw(st.sampled_from(["arrays", "crafted", "object", "npy", "bytes", "cut"]))
    out = io.BytesIO()
    keys = (st.sampled_from([*names, "extra", "a/b", ""])
            | st.text(min_size=1, max_size=5).filter(lambda k: "\0" not in k))  # zipfile
    if kind in ("arrays", "cut"):
        arrays = draw(st.dictionaries(keys.filter(lambda k: k not in ("file", "allow_pickle")),
                                      arrays_of_any_bytes(), max_size=3))
        if draw(st.booleans()):
            arrays.update({n: np.full((1, 3, 4, 4), np.nan, np.float32) for n in names})
        np.savez(out, **arrays)
        if kind == "cut":
            return out.getvalue()[:draw(st.integers(0, len(out.getvalue())))]
    elif kind == "crafted":
        with zipfile.ZipFile(out, "w") as z, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zipfile: "Duplicate name"
            for _ in range(draw(st.integers(1, 2))):
                shape = draw(st.lists(DIMS | st.integers(0, 4), max_size=3).map(tuple))
                descr = draw(st.sampled_from(["<f4", "|b1", "<U2", "|O", "<i8", "|V9999999"]))
                head = draw(st.sampled_from([_header(shape, descr), b"garbage",
                                             b"\x93NUMPY\x01\x00\xff\xff"]))
                z.writestr(draw(keys) + ".npy", head + draw(st.binary(max_size=64)))
    elif kind == "object":
        np.savez(out, **{names[0]: np.array([{"a": 1}, None], dtype=object)})
    elif kind == "npy":
        np.save(out, np.zeros(3, np.float32))
    else:
        return draw(st.binary(max_size=256))
    return out.getvalue()


@fuzz(1000)
@given(data=st.data())
def test_hostile_npz_inputs_are_refused_in_one_line(root: Path, data: st.DataObject) -> None:
    specs = data.draw(st.sampled_from(SPEC_SETS), "specs")
    raw = data.draw(npz_bytes([s.name for s in specs]), "npz")
    as_folder = data.draw(st.booleans(), "a folder of .npz files")
    with case(root) as folder:
        path = folder / "in.npz"
        path.write_bytes(raw)
        given_path = folder if as_folder else path
        if as_folder:
            (folder / "sub.npz").mkdir()  # a folder whose name ends in .npz
        result = outcome(lambda: load_npz(given_path, specs), folder,
                         (given_path.name, path.name))
        if not isinstance(result, RoutetuneError):
            for feed in result:
                assert [feed[s.name].dtype for s in specs] == [s.dtype for s in specs]


# Recipes -------------------------------------------------------------------------------

RECIPE: dict[str, Any] = {
    "schema_version": 2, "base": ["fold-constants"],
    "routes": ["fuse-bn-into-conv,ort-threads{intra_op=1}"], "output": "out",
    "model": {"path": "m.onnx"},
    "backend": {"name": "onnxruntime", "options": {"onnxruntime.intra_op_num_threads": 2}},
    "seasonings": [{"name": "ort-threads", "params": {"intra_op": [1, 2]}},
                   {"name": "fp16", "params": {"keep_io_types": [True, False]}}],
    "search": {"strategy": "beam", "beam_width": 2, "max_depth": 2, "max_trials": 10,
               "time_budget_s": 60.0},
    "accuracy": {"expr": "cos>=0.99", "outputs": {"y": "linf<=0.1"}},
    "measure": {"min_runs": 3, "min_time_s": 0.1, "min_speedup": 1.05,
                "busy_machine": "warn"},
    "inputs": {"shapes": "x:1x3x32x32"}, "result": {"speedup": 1.2},
}
"""A valid version-2 recipe; the fuzzer changes a few of its nodes."""

RECIPE_V1: dict[str, Any] = {
    "schema_version": 1, "model": {"path": "m.onnx"}, "backend": {"name": "onnxruntime"},
    "route": {"text": "fuse-bn-into-conv"}, "accuracy": {"expr": "cos>=0.99"},
    "inputs": {"shapes": "x:1x3x32x32"}, "result": {"speedup": 1.1},
}
"""A version-1 winner recipe (read as version 2)."""

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def toml_values(leaves: int = 6) -> st.SearchStrategy[Any]:
    """Values TOML can hold: scalars (dates too), arrays and tables, nested."""
    scalars = (st.booleans() | st.integers() | st.floats() | TEXT | st.dates()
               | st.sampled_from(["fp16", "beam", "cos>=0.9", "x:1x3", "a\nb", "{", "$"]))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        TEXT, inner, max_size=3), max_leaves=leaves)


def json_values(leaves: int = 6) -> st.SearchStrategy[Any]:
    """Values JSON can hold, NaN and infinities included (Python's json writes them)."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        TEXT, inner, max_size=3), max_leaves=leaves)


def _slots(node: Any, parent: Any = None, key: Any = None) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) of a JSON-like tree; (None, None) for the root."""
    yield parent, key
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _slots(v, node, k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _slots(v, node, i)


@st.composite
def mutated(draw: Callable[..., Any], doc: Any, values: st.SearchStrategy[Any]) -> Any:
    """`doc` with 1 to 3 nodes replaced, deleted, or given an unknown sibling."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        parent, key = draw(st.sampled_from(list(_slots(doc))))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if parent is None:
            doc = draw(values) if action == "replace" else doc
        elif action == "replace":
            parent[key] = draw(values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(TEXT)] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def nested(opening: str, closing: str, depth: int, inner: str = "1") -> str:
    """``opening * depth + inner + closing * depth``."""
    return opening * depth + inner + closing * depth


@st.composite
def recipe_bytes(draw: Callable[..., Any]) -> bytes:
    """A recipe's bytes: a valid one mutated, deeply nested, huge, or not TOML at all."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "nested", "huge", "bytes"]))
    if kind == "mutated":
        doc = draw(mutated(draw(st.sampled_from([RECIPE, RECIPE_V1])), toml_values()))
        if not isinstance(doc, dict):
            doc = {"value": doc}
        return tomli_w.dumps(doc).encode()
    if kind == "nested":
        depth = draw(st.sampled_from([50, 999, 5000, 100_000]))
        inner = draw(st.sampled_from([("[", "]"), ("{a = ", "}")]))
        return f"schema_version = 2\nresult = {nested(*inner, depth)}\n".encode()
    if kind == "huge":
        field = draw(st.sampled_from(["routes = ['{}']", "output = '{}'",
                                      "schema_version = {}", "[model]\npath = '{}'"]))
        filler = draw(st.sampled_from(["a", "9", "{", "é"])) * draw(
            st.sampled_from([5000, 2**20]))
        return field.format(filler).encode()
    return draw(st.binary(max_size=200) | st.binary(max_size=50).map(
        lambda b: b"schema_version = 2\n# \xff\xfe" + b))


@pytest.fixture(scope="module")
def registry() -> Registry:
    """The installed plugins (module-wide: recipes only read it)."""
    return load_registry()


@fuzz(400)
@given(data=st.data())
def test_hostile_recipes_are_refused_in_one_line(root: Path, registry: Registry,
                                                 data: st.DataObject) -> None:
    raw = data.draw(recipe_bytes(), "recipe")
    with case(root) as folder:
        path = folder / "r.toml"
        path.write_bytes(raw)

        def load() -> dict[str, Any]:
            return recipe_values(load_recipe(path, registry), path)

        outcome(load, folder, (path.name,))


def test_the_unmutated_recipes_load(root: Path, registry: Registry) -> None:
    for doc in (RECIPE, RECIPE_V1):
        with case(root) as folder:
            path = folder / "r.toml"
            path.write_text(tomli_w.dumps(doc))
            assert recipe_values(load_recipe(path, registry), path)["model"] == (
                folder / "m.onnx")


# run.json and trials.sqlite, through the report ---------------------------------------

FAST = [*QUICK_FLAGS, "--in-process"]


def routetune(*args: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI with its working directory, home and temporary folder in `folder`."""
    env = {**os.environ, "HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"),
           "XDG_CACHE_HOME": str(folder / "home" / ".cache"),
           "MPLCONFIGDIR": str(folder / "home" / "mpl"),
           "ROUTETUNE_CACHE": str(folder / "home" / "cache")}
    for name in ("cwd", "home", "tmp"):
        (folder / name).mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=120, cwd=folder / "cwd", env=env)


@pytest.fixture(scope="module")
def real_run(root: Path) -> Path:
    """The output folder of a real (short) search: ``run.json`` and ``trials.sqlite``."""
    folder = root / "outside" / "real"
    folder.mkdir()
    model = conv_bn(folder / "m.onnx", batch=1)
    done = routetune("tune", str(model), "--output", str(folder / "out"), "--seasonings",
                     "fuse-bn-into-conv,ort-threads", "--max-trials", "3", *FAST,
                     folder=folder)
    assert done.returncode == 0, done.stderr
    return folder / "out"


def results_folder(real_run: Path, folder: Path) -> Path:
    """Copy the real run's ``run.json`` and ``trials.sqlite`` into `folder`."""
    for name in (run_record.FILENAME, STORE):
        shutil.copy(real_run / name, folder / name)
    return folder


def report(folder: Path) -> object:
    """``routetune report FOLDER``, in process: read the record and the store, write."""
    return write_reports(folder)


@st.composite
def run_json_bytes(draw: Callable[..., Any], real: dict[str, Any]) -> bytes:
    """A ``run.json``: the real record mutated, deeply nested, huge, or not JSON."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "mutated", "nested",
                                 "huge", "bytes"]))
    if kind == "mutated":
        return json.dumps(draw(mutated(real, json_values()))).encode()
    if kind == "huge":  # 16 MiB in one field the report prints
        return json.dumps({**real, draw(st.sampled_from(["accuracy", "profile"])): "x" * 2**24,
                           "pinned": ["base"] * 2**16}).encode()
    if kind == "nested":
        depth = draw(st.sampled_from([50, 5000, 100_000]))
        opening, closing = draw(st.sampled_from([("[", "]"), ('{"model": ', "}")]))
        return nested(opening, closing, depth, "{}").encode()
    return draw(st.binary(max_size=100) | st.sampled_from(
        [b"", b"null", b"[]", b'{"model": []}', b"9" * 5000, b'{"a": "\xff"}']))


REPORTED = 100
"""Examples of the fuzz tests whose every example writes the whole report (HTML and its
two charts: 0.3 s each here); the loaders alone take 250 (`test_fuzz.py`'s others)."""


@fuzz(REPORTED)
@given(data=st.data())
@pytest.mark.slow
def test_hostile_run_records_are_refused_in_one_line(root: Path, real_run: Path,
                                                     data: st.DataObject) -> None:
    real = json.loads((real_run / run_record.FILENAME).read_text())
    raw = data.draw(run_json_bytes(real), "run.json")
    with case(root) as folder:
        results_folder(real_run, folder)
        (folder / run_record.FILENAME).write_bytes(raw)
        names = (run_record.FILENAME, STORE)
        outcome(lambda: run_record.read(folder), folder, names)
        outcome(lambda: report(folder), folder, names, read_only=False)


@st.composite
def cell(draw: Callable[..., Any], current: Any) -> Any:
    """A value for a store cell: its own JSON mutated, any JSON, text, bytes, a number."""
    if isinstance(current, str) and current[:1] in "{[" and draw(st.booleans()):
        try:
            return json.dumps(draw(mutated(json.loads(current), json_values())))
        except ValueError:  # an earlier cell of this example made it other text
            pass
    return draw(st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats() | TEXT
                | st.binary(max_size=16)
                | json_values().map(json.dumps)
                | st.sampled_from(["{", "[]", "{}", "NaN", "null", "a\nb", "base,{"]))


@fuzz(REPORTED)
@given(data=st.data())
@pytest.mark.slow
def test_hostile_trial_stores_are_refused_in_one_line(root: Path, real_run: Path,
                                                      data: st.DataObject) -> None:
    with case(root) as folder:
        results_folder(real_run, folder)
        path = folder / STORE
        kind = data.draw(st.sampled_from(["row", "row", "row", "pragma", "bytes"]), "kind")
        if kind == "bytes":
            raw = bytearray(path.read_bytes())
            cut = data.draw(st.integers(0, len(raw)), "cut at")
            raw = raw[:cut] if data.draw(st.booleans(), "cut") else raw
            for at, xor in data.draw(st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)),
                                                        st.integers(1, 255)), max_size=4)):
                if raw:
                    raw[at] ^= xor
            path.write_bytes(bytes(raw) if data.draw(st.booleans()) else data.draw(
                st.binary(max_size=300)))
        else:
            db = sqlite3.connect(path)
            if kind == "pragma":
                pragma = data.draw(st.sampled_from(["application_id", "user_version"]))
                db.execute(f"PRAGMA {pragma} = {data.draw(st.integers(-(2**31), 2**31 - 1))}")
            else:
                ids = [r[0] for r in db.execute("SELECT id FROM trials")]
                columns = [r[1] for r in db.execute("PRAGMA table_info(trials)")][1:]
                for _ in range(data.draw(st.integers(1, 3), "cells")):
                    row = data.draw(st.sampled_from(ids), "row")
                    column = data.draw(st.sampled_from(columns), "column")
                    now = db.execute(f"SELECT {column} FROM trials WHERE id = ?",
                                     (row,)).fetchone()[0]
                    value = data.draw(cell(now), column)
                    try:
                        db.execute(f"UPDATE trials SET {column} = ? WHERE id = ?", (value, row))
                    except sqlite3.IntegrityError:  # NOT NULL or UNIQUE: SQLite refuses it
                        pass
            db.commit()
            db.close()

        def trials() -> object:
            store = TrialStore.open(path)
            try:
                return store.trials()
            finally:
                store.close()

        names = (STORE, run_record.FILENAME)
        outcome(trials, folder, names, read_only=False)
        outcome(lambda: report(folder), folder, names, read_only=False)


# FIFOs where files are expected ----------------------------------------------------


@pytest.mark.parametrize("loader", ["model", "npz", "recipe", "run.json", "trials.sqlite"])
def test_a_fifo_where_a_file_is_expected_is_refused_without_blocking(
        root: Path, real_run: Path, plain_model: bytes, loader: str) -> None:
    with case(root) as folder:
        (folder / "m.onnx").write_bytes(plain_model)
        if loader in ("run.json", "trials.sqlite"):
            results_folder(real_run, folder)
            fifo = folder / loader
            fifo.unlink()
        else:
            fifo = folder / {"model": "fifo.onnx", "npz": "in.npz", "recipe": "r.toml"}[loader]
        os.mkfifo(fifo)
        load = {"model": lambda: prepare(fifo),
                "npz": lambda: load_npz(fifo, prepare(folder / "m.onnx").inputs),
                "recipe": lambda: load_recipe(fifo, load_registry()),
                "run.json": lambda: report(folder),
                "trials.sqlite": lambda: report(folder)}[loader]
        result = outcome(load, folder, (fifo.name,), read_only=False, hang_s=5)
        assert isinstance(result, RoutetuneError)


def test_a_fifo_as_external_data_is_refused_without_blocking(root: Path) -> None:
    with case(root) as folder:
        path = external_model(folder)
        (folder / "w.bin").unlink()
        os.mkfifo(folder / "w.bin")
        result = outcome(lambda: prepare(path), folder, (path.name,), hang_s=2)
        assert isinstance(result, RoutetuneError)


# Writes into a folder that someone else prepared ---------------------------------------


def test_reports_refuse_links_and_records_replace_them(root: Path, real_run: Path) -> None:
    # `report` refuses a folder with a planted link (it writes report.* and SQLite's
    # -wal/-shm files there); run.json is written to a fresh name and renamed, so a
    # link left as the old run.tmp is replaced, never written through.
    with case(root) as folder:
        results_folder(real_run, folder)
        for name in ("report.html", "report.md", "report.json"):
            (folder / name).symlink_to(root / "outside" / "secret.bin")
        (folder / "run.tmp").symlink_to(root / "outside" / "secret.bin")
        result = outcome(lambda: report(folder), folder, ("report.", "run.tmp"),
                         read_only=False)
        assert isinstance(result, RoutetuneError) and "link" in str(result)
        outcome(lambda: run_record.write(folder, {"model": {}}), folder, (run_record.FILENAME,),
                read_only=False)
        assert (root / "outside" / "secret.bin").read_bytes() == SECRET
        assert not (folder / run_record.FILENAME).is_symlink()


# The corpus, through the command line -------------------------------------------------


Case = tuple[list[str], Callable[[], object]]
"""A corpus case made in a folder: the command line, and the loader call in process."""
Maker = Callable[[Path, Path, bytes], Case]
"""Makes a case from its folder (with ``given/`` and ``outside/``), the real run's output
folder and the plain model's bytes."""


def _sql_case(name: str) -> Maker:
    """A store case: ``corpus/store/NAME.sql`` run on a copy of the real store."""
    def make(folder: Path, real_run: Path, plain: bytes) -> Case:
        out = results_folder(real_run, folder / "given")
        db = sqlite3.connect(out / STORE)
        db.executescript((CORPUS / "store" / f"{name}.sql").read_text())
        db.close()
        return ["report", str(out)], lambda: report(out)
    return make


def _file_case(loader: str, name: str) -> Maker:
    """A file case: ``corpus/LOADER/NAME`` handed to the command that reads it."""
    def make(folder: Path, real_run: Path, plain: bytes) -> Case:
        given_, source = folder / "given", CORPUS / loader / name
        out = ["--output", str(given_ / "out"), *FAST]
        if loader == "runjson":
            results_folder(real_run, given_)
            shutil.copy(source, given_ / run_record.FILENAME)
            return ["report", str(given_)], lambda: report(given_)
        file = given_ / name
        shutil.copy(source, file)
        if loader == "model":
            return ["tune", str(file), *out], lambda: load_model_chain(file, given_)
        model = given_ / "m.onnx"
        model.write_bytes(plain)
        if loader == "npz":
            return (["tune", str(model), "--inputs", str(file), *out],
                    lambda: load_npz(file, prepare(model).inputs))
        registry = load_registry()
        return (["tune", "--recipe", str(file), *out],
                lambda: recipe_values(load_recipe(file, registry), file))
    return make


def _external_case(key: str, value: str) -> Maker:
    """A model folder whose external data entry `key` is `value` (a link to the outside
    sits beside it as ``link.bin``)."""
    def make(folder: Path, real_run: Path, plain: bytes) -> Case:
        given_ = folder / "given"
        path = external_model(given_)
        (given_ / "link.bin").symlink_to(folder / "outside" / "secret.bin")
        model = onnx.load(str(path), load_external_data=False)
        set_entry(model, key, value)
        path.write_bytes(model.SerializeToString())
        return (["tune", str(path), "--output", str(given_ / "out"), *FAST],
                lambda: load_model_chain(path, given_))
    return make


def _store_link_case(folder: Path, real_run: Path, plain: bytes) -> Case:
    """A results folder whose ``trials.sqlite`` is a link to an empty file outside it
    (SQLite would make it a store, and write its journal beside it)."""
    given_ = folder / "given"
    shutil.copy(real_run / run_record.FILENAME, given_ / run_record.FILENAME)
    (folder / "outside" / "empty").write_bytes(b"")
    (given_ / STORE).symlink_to(folder / "outside" / "empty")
    return ["report", str(given_)], lambda: report(given_)


def _fifo_case(folder: Path, real_run: Path, plain: bytes) -> Case:
    """A FIFO given as the model (reading it would wait forever for a writer)."""
    fifo = folder / "given" / "m.onnx"
    os.mkfifo(fifo)
    return (["tune", str(fifo), "--output", str(folder / "given" / "out"), *FAST],
            lambda: load_model_chain(fifo, folder / "given"))


def _corpus() -> list[Any]:
    """Every corpus case as a pytest parameter (files first, then generated ones)."""
    cases = []
    for path in sorted(CORPUS.glob("*/*")):
        loader = path.parent.name
        make = _sql_case(path.stem) if loader == "store" else _file_case(loader, path.name)
        cases.append(pytest.param(make, id=f"{loader}/{path.name}"))
    return [*cases,
            pytest.param(_external_case("location", "../outside/secret.bin"),
                         id="model/location-dotdot (generated)"),
            pytest.param(_external_case("location", "link.bin"),
                         id="model/location-link-out (generated)"),
            pytest.param(_external_case("offset", "-100"),
                         id="model/offset-negative (generated)"),
            pytest.param(_external_case("offset", "abc"),
                         id="model/offset-not-a-number (generated)"),
            pytest.param(_fifo_case, id="model/fifo (generated)"),
            pytest.param(_store_link_case, id="store/link-to-an-empty-file-outside (generated)")]


CASES = _corpus()


@contextmanager
def corpus_case(make: Maker, root: Path, real_run: Path, plain: bytes
                ) -> Iterator[tuple[Path, Case]]:
    """A case folder holding ``given/`` (the case, made by `make`) and ``outside/``."""
    with case(root) as folder:
        (folder / "given").mkdir()
        (folder / "outside").mkdir()
        (folder / "outside" / "secret.bin").write_bytes(SECRET)
        yield folder, make(folder, real_run, plain)


@pytest.mark.parametrize("make", CASES)
def test_corpus_case_is_refused_in_process(make: Maker, root: Path, real_run: Path,
                                           plain_model: bytes) -> None:
    with corpus_case(make, root, real_run, plain_model) as (folder, (_, load)):
        result = outcome(load, folder / "given", (STORE, run_record.FILENAME, *(
            p.name for p in (folder / "given").iterdir())), read_only=False)
        assert isinstance(result, RoutetuneError)
        assert_no_secret(folder / "given")


THROUGH_THE_SCRIPT = ("model/location-dotdot (generated)", "recipe/", "store/")
"""Corpus cases run through a real ``python -m routetune`` as well (a model, the first
recipe, the first store), in a process whose home, temporary folder and working folder
lie in the case folder: what a process writes anywhere shows there."""


def in_process(*args: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Done:
    """`command.routetune` with the working folder, home and temporary folder in `folder`."""
    for name in ("cwd", "home", "tmp"):
        (folder / name).mkdir(exist_ok=True)
    monkeypatch.chdir(folder / "cwd")
    for key, value in {"HOME": "home", "TMPDIR": "tmp", "XDG_CACHE_HOME": "home/.cache",
                       "ROUTETUNE_CACHE": "home/cache"}.items():
        monkeypatch.setenv(key, str(folder / value))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return command.routetune(*args)


def _script_cases() -> list[Any]:
    ids = [param.id for param in CASES]
    chosen = {next(i for i in ids if i.startswith(prefix)) for prefix in THROUGH_THE_SCRIPT}
    return [pytest.param(param.values[0], False, id=param.id) for param in CASES] + [
        pytest.param(param.values[0], True, id=f"{param.id} (script)") for param in CASES
        if param.id in chosen]


@pytest.mark.parametrize(("make", "script"), _script_cases())
def test_corpus_case_exits_2_with_one_line(make: Maker, script: bool, root: Path,
                                           real_run: Path, plain_model: bytes,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with corpus_case(make, root, real_run, plain_model) as (folder, (args, _)):
        before = tree(folder / "outside"), tree(root, skip=folder)
        done = (routetune(*args, folder=folder) if script
                else in_process(*args, folder=folder, monkeypatch=monkeypatch))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert lines[0].startswith("routetune: error: "), done.stderr
        assert len(lines) == 1 or all(line.startswith("  ") for line in lines[1:]), (
            done.stderr)  # a recipe's problems, one per line below
        assert "Traceback" not in done.stderr
        assert (tree(folder / "outside"), tree(root, skip=folder)) == before
        assert sorted(p.name for p in folder.iterdir()) == [
            "cwd", "given", "home", "outside", "tmp"]
        assert_no_secret(folder / "given")


def test_the_corpus_holds_every_loader() -> None:
    loaders = {param.id.split("/")[0] for param in CASES}
    assert loaders == {"model", "npz", "recipe", "runjson", "store"}
