from __future__ import annotations

import json
from pathlib import Path

import pytest
from graphs import matmul_chain
from quick import QUICK_FLAGS, quick_spec

from routetune.errors import UsageError
from routetune.model.loading import sha256
from routetune.records.store import TrialStore
from routetune.records.trial import Trial
from routetune.run.outdir import make_outdir, move_aside
from routetune.run.tuning import tune


def test_move_aside_never_overwrites_an_earlier_backup(tmp_path: Path) -> None:
    store = tmp_path / "trials.sqlite"
    backups = []
    for i in range(3):  # three --fresh runs within the same second
        s = TrialStore.open(store)
        s.add(Trial(f"f{i}", "m", "base", "b", "d", "s", "ok"))
        s.close()
        backups.append(move_aside(store))
    assert len(set(backups)) == 3 and not store.exists()
    kept = sorted(t.fingerprint for b in backups for t in TrialStore.open(b).trials())
    assert kept == ["f0", "f1", "f2"]


def test_move_aside_without_a_store(tmp_path: Path) -> None:
    assert move_aside(tmp_path / "trials.sqlite") is None


def test_the_default_folder_is_one_per_model_and_backend(tmp_path: Path) -> None:
    text, vision = tmp_path / "text" / "model.onnx", tmp_path / "vision" / "model.onnx"
    for path, depth in ((text, 2), (vision, 3)):  # Optimum names every export model.onnx
        path.parent.mkdir()
        matmul_chain(path, depth=depth, width=8, batch=2)
    shas = [sha256(p.read_bytes()) for p in (text, vision)]
    a = make_outdir(None, text, shas[0], "onnxruntime")
    b = make_outdir(None, vision, shas[1], "onnxruntime")
    c = make_outdir(None, text, shas[0], "tensorrt")
    assert len({a, b, c}) == 3
    assert a.name == f"model-{shas[0][:8]}-onnxruntime" and a.parent.name == "routetune-out"


def test_a_folder_that_holds_another_models_run_keeps_it(registry, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "shared"
    first = matmul_chain(tmp_path / "a.onnx", depth=2, width=8, batch=2)
    second = matmul_chain(tmp_path / "b.onnx", depth=3, width=8, batch=2)
    tune(quick_spec(model=first, output=out, seasonings=("ort-no-spinning",)), registry)
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()
            and p.name.startswith(("winner", "run.json", "report"))}
    assert {"winner.onnx", "winner.json", "run.json", "report.html"} <= set(kept)
    result = tune(quick_spec(model=second, output=out, seasonings=("ort-no-spinning",)),
                  registry)
    assert {name: (out / name).read_bytes() for name in kept} == kept  # never overwritten
    records = result.files["run"].parent
    assert records.parent == out / "runs" and (records / "winner.onnx").exists()
    assert json.loads((records / "run.json").read_text())["model"]["sha256"] == sha256(
        second.read_bytes())


def test_a_folder_of_other_files_is_refused_and_an_empty_or_routetune_one_taken(
        tmp_path: Path) -> None:
    # A recipe's output (or --output .) pointed at a folder of the user's own files:
    # report.html, run.json and winner.* there would replace files of theirs.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("my report")
    with pytest.raises(UsageError, match="holds other files and no routetune run"):
        make_outdir(mine, tmp_path / "m.onnx")
    assert (mine / "report.html").read_text() == "my report"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_outdir(empty, tmp_path / "m.onnx") == empty
    (mine / "trials.sqlite").write_bytes(b"")  # a routetune folder (its store)
    assert make_outdir(mine, tmp_path / "m.onnx") == mine


@pytest.mark.parametrize("backends", ["onnxruntime", "onnxruntime,openvino"])
def test_a_run_refused_after_its_folder_was_made_leaves_no_empty_folder(
        tmp_path: Path, backends: str) -> None:
    from command import routetune
    from graphs import kv_decoder

    model = kv_decoder(tmp_path / "decoder.onnx")
    (tmp_path / "short.txt").write_text("hi")  # 2 tokens: the decode objective needs 512
    done = routetune("tune", str(model), "--tokens", str(tmp_path / "short.txt"),
                     "--backend", backends, "--output", str(tmp_path / "new" / "out"))
    assert done.returncode == 2 and "holds 2 tokens" in done.stderr
    assert not (tmp_path / "new").exists()  # neither the folder nor the parent it made
    kept = tmp_path / "mine"
    kept.mkdir()  # a folder the user made stays, empty or not
    done = routetune("tune", str(model), "--tokens", str(tmp_path / "short.txt"),
                     "--backend", backends, "--output", str(kept))
    assert done.returncode == 2 and kept.is_dir()


@pytest.mark.parametrize("backends", ["onnxruntime", "onnxruntime,openvino"])
def test_a_run_refused_at_its_reference_removes_the_folder_it_made_and_keeps_a_run(
        tmp_path: Path, backends: str) -> None:
    """An all-NaN reference is refused once the run holds its folder (lock and logs)."""
    import numpy as np
    from command import routetune

    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=16, batch=2)
    nan = tmp_path / "nan.npz"
    np.savez(nan, x=np.full((2, 16), np.nan, np.float32))
    out = tmp_path / "new" / "out"
    done = routetune("tune", str(model), "--inputs", str(nan), "--backend", backends,
                     "--output", str(out))
    assert done.returncode == 2 and "is all NaN on input set 0" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()  # neither its lock and logs nor the parent
    finished = tmp_path / "finished"
    done = routetune("tune", str(model), "--backend", "onnxruntime", "--output",
                     str(finished), "--seasonings", "ort-threads", *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr
    before = {p: p.read_bytes() for p in finished.rglob("*")
              if p.is_file() and "logs" not in p.parts and p.suffix != ".lock"}
    done = routetune("tune", str(model), "--inputs", str(nan), "--backend", "onnxruntime",
                     "--output", str(finished))
    assert done.returncode == 2
    assert {p: p.read_bytes() for p in before} == before  # a run of its own stays whole
