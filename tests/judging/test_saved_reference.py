"""The FP32 reference from a file (`routetune.judging.saved_reference`): an ``.npz`` per
input set and Polygraphy's saved outputs, against the live reference on a real search."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from command import routetune
from graphs import conv_bn
from quick import QUICK_FLAGS

from routetune.records.store import TrialStore

FLAG = "--reference-outputs"
SEASONINGS = "fp16,fuse-bn-into-conv,int8-qdq"
polygraphy = shutil.which("polygraphy") or str(Path(sys.executable).parent / "polygraphy")


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv_bn at batch 2, two input sets in a folder, and their outputs saved as .npz."""
    root = tmp_path_factory.mktemp("saved")
    model = conv_bn(root / "m.onnx", batch=2)
    rng = np.random.default_rng(3)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    for i in range(2):
        x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
        (root / "inputs").mkdir(exist_ok=True)
        (root / "reference").mkdir(exist_ok=True)
        np.savez(root / "inputs" / f"set{i}.npz", x=x)
        np.savez(root / "reference" / f"set{i}.npz", y=session.run(None, {"x": x})[0])
    return root


def _tune(case: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    done = routetune("tune", str(case / "m.onnx"), "--inputs", str(case / "inputs"),
                     "--output", str(out), "--seasonings", SEASONINGS, "--max-depth", "1",
                     "--accuracy", "cos>=0.9999", *QUICK_FLAGS, "--memory", "off", *flags)
    return done.returncode, done.stdout, done.stderr


def _verdicts(out: Path) -> dict[str, tuple[str, dict[str, float]]]:
    """Each route's status and its accuracy figures against the reference."""
    store = TrialStore.open(out / "trials.sqlite")
    try:
        return {t.route: (str(t.status), {f"{o}:{m}": v for o, per in t.accuracy.items()
                                          for m, v in per.items()})
                for t in store.trials()}
    finally:
        store.close()


def _winner(out: Path) -> str:
    return json.loads((out / "winner.json").read_text())["route"]


@pytest.mark.slow
def test_a_saved_reference_gives_the_verdict_of_the_live_one(case: Path, tmp_path: Path
                                                             ) -> None:
    code, _, err = _tune(case, tmp_path / "live")
    assert code == 0, err
    live = _verdicts(tmp_path / "live")
    assert {s for s, _ in live.values()} >= {"ok"}

    code, stdout, err = _tune(case, tmp_path / "npz", FLAG, str(case / "reference"))
    assert code == 0, err
    assert "not run here" in err and f"judged against the outputs in {case / 'reference'}" \
        in " ".join(stdout.split())
    saved = _verdicts(tmp_path / "npz")
    assert {r: s for r, (s, _) in saved.items()} == {r: s for r, (s, _) in live.items()}
    for route, (_, figures) in live.items():  # the same reference, bit for bit
        assert saved[route][1] == pytest.approx(figures, rel=1e-6, abs=1e-9)
    run = json.loads((tmp_path / "npz" / "run.json").read_text())
    assert run["reference"]["source"] == "file" and run["reference"]["sets"] == 2
    assert len(run["reference"]["sha256"]) == 64
    assert run["reference"]["sha256"][:16] in (tmp_path / "npz" / "report.md").read_text()
    assert "reference_outputs" in (tmp_path / "npz" / "winner.toml").read_text()

    # Polygraphy's own run of the same input sets, saved with its own writer
    from polygraphy.json import load_json, save_json

    feeds = [dict(np.load(f)) for f in sorted((case / "inputs").glob("*.npz"))]
    save_json(feeds, tmp_path / "inputs.json")
    assert len(load_json(tmp_path / "inputs.json")) == 2
    done = subprocess.run([polygraphy, "run", str(case / "m.onnx"), "--onnxrt",
                           "--load-inputs", str(tmp_path / "inputs.json"),
                           "--save-outputs", str(tmp_path / "outputs.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    code, _, err = _tune(case, tmp_path / "polygraphy", FLAG, str(tmp_path / "outputs.json"))
    assert code == 0, err
    polygraphy_run = _verdicts(tmp_path / "polygraphy")
    assert {r: s for r, (s, _) in polygraphy_run.items()} == {
        r: s for r, (s, _) in live.items()}
    assert json.loads((tmp_path / "polygraphy" / "run.json").read_text())[
        "reference"]["format"] == "polygraphy"


@pytest.mark.slow
def test_a_wrong_valued_reference_makes_no_route_accurate(case: Path, tmp_path: Path
                                                          ) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for f in sorted((case / "reference").glob("*.npz")):
        y = np.load(f)["y"]
        np.savez(wrong / f.name, y=np.ascontiguousarray(y[:, ::-1]))  # channels reversed
    code, stdout, err = _tune(case, tmp_path / "out", FLAG, str(wrong))
    assert code in (0, 1), err
    verdicts = _verdicts(tmp_path / "out")
    assert not any(s == "ok" for s, _ in verdicts.values()), verdicts
    assert "judged against the outputs in" in " ".join(stdout.split())


@pytest.mark.parametrize(("spoil", "says"), [
    (lambda y: {"z": y}, "'z' is not a model output"),
    (lambda y: {}, "missing output 'y'"),
    (lambda y: {"y": y.astype(np.float64)}, "output 'y' is float64, the model gives float32"),
    (lambda y: {"y": y[:, :8]}, "output 'y' has shape 2x8x32x32"),
])
def test_a_reference_that_does_not_fit_the_model_is_refused_in_one_line(
        case: Path, tmp_path: Path, spoil, says: str) -> None:  # noqa: ANN001
    spoilt = tmp_path / "spoilt"
    shutil.copytree(case / "reference", spoilt)
    y = np.load(spoilt / "set1.npz")["y"]
    np.savez(spoilt / "set1.npz", **spoil(y))
    code, _, err = _tune(case, tmp_path / "out", FLAG, str(spoilt))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert f"{FLAG} {spoilt} (input set 2): {says}" in line, line
    assert not (tmp_path / "out" / "trials.sqlite").exists()


def test_a_reference_of_other_input_sets_is_refused(case: Path, tmp_path: Path) -> None:
    code, _, err = _tune(case, tmp_path / "out", FLAG, str(case / "reference" / "set0.npz"))
    assert code == 2 and "holds 1 input set's outputs, and the run judges on 2 input sets" \
        in err, err


def test_polygraphy_results_of_two_runners_are_refused(case: Path, tmp_path: Path) -> None:
    from polygraphy.comparator import IterationResult, RunResults

    y = np.load(case / "reference" / "set0.npz")["y"]
    results = RunResults()
    for name in ("onnxrt-runner", "trt-runner"):
        results.append((name, [IterationResult({"y": y}, runner_name=name)] * 2))
    results.save(str(tmp_path / "two.json"))
    code, _, err = _tune(case, tmp_path / "out", FLAG, str(tmp_path / "two.json"))
    assert code == 2 and "holds the results of 2 runners (onnxrt-runner, trt-runner)" in err
    (tmp_path / "not.json").write_text("{}")
    code, _, err = _tune(case, tmp_path / "out", FLAG, str(tmp_path / "not.json"))
    assert code == 2 and "not Polygraphy's saved run results" in err, err
    assert len(err.strip().splitlines()) == 1
