"""A results folder is data, never code (SECURITY.md).

Hostile folders: pickles planted where routetune once kept them, candidate models and
weight files changed on disk, external data that leads out of the model's folder; and a
scan of the package for calls that deserialise code or run text.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pickle
import sqlite3
from pathlib import Path

import numpy as np
import onnx
import pytest
from command import routetune
from graphs import conv_bn, external_model, run_path
from quick import QUICK_FLAGS, quick_spec

from routetune.candidate.artifacts import matches_record
from routetune.errors import UsageError
from routetune.model.loading import prepare
from routetune.model.weights import WEIGHTS
from routetune.records.store import TrialStore
from routetune.registry import Registry
from routetune.run.tuning import tune

ROOT = Path(__file__).parents[1]
PACKAGE = ("core", "passes", "plugins", "benchmarks")
"""The folders of the installed package (pyproject's package-dir), and the benchmarks,
which read results folders too."""

FORBIDDEN = {
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads",
    "marshal.load", "marshal.loads", "shelve.open", "dill.load", "dill.loads",
    "cloudpickle.load", "cloudpickle.loads", "joblib.load", "pandas.read_pickle",
    "yaml.load", "yaml.unsafe_load", "yaml.full_load", "eval", "exec", "builtins.eval",
    "builtins.exec",
}
"""Calls that run code found in data. Process-local pickling by multiprocessing itself
(`Connection.recv`, pebble's queues) is in memory and is not called by name here."""

NEEDS_KEYWORD = {"numpy.load": ("allow_pickle", False), "torch.load": ("weights_only", True)}
"""Loaders that are safe only with a keyword given explicitly."""


def unsafe_calls(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: call`` for each call in `source` that may run code found in data.

    Names are resolved through the module's imports (``import numpy as np``, ``from
    pickle import loads as l``), so an alias does not hide a call.
    """
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else (
                    a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return aliases.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute):
            base = dotted(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        if name is None:
            continue
        where = f"{filename}:{node.lineno}: {name}"
        if name in FORBIDDEN:
            found.append(where)
        elif name in NEEDS_KEYWORD:
            key, value = NEEDS_KEYWORD[name]
            if not any(k.arg == key and isinstance(k.value, ast.Constant)
                       and k.value.value is value for k in node.keywords):
                found.append(f"{where} without {key}={value}")
    return found


@pytest.mark.parametrize("source", [
    "import pickle\npickle.loads(b'')",
    "from pickle import load as l\nl(open('f', 'rb'))",
    "import numpy as np\nnp.load('x.npz')",
    "import numpy\nnumpy.load('x.npz', allow_pickle=True)",
    "import torch\ntorch.load('w.pt')",
    "eval(open('run.json').read())",
    "import marshal\nmarshal.loads(b'')",
    "import yaml\nyaml.load('a: 1')",
])
def test_the_scan_finds_each_way_of_running_code_from_data(source: str) -> None:
    assert len(unsafe_calls(source)) == 1, source


def test_the_scan_passes_safe_loaders() -> None:
    safe = ("import numpy as np\nnp.load('x.npz', allow_pickle=False)\n"
            "import torch\ntorch.load('w.pt', weights_only=True)\n"
            "import json\njson.loads('{}')\nimport pickle\npickle.dumps(1)\n")
    assert unsafe_calls(safe) == []


def test_the_package_never_runs_code_from_data() -> None:
    files = [f for folder in PACKAGE for f in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 40  # the scan saw the package
    found = [hit for f in files
             for hit in unsafe_calls(f.read_text(), str(f.relative_to(ROOT)))]
    assert found == []


class Plant:
    """A pickle that, when loaded, creates the file `marker` (what a hostile one does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (open, (str(self.marker), "w"))


@pytest.mark.slow
def test_a_planted_pickle_in_a_results_folder_runs_no_code(tmp_path: Path) -> None:
    # Route-prefix entries and the workers' inputs were pickles in the output folder, so
    # a folder from someone else ran code as the next user who tuned in it.
    marker = tmp_path / "pwned"
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    args = ("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
            "--seasonings", "fp16,ort-threads", "--search", "exhaustive", "--max-depth", "2",
            *QUICK_FLAGS, "--keep", "all")  # prefixes stay
    assert routetune(*args).returncode == 0
    artifacts = out / "artifacts"
    prefixes = artifacts / "prefixes"
    entries = list(prefixes.glob("*.json"))
    assert entries
    planted = pickle.dumps(Plant(marker))
    for entry in entries:  # a pickle where JSON belongs, and a .pkl beside it
        entry.write_bytes(planted)
        entry.with_suffix(".pkl").write_bytes(planted)
    (artifacts / f"inputs-{os.getpid()}-1.pkl").write_bytes(planted)  # the old inputs file
    (artifacts / "engines").mkdir(exist_ok=True)
    (artifacts / "engines" / "timing.cache").write_bytes(planted)
    for again in (routetune(*args), routetune(*args, "--fresh")):
        assert again.returncode == 0, again.stderr[-2000:]
        assert not marker.exists()
    for model_file in (artifacts / "models").glob("*.onnx"):  # models not matching their hash
        model_file.write_bytes(b"not the model")
    for entry in prefixes.glob("*.json"):
        entry.unlink()
    third = routetune(*args, "--fresh")
    assert third.returncode == 0, third.stderr[-2000:]
    assert not marker.exists()


def test_changed_candidate_models_and_weights_of_stored_trials_are_made_again(
        registry: Registry, tmp_path: Path) -> None:
    # Resuming in a folder someone changed: the stored trials are reused, but the
    # winner's model and weights are checked against the store's record before they
    # are confirmed, run for winner_outputs.npz, or written as winner.onnx.
    path = external_model(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    options = quick_spec(model=path, output=out, shapes="x:2x64", seasonings=("fp16",),
                         accuracy="l2<=0.05")
    first = tune(options, registry)
    assert first.winner.status == "ok" and first.winner.artifact  # base or fp16
    models = out / "artifacts" / "models"
    for weights in (models / WEIGHTS).glob("*.bin"):  # same size, other values
        weights.write_bytes(np.full(weights.stat().st_size, 7, np.uint8).tobytes())
    for candidate in models.glob("*.onnx"):
        candidate.write_bytes(candidate.read_bytes() + b"\0")
    again = tune(options, registry)
    assert again.winner.route == first.winner.route
    store = TrialStore.open(out / "trials.sqlite")
    try:
        assert len(store.trials()) == len(first.trials)  # resumed: nothing re-measured
    finally:
        store.close()
    winner = again.winner
    assert matches_record(out / winner.artifact, winner.settings, winner.candidate_sha256)
    used = {e.value for t in onnx.load(str(out / winner.artifact),
                                        load_external_data=False).graph.initializer
            for e in t.external_data if e.key == "location"}
    assert used
    for location in used:
        data = (models / location).read_bytes()
        assert hashlib.sha256(data).hexdigest() == Path(location).stem
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    got = run_path(again.files["model"], x).astype(np.float32)
    assert np.abs(got - run_path(path, x)).max() < 0.05


def outside_model(tmp_path: Path, how: str) -> Path:
    """A model whose external data file leads out of its folder, in the way `how` says."""
    model = external_model(tmp_path / "elsewhere" / "m.onnx")
    data = model.with_name("m.onnx.data")
    folder = tmp_path / "model"
    folder.mkdir()
    proto = onnx.load(str(model), load_external_data=False)
    if how == "dotdot":
        location = "../elsewhere/m.onnx.data"
    elif how == "absolute":
        location = str(data)
    else:  # a link inside the folder that leads out of it
        (folder / "m.onnx.data").symlink_to(data)
        location = "m.onnx.data"
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    target = folder / "m.onnx"
    target.write_bytes(proto.SerializeToString())
    return target


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_models_folder_is_refused_in_one_line(
        tmp_path: Path, how: str) -> None:
    model = outside_model(tmp_path, how)
    run = routetune("tune", str(model), "--output", str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "leads outside the model's folder" in lines[0]
    assert "--allow-external-data-outside" in lines[0]
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="outside the model's folder"):
        prepare(model)
    assert prepare(model, allow_outside=True).weights == model.parent


def test_with_the_flag_external_data_outside_is_copied_into_the_run(
        registry: Registry, tmp_path: Path) -> None:
    model = outside_model(tmp_path, "dotdot")
    out = tmp_path / "out"
    result = tune(quick_spec(model=model, output=out, shapes="x:2x64",
                             seasonings=("ort-no-spinning",),
                             allow_external_data_outside=True), registry)
    assert result.base.status == "ok"
    stored = list((out / "artifacts" / "models" / WEIGHTS).glob("*.bin"))
    assert stored and all(hashlib.sha256(f.read_bytes()).hexdigest() == f.stem
                          for f in stored)


@pytest.mark.parametrize(("planted", "link"), [
    (".routetune.lock", "symbolic"), ("winner.json", "symbolic"),
    ("artifacts/logs/build.log", "symbolic"), (".routetune.lock", "hard"),
    ("artifacts/logs/base.log", "hard")])
def test_a_link_planted_in_an_output_folder_is_refused_before_any_write(
        tmp_path: Path, planted: str, link: str) -> None:
    # The lock file is truncated and logs appended to: through a link, a file outside.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    (out / planted).parent.mkdir(parents=True, exist_ok=True)
    if link == "symbolic":
        (out / planted).symlink_to(victim)
    else:
        (out / planted).hardlink_to(victim)
    model = conv_bn(tmp_path / "m.onnx")
    run = routetune("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out))
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a symbolic or hard link" in lines[0] and planted in lines[0]
    assert victim.read_text() == "keep me\n"


def tuned_folder(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """A finished quick run's folder, and the command that ran it (to run it again)."""
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    # no route clears --min-speedup 1000, so none is confirmed: a confirmation would
    # build the base route again and rewrite a planted base model before it is judged
    args = ("tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
            "--seasonings", "ort-no-spinning", "--min-speedup", "1000", *QUICK_FLAGS)
    assert routetune(*args).returncode == 0
    return out, args


def test_a_stored_artifact_path_outside_the_folder_is_refused_in_one_line(
        tmp_path: Path) -> None:
    # A planted store could name /dev/zero (unbounded read) or a FIFO (a hang).
    out, args = tuned_folder(tmp_path)
    conn = sqlite3.connect(out / "trials.sqlite")
    conn.execute("UPDATE trials SET artifact = '/dev/zero'")
    conn.commit()
    conn.close()
    again = routetune(*args)
    assert again.returncode == 2, again.stderr[-2000:]
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a candidate model path" in lines[0], again.stderr


def test_a_planted_winner_with_a_forged_record_is_refused_not_shipped(tmp_path: Path) -> None:
    # Whoever writes the folder can write the store's hashes too: the winner's outputs
    # are checked against the FP32 reference again before winner.onnx is written.
    out, args = tuned_folder(tmp_path)
    store = TrialStore.open(out / "trials.sqlite")
    base = next(t for t in store.trials() if t.route == "base")
    store.close()
    model = onnx.load(str(out / base.artifact))
    for tensor in model.graph.initializer:  # every weight zero: all-zero outputs
        tensor.CopyFrom(onnx.numpy_helper.from_array(
            np.zeros_like(onnx.numpy_helper.to_array(tensor)), tensor.name))
    data = model.SerializeToString()
    (out / base.artifact).write_bytes(data)
    forged = hashlib.sha256(data + json.dumps(base.settings, sort_keys=True).encode())
    conn = sqlite3.connect(out / "trials.sqlite")
    conn.execute("UPDATE trials SET candidate_sha256 = ? WHERE route = 'base'",
                 (forged.hexdigest(),))
    conn.commit()
    conn.close()
    (out / "winner.onnx").unlink()
    again = routetune(*args)
    assert again.returncode == 2, again.stderr[-2000:]
    assert "no longer meets the accuracy constraint" in again.stderr
    assert not (out / "winner.onnx").exists()
