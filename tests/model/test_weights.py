"""Models with external data (real-models issue, kind 4): loaded, rewritten, quantized,
built and written back without ever being one serialized message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from command import routetune as cli
from graphs import external_model, run_path
from quick import quick_spec

from routetune.model.loading import prepare
from routetune.model.weights import WEIGHTS, has_external_data, source_sha256
from routetune.registry import Registry
from routetune.run.tuning import tune


def test_a_model_is_prepared_without_its_data_and_hashed_with_it(tmp_path: Path) -> None:
    path = external_model(tmp_path / "m.onnx")
    model = prepare(path)
    assert has_external_data(model.proto) and model.weights == tmp_path
    assert len(model.data) < 2048  # the graph only: 64 KiB of weights stay in the file
    other = external_model(tmp_path / "b" / "m.onnx", seed=1)  # same graph, other data
    assert (path.read_bytes() == other.read_bytes()
            and model.source_sha256 != source_sha256(other, onnx.load(
                str(other), load_external_data=False)))


@pytest.mark.slow
def test_routes_on_external_data_keep_weights_in_the_store_and_the_winner_runs(
        registry: Registry, tmp_path: Path) -> None:
    path = external_model(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    result = tune(quick_spec(model=path, output=out, shapes="x:2x64",
                             seasonings=("fold-constants", "fp16", "int8-qdq"),
                             routes=("fold-constants,fp16",), accuracy="l2<=0.05"), registry)
    by_route = {t.route: t for t in result.trials}
    for route in ("base", "fold-constants", "fp16", "int8-qdq", "fold-constants,fp16"):
        assert by_route[route].status in ("ok", "accuracy-failed"), (
            route, by_route[route].reason)
    folded = by_route["fold-constants"].passes[-1]
    assert folded["modified"] and folded["stats"]["removed_nodes"] == 1
    models = out / "artifacts" / "models"
    for candidate in models.glob("*.onnx"):  # small files; every weight in the store
        assert candidate.stat().st_size < 8192, candidate
        onnx.checker.check_model(str(candidate), full_check=True)
    assert len(list((models / WEIGHTS).glob("*.bin"))) >= 4  # fp32 and fp16 weights
    winner = result.files["model"]
    assert (winner.with_name("winner.onnx.data")).exists() if has_external_data(
        onnx.load(str(winner), load_external_data=False)) else True
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    expected = run_path(path, x)
    assert np.abs(run_path(winner, x).astype(np.float32) - expected).max() < 0.05


def test_a_winner_with_external_data_is_written_with_its_data_file(
        registry: Registry, tmp_path: Path) -> None:
    path = external_model(tmp_path / "in" / "m.onnx")
    result = tune(quick_spec(model=path, output=tmp_path / "out", shapes="x:2x64",
                             seasonings=("ort-no-spinning",)), registry)
    winner = result.files["model"]
    data = winner.with_name("winner.onnx.data")
    assert data.stat().st_size >= 2 * 64 * 128 * 4
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(run_path(winner, x), run_path(path, x), rtol=1e-6)
    built = cli("build", "--recipe", str(result.files["recipe"]))
    assert built.returncode == 0, built.stderr
    copy = result.outdir / "built.onnx"
    assert copy.with_name("built.onnx.data").exists()
    np.testing.assert_allclose(run_path(copy, x), run_path(path, x), rtol=1e-6)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_short_data_file_is_one_line_and_exit_2(tmp_path: Path,
                                                             damage: str) -> None:
    path = external_model(tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:1000])
    run = cli("tune", str(path), "--output", str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert str(data) in lines[0] and ("missing" if damage == "missing" else "truncated") in (
        lines[0])
    assert not (tmp_path / "out").exists()  # nothing written for a model that cannot load
