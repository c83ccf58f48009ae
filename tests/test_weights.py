"""Models with external data (real-models issue, kind 4): loaded, rewritten, quantized,
built and written back without ever being one serialized message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from command import routetune as cli
from onnx import TensorProto, helper, numpy_helper
from quick import quick_spec

from routetune.model import prepare
from routetune.registry import Registry
from routetune.run.tuning import tune
from routetune.weights import WEIGHTS, has_external_data, source_sha256


def external_model(path: Path, seed: int = 0) -> Path:
    """x [2, 64] float32 -> MatMul(W1) -> Add(b) -> Relu -> MatMul(Transpose(W2)) -> y [2, 64].

    W1 [64, 128] and W2 [64, 128] (32 KiB each) live in ``<name>.data`` beside the
    model; ``Transpose(W2)`` is a constant subgraph that fold-constants folds.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    b = np.linspace(-0.1, 0.1, 128, dtype=np.float32)  # 512 bytes: kept inside the model
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Transpose", ["W2"], ["W2t"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["r", "W2t"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
         numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime here reads (a newer onnx writes more)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path


def run_path(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


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
