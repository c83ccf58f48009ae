"""``routetune tune --backend tensorrt`` as a real subprocess, with the real builder.

Bad profiles and spaces, refused before any build, run the command in this process.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from command import routetune as routetune_here
from graphs import constant_unique, conv_bn, uint8_mask
from quick import QUICK_FLAGS

from routetune.plugins.tensorrt.backend import _gpu
from routetune.plugins.tensorrt.module import find_tensorrt

TRT = find_tensorrt()
needs_trt = pytest.mark.skipif(TRT.module is None, reason=f"tensorrt backend: {TRT.reason}")


def routetune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=600)


@needs_trt
@pytest.mark.skipif(bool(_gpu()), reason="a GPU here runs the engines; this pins build-only")
def test_every_route_is_built_and_recorded_build_only_then_resumed(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    out = tmp_path / "out"
    args = ["tune", str(model), "--backend", "tensorrt", "--shapes", "x:2x3x32x32",
            "--max-shapes", "x:4x3x32x32", "--search", "one-at-a-time", "--output", str(out),
            "--seasonings", "fuse-bn-into-conv,trt-opt-level,trt-tf32,trt-build-route,"
            "trt-cuda-graph", *QUICK_FLAGS]
    first = routetune(*args)
    assert first.returncode == 0, first.stderr
    rows = sqlite3.connect(out / "trials.sqlite").execute(
        "SELECT route, status, reason, fingerprint, passes, settings, versions FROM trials"
    ).fetchall()
    status = {r[0]: r[1] for r in rows}
    levels = ["trt-opt-level", *(f"trt-opt-level{{level={n}}}" for n in (0, 1, 2, 4))]
    assert status == {"base": "build-only", "fuse-bn-into-conv": "build-only",
                      "trt-tf32": "build-only", "trt-build-route": "skipped",
                      "trt-cuda-graph": "build-only",  # base's plan, run another way
                      **dict.fromkeys(levels, "skipped")}
    reasons = {r[0]: r[2] for r in rows}
    for route in levels:  # TensorRT-RTX builds this model's plan alike at every level
        assert reasons[route] == ("same engine as route 'base' (equal engine sha256 and "
                                  "run-time options)"), reasons[route]
    base = next(r for r in rows if r[0] == "base")
    assert "not run: no CUDA GPU here" in base[2]
    assert [p["step"] for p in json.loads(base[4])] == ["int32-limits", "fold-if"]
    assert json.loads(base[5])["tensorrt.profile"] == "x:2x3x32x32/2x3x32x32/4x3x32x32"
    assert json.loads(base[6])["tensorrt_module"] == TRT.name
    plans = {p.stem: p.stat().st_mtime_ns for p in (out / "artifacts" / "engines").glob("*.plan")}
    assert set(plans) >= {r[3] for r in rows if r[1] == "build-only"}  # and the skipped
    assert "winner: base (engines were built but this device cannot run them" in first.stdout
    skipped = next(r for r in rows if r[0] == "trt-build-route")
    assert "no Global Performance Tuner" in skipped[2]  # `routetune show --status skipped`
    assert "6 skipped" in first.stdout  # the summary counts them

    again = routetune(*args)
    assert again.returncode == 0, again.stderr
    after = {p.stem: p.stat().st_mtime_ns for p in (out / "artifacts" / "engines").glob("*.plan")}
    assert after == plans  # resumed from the store: nothing rebuilt


@needs_trt
@pytest.mark.parametrize(("extra", "message"), [
    ([], "routetune: error: input 'x' (x float32[N,3,32,32]): dimension 0 ('N') is dynamic; "
         "give its size with --shapes x:1x3x32x32"),
    (["--shapes", "x:2x3x32x32", "--min-shapes", "x:4x3x32x32"],
     "routetune: error: input 'x' dimension 0: min 4, opt 2, max 2 are not in order"),
    (["--shapes", "x:2x3x32x32", "--space", "trt-opt-level:level=0|9"],
     "routetune: error: --space trt-opt-level:level: parameter 'level': 9 is not one of "
     "5|4|2|1|0|3"),
    (["--shapes", "x:2x3x32x32", "--space", "trt-opt-level"],
     "routetune: error: --space 'trt-opt-level': write SEASONING:PARAM=VALUE1|VALUE2"),
    (["--shapes", "x:2x3x32x32", "--opt-shapes", "x:2x3x32x32"],
     "routetune: error: --shapes with --opt-shapes: --shapes sets min, opt and max at once"),
    (["--opt-shapes", "x:2x3x32"], "routetune: error: --opt-shapes: input 'x' has rank 4"),
    (["--shapes", "x:2x3x32x32", "--seasonings", "int32-limits"],
     "routetune: error: --seasonings: 'int32-limits' is part of the tensorrt backend's "
     "preflight"),
])
def test_bad_profiles_and_spaces_exit_2_with_one_line(tmp_path: Path, extra: list[str],
                                                      message: str) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    done = routetune_here("tune", str(model), "--backend", "tensorrt", "--output",
                          str(tmp_path / "out"), *extra)
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


BLOCK = ("import sys\n"
         "for name in ('tensorrt', 'tensorrt_rtx', 'tensorrt_rtx_bindings'):\n"
         "    sys.modules[name] = None  # Python's own way to make an import fail\n"
         "from routetune.cli import main\n"
         "main(sys.argv[1:])\n")


@pytest.mark.slow
def test_without_tensorrt_the_backend_is_unavailable_and_nothing_else_breaks(
        tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, "-c", BLOCK, "seasonings"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines()
               if [c.strip() for c in line.split("│")][1:3] == ["backend", "tensorrt"])
    assert "unavailable: no TensorRT Python module" in row
    model = conv_bn(tmp_path / "m.onnx")
    refused = subprocess.run([sys.executable, "-c", BLOCK, "tune", str(model), "--backend",
                              "tensorrt", "--shapes", "x:1x3x32x32"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.startswith("routetune: error: --backend tensorrt: not available "
                                     "here (no TensorRT Python module (tensorrt: import of")
    ort = subprocess.run([sys.executable, "-c", BLOCK, "tune", str(model), "--shapes",
                          "x:1x3x32x32", "--seasonings", "fuse-bn-into-conv", *QUICK_FLAGS,
                          "--output", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert ort.returncode == 0, ort.stderr


@needs_trt
def test_space_limits_one_at_a_time_and_inputs_span_the_profile(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    for batch in (2, 4):
        np.savez(tmp_path / f"b{batch}.npz", x=rng.random((batch, 3, 32, 32), dtype=np.float32))
    out = tmp_path / "out"
    done = routetune("tune", str(model), "--backend", "tensorrt", "--inputs", str(tmp_path),
                     "--search", "one-at-a-time", "--seasonings", "trt-opt-level",
                     "--space", "trt-opt-level:level=0|3", "--output", str(out), *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr
    rows = dict(sqlite3.connect(out / "trials.sqlite").execute(
        "SELECT route, settings FROM trials").fetchall())
    assert set(rows) == {"base", "trt-opt-level{level=0}", "trt-opt-level{level=3}"}
    assert json.loads(rows["base"])["tensorrt.profile"] == "x:2x3x32x32/2x3x32x32/4x3x32x32"
    narrow = routetune("tune", str(model), "--backend", "tensorrt", "--inputs", str(tmp_path),
                       "--max-shapes", "x:3x3x32x32", "--output", str(out))
    assert narrow.returncode == 2
    assert narrow.stderr.startswith("routetune: error: --inputs: input 'x' has shape "
                                    "4x3x32x32, outside the profile 2x3x32x32..3x3x32x32")


@needs_trt
def test_a_model_no_route_can_build_exits_1_and_says_so(tmp_path: Path) -> None:
    """Unique has no TensorRT-RTX importer; every route fails the same way."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
         helper.make_node("Unique", ["r"], ["y"], name="uniq0", sorted=1)], "u",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "u.onnx")
    done = routetune("tune", str(tmp_path / "u.onnx"), "--backend", "tensorrt", "--search",
                     "one-at-a-time", "--seasonings", "trt-opt-level", "--output",
                     str(tmp_path / "out"), *QUICK_FLAGS)
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stdout.split())
    assert "winner: base (the base route itself is build-failed (TensorRT's ONNX parser " \
           "refused the model: node 'uniq0' (Unique)" in text
    assert "there is no engine to deploy" in text


@needs_trt
@pytest.mark.skipif(bool(_gpu()), reason="a GPU here runs the engines; this pins build-only")
@pytest.mark.parametrize("make", [uint8_mask, constant_unique])  # TensorRT#3124, and Unique
def test_a_fixing_route_is_handed_back_as_built_when_the_base_route_does_not_build(
        tmp_path: Path, make) -> None:  # noqa: ANN001
    model = make(tmp_path / "m.onnx")
    out = tmp_path / "out"
    done = routetune("tune", str(model), "--backend", "tensorrt", "--seasonings",
                     "fold-constants", "--output", str(out), *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr  # a route builds: something to deploy
    text = " ".join(done.stdout.split())
    assert "winner: fold-constants" in text and "handed back as built, not measured" in text
    winner = json.loads((out / "winner.json").read_text())
    assert winner["route"] == "fold-constants" and winner["status"] == "build-only"
    ops = {n.op_type for n in onnx.load(out / "winner.onnx").graph.node}
    assert not ops & {"Cast", "Unique"}, ops  # the unbuildable base is not the winner
