"""Custom-op libraries (`routetune.libraries`): onnxruntime-extensions' real library,
registered with every ONNX Runtime session of a run, and the trust rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tomllib
from command import routetune, without_root_rights
from graphs import contrib_inverse
from quick import QUICK_FLAGS

from routetune.errors import UsageError
from routetune.libraries import EXTENSIONS, resolve

extensions = pytest.importorskip("onnxruntime_extensions")
LIBRARY = Path(extensions.get_library_path())
FLAG = "--custom-op-library"


def test_extensions_is_named_without_a_path_and_hashed() -> None:
    (lib,) = resolve([EXTENSIONS, str(LIBRARY)], FLAG)  # the same file, once
    assert lib.path == LIBRARY.resolve() and lib.named == EXTENSIONS
    assert len(lib.sha256) == 64 and lib.record()["sha256"] == lib.sha256


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p, "no such file"),
    (lambda p: p.mkdir() or p, "not a file"),
    (lambda p: p.write_text("#!/bin/sh\n") and p, "not a shared library"),
])
def test_a_library_that_cannot_be_one_is_refused_in_one_line(tmp_path: Path, make,
                                                              says: str) -> None:
    path = make(tmp_path / "libops.so")
    with pytest.raises(UsageError) as e:
        resolve([str(path)], FLAG)
    assert str(e.value).startswith(f"{FLAG} {path}: {says}") and "\n" not in str(e.value)


def test_an_unreadable_library_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "libops.so"
    shutil.copy(LIBRARY, path)
    path.chmod(0)
    model = contrib_inverse(tmp_path / "inverse.onnx")
    done = subprocess.run(without_root_rights(
        sys.executable, "-m", "routetune", "tune", str(model), "--output",
        str(tmp_path / "out"), FLAG, str(path)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"routetune: error: {FLAG} {path}: cannot be read"), line
    assert not (tmp_path / "out").exists()


def _tune(model: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    done = routetune("tune", str(model), "--output", str(out), "--seasonings",
                     "fp16,int8-qdq,fold-constants,ort-threads", "--max-depth", "1",
                     *QUICK_FLAGS, *flags)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.slow
def test_a_model_with_contrib_ops_is_tuned_with_the_library_registered(
        tmp_path: Path) -> None:
    model = contrib_inverse(tmp_path / "inverse.onnx")
    out = tmp_path / "out"
    library = tmp_path / "libortextensions.so"
    shutil.copy(LIBRARY, library)  # a library of the user's, by path

    code, _, err = _tune(model, out)  # without it: the reference cannot run, and says why
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "ai.onnx.contrib:Inverse" in err and FLAG in err

    code, stdout, err = _tune(model, out, FLAG, str(library))
    assert code == 0, err
    run = json.loads((out / "run.json").read_text())
    (recorded,) = run["libraries"]["custom_ops"]
    assert recorded["path"] == str(library.resolve())
    assert recorded["sha256"] == resolve([str(library)], FLAG)[0].sha256
    assert recorded["sha256"][:12] in (out / "report.md").read_text()
    winner = tomllib.loads((out / "winner.toml").read_text())
    assert winner["libraries"]["custom_ops"] == [str(library.resolve())]
    # every route either ran the custom op or was declined with its reason
    trials = {t["route"]: t for t in _trials(out)}
    assert trials["base"]["status"] == "ok"
    assert trials["fp16"]["status"] in ("ok", "failed-accuracy"), trials["fp16"]
    assert trials["int8-qdq"]["status"] == "skipped", trials["int8-qdq"]
    assert "ai.onnx.contrib:Inverse" in trials["int8-qdq"]["reason"]

    # the winner runs in ONNX Runtime with the library registered, and meets the bound
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library))
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    want = ort.InferenceSession(str(model), so).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(out / "winner.onnx"), so).run(None, {"x": x})[0]
    cos = float(np.dot(want.ravel(), got.ravel()) /
                (np.linalg.norm(want) * np.linalg.norm(got)))
    assert cos >= 0.999

    # a resume needs the flag again, and the same file
    code, _, err = _tune(model, out)
    assert code == 2 and "give --custom-op-library" in err and str(library.resolve()) in err
    with library.open("ab") as f:
        f.write(b"\0")  # another file now
    code, _, err = _tune(model, out, FLAG, str(library))
    assert code == 2 and "is not the" in err and "--fresh" in err
    assert len(err.strip().splitlines()) == 1, err
    assert (out / "trials.sqlite").exists()  # nothing recorded was lost

    # a stored run folder loads no library by itself
    for command in (["report", str(out)], ["show", str(out)]):
        maps = _maps_after(command)
        assert str(library.resolve()) not in maps and LIBRARY.name not in maps


def _trials(out: Path) -> list[dict]:
    from routetune.records.store import TrialStore

    store = TrialStore.open(out / "trials.sqlite")
    try:
        return [{"route": t.route, "status": t.status, "reason": t.reason}
                for t in store.trials()]
    finally:
        store.close()


def _maps_after(command: list[str]) -> str:
    """The shared objects a real process has mapped after running ``routetune COMMAND``."""
    code = ("import sys; from routetune.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print('MAPS' + open('/proc/self/maps').read())")
    done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("MAPS", 1)[1]


def test_fp16_keeps_a_custom_op_in_fp32_between_casts(tmp_path: Path) -> None:
    import onnx_graphsurgeon as gs
    from onnx import TensorProto

    from routetune.libraries import use
    from routetune.passes.precision.mixed import Fp16
    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
    from routetune.seasoning import RouteContext, RouteState

    model = onnx.load(contrib_inverse(tmp_path / "inverse.onnx"))
    feeds = [{"x": np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)}]
    backend = OnnxRuntimeBackend()
    use(resolve([EXTENSIONS], FLAG))
    try:
        graph = gs.import_onnx(model)
        done = Fp16({})(RouteState(graph), RouteContext(
            backend, tuple(feeds), "base", lambda m: backend.evaluate(m, feeds)))
        converted = gs.export_onnx(graph)
        want = next(iter(backend.evaluate(model, feeds)))["y"]
        got = next(iter(backend.evaluate(converted, feeds)))["y"]
    finally:
        use(())
    assert done.modified and "Inverse" in done.note  # kept, and the record says why
    (inverse,) = [n for n in converted.graph.node if n.op_type == "Inverse"]
    assert inverse.domain == "ai.onnx.contrib"
    makers = {o: n for n in converted.graph.node for o in n.output}
    assert makers[inverse.input[0]].op_type == "Cast"  # float16 -> float32 before it
    assert makers[inverse.input[0]].attribute[0].i == TensorProto.FLOAT
    readers = [n for n in converted.graph.node if inverse.output[0] in n.input]
    assert [n.op_type for n in readers] == ["Cast"]  # and back to float16 after it
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-2


@pytest.mark.slow
def test_the_api_keyword_and_a_recipe_name_a_library(tmp_path: Path) -> None:
    from quick import QUICK_KEYWORDS

    import routetune

    model = contrib_inverse(tmp_path / "inverse.onnx")
    done = routetune.tune(model, output=tmp_path / "api", seasonings="ort-threads",
                          custom_op_libraries=[EXTENSIONS], **QUICK_KEYWORDS)
    assert done.winner is not None and done.winner.status == "ok"
    shutil.copy(LIBRARY, tmp_path / "libops.so")
    recipe = tmp_path / "recipe.toml"  # a path relative to the recipe's folder
    recipe.write_text(f'schema_version = 2\n[model]\npath = "{model.name}"\n'
                      '[[seasonings]]\nname = "ort-threads"\n'
                      '[libraries]\ncustom_ops = ["libops.so"]\n')
    done = routetune.tune(recipe=recipe, output=tmp_path / "recipe", **QUICK_KEYWORDS)
    run = json.loads((tmp_path / "recipe" / "run.json").read_text())
    assert run["libraries"]["custom_ops"][0]["path"] == str((tmp_path / "libops.so").resolve())
    assert done.winner is not None
