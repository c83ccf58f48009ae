from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from routetune.errors import UsageError
from routetune.feeds.inputs import (
    load_npz,
    parse_shapes,
    resolve_shapes,
    shared_dim_conflict,
    synthesize,
)
from routetune.model.loading import TensorSpec

X = TensorSpec("x", np.dtype(np.float32), ("N", 3, "H", "W"))
IDS = TensorSpec("ids", np.dtype(np.int64), (1, 8))


def test_parse_shapes_trtexec_style() -> None:
    assert parse_shapes("x:1x3x48x192,ids:1x8") == {"x": (1, 3, 48, 192), "ids": (1, 8)}
    assert parse_shapes("a:b:2x2") == {"a:b": (2, 2)}  # names may hold colons
    assert parse_shapes(None) == {}
    assert parse_shapes("x:1x0,s:") == {"x": (1, 0), "s": ()}  # an empty tensor, a scalar
    for bad in ("x", "x:1x-2", "x:ax3", ":1x2"):
        with pytest.raises(UsageError, match="cannot read"):
            parse_shapes(bad)


def test_resolve_shapes_fills_fixed_inputs_and_checks_dynamic_ones() -> None:
    shapes = resolve_shapes([X, IDS], {"x": (2, 3, 48, 96)})
    assert shapes == {"x": (2, 3, 48, 96), "ids": (1, 8)}
    with pytest.raises(UsageError, match=r"dimension 2 \('H'\) is dynamic"):
        resolve_shapes([TensorSpec("x", np.dtype(np.float32), (1, 3, "H", 4))], {})
    with pytest.raises(UsageError, match="has no input 'y'"):
        resolve_shapes([X], {"y": (1,)})
    # every dynamic input in one message: one retry is enough (a BERT export's ids and mask)
    mask = TensorSpec("mask", np.dtype(np.int64), ("B", "S"))
    with pytest.raises(UsageError, match=r"\(2 inputs are dynamic\); give the sizes with "
                                         r"--shapes x:1x3x1x1,mask:1x1 \("):
        resolve_shapes([X, IDS, mask], {})


def test_synthesize_is_seeded_and_typed() -> None:
    shapes = {"x": (1, 3, 4, 4), "ids": (1, 8)}
    a, b = synthesize([X, IDS], shapes), synthesize([X, IDS], shapes)
    assert len(a) == 2
    assert all(np.array_equal(a[i][k], b[i][k]) for i in range(2) for k in shapes)
    assert a[0]["x"].dtype == np.float32 and a[0]["ids"].dtype == np.int64
    assert 0 <= a[0]["x"].min() and a[0]["x"].max() < 1
    assert set(np.unique(a[0]["ids"])) <= {0, 1}
    assert not np.array_equal(a[0]["x"], a[1]["x"])


def test_load_npz_file_and_directory(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    np.savez(tmp_path / "b.npz", x=np.ones((2, 3, 4, 4), np.float32))
    assert len(load_npz(tmp_path / "a.npz", [X])) == 1
    feeds = load_npz(tmp_path, [X])
    assert [f["x"].shape for f in feeds] == [(1, 3, 8, 8), (2, 3, 4, 4)]


def test_load_npz_refuses_pickles_and_junk(tmp_path: Path) -> None:
    np.savez(tmp_path / "p.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(UsageError, match="not a readable .npz"):
        load_npz(tmp_path / "p.npz", [X])
    (tmp_path / "j.npz").write_text("junk")
    with pytest.raises(UsageError, match="not a readable .npz"):
        load_npz(tmp_path / "j.npz", [X])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no .npz files"):
        load_npz(tmp_path / "empty", [X])
    with pytest.raises(UsageError, match="no such file"):
        load_npz(tmp_path / "missing.npz", [X])


def test_string_inputs_are_given_as_str_arrays(tmp_path: Path) -> None:
    # onnx node test test_equal_string: x and y are ONNX strings; .npz holds no object
    # arrays without pickle, so a NumPy str array is the form, converted for the runtime
    specs = [TensorSpec("x", np.dtype(object), (2,)), TensorSpec("s", np.dtype(object), ())]
    np.savez(tmp_path / "a.npz", x=np.array(["cat", "dog"]), s=np.array("one"))
    (feed,) = load_npz(tmp_path / "a.npz", specs)
    assert feed["x"].dtype == object and list(feed["x"]) == ["cat", "dog"]
    assert feed["s"].shape == () and feed["s"].item() == "one"  # rank 0 too
    np.savez(tmp_path / "b.npz", x=np.array([1.0, 2.0]), s=np.array("one"))
    with pytest.raises(UsageError, match=r"wants strings; save it as a NumPy str array") as e:
        load_npz(tmp_path / "b.npz", specs)
    assert "numpy.object" not in str(e.value)  # NumPy 2 has no such name


def test_bfloat16_and_float8_inputs_are_read_from_their_bytes(tmp_path: Path) -> None:
    # onnx node tests test_cast_BFLOAT16_to_FLOAT, test_cast_FLOAT8E4M3FN_to_FLOAT: .npz
    # holds an ml_dtypes array as raw bytes (|V2, |V1); read back as the model's type
    import ml_dtypes

    specs = [TensorSpec("b", np.dtype(ml_dtypes.bfloat16), (3,)),
             TensorSpec("f", np.dtype(ml_dtypes.float8_e4m3fn), (2,))]
    b = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16)
    f = np.array([0.5, 448.0], ml_dtypes.float8_e4m3fn)
    np.savez(tmp_path / "a.npz", b=b, f=f)
    np.savez(tmp_path / "bytes.npz", b=b.view(np.uint16), f=f.view(np.uint8))
    for name in ("a.npz", "bytes.npz"):
        (feed,) = load_npz(tmp_path / name, specs)
        assert feed["b"].dtype == specs[0].dtype and np.array_equal(feed["b"], b)
        assert feed["f"].dtype == specs[1].dtype and np.array_equal(feed["f"], f)
    np.savez(tmp_path / "c.npz", b=np.zeros(3, np.float32), f=f)
    with pytest.raises(UsageError, match=r"save an ml_dtypes.bfloat16 array"):
        load_npz(tmp_path / "c.npz", specs)


def test_a_named_dim_given_two_sizes_is_described() -> None:
    ids = TensorSpec("ids", np.dtype(np.int64), ("batch", "seq"))
    mask = TensorSpec("mask", np.dtype(np.int64), ("batch", "seq"))
    assert shared_dim_conflict([ids, mask], {"ids": (2, 8), "mask": (2, 8)}) is None
    assert shared_dim_conflict([ids, mask], {"ids": (2, 8), "mask": (2, 9)}) == (
        "inputs 'ids' and 'mask' share dimension 'seq' but have sizes 8 and 9 there")
    square = TensorSpec("m", np.dtype(np.float32), ("n", "n"))
    assert shared_dim_conflict([square], {"m": (3, 4)}) == (
        "input 'm' names dimension 'n' twice but has sizes 3 and 4 there")
    # fixed dims, other names and a shape of another rank are not conflicts
    assert shared_dim_conflict([X, IDS], {"x": (2, 3, 4, 5), "ids": (1, 8)}) is None
    assert shared_dim_conflict([square], {"m": (3,)}) is None


def test_shapes_that_give_one_named_dim_two_sizes_are_refused_and_hints_agree() -> None:
    """Batch 2 on one input and 1 on another is refused in one line naming both; an
    input left out takes the sizes its named dims have elsewhere, and the hint for one
    still unsized agrees with the sizes given."""
    ids = TensorSpec("input_ids", np.dtype(np.int64), ("batch", "sequence"))
    mask = TensorSpec("attention_mask", np.dtype(np.int64), ("batch", "sequence"))
    pixels = TensorSpec("pixels", np.dtype(np.float32), ("batch", 3, "height", "width"))
    with pytest.raises(UsageError) as e:
        resolve_shapes([ids, mask], {"input_ids": (2, 8), "attention_mask": (1, 8)})
    assert str(e.value) == (
        "--shapes: inputs 'input_ids' and 'attention_mask' share dimension 'batch' but "
        "have sizes 2 and 1 there; give them one size (or feed the arrays with --inputs, "
        "if the model runs on them)")
    assert resolve_shapes([ids, mask], {"input_ids": (2, 8)}) == {
        "input_ids": (2, 8), "attention_mask": (2, 8)}
    with pytest.raises(UsageError) as e:
        resolve_shapes([ids, mask, pixels], {"attention_mask": (4, 16)}, "--opt-shapes")
    assert str(e.value).endswith(
        "give its size with --opt-shapes pixels:4x3x1x1 (1 stands for the size you want)")
    shapes = resolve_shapes([ids, pixels], {"input_ids": (4, 16),
                                            "pixels": (4, 3, 32, 32)})
    assert shapes["pixels"] == (4, 3, 32, 32)
