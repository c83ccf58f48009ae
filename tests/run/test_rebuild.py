"""``routetune build``: whose fault a route that is not built is, and its exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from graphs import conv_bn
from onnx import TensorProto, helper, numpy_helper
from quick import quick_spec

from routetune.registry import Registry
from routetune.run.rebuild import rebuild
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning, SeasoningInfo


class Recast(Seasoning):
    """Puts a Cast to FLOAT on the float32 input: legal ONNX, and against the contract."""

    info = SeasoningInfo(name="recast", stage="graph", summary="adds a no-op Cast")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        x = state.graph.inputs[0]
        again = gs.Variable("x_again", np.float32, x.shape)
        for node in list(x.outputs):
            node.inputs = [again if t is x else t for t in node.inputs]
        state.graph.nodes.append(gs.Node("Cast", "recast", {"to": 1}, [x], [again]))
        return PassResult(True)


class Boom(Seasoning):
    """Raises what a bug raises."""

    info = SeasoningInfo(name="boom", stage="graph", summary="crashes")

    def apply(self, state: RouteState, ctx: RouteContext) -> PassResult:
        raise KeyError("no such tensor")


def test_a_pass_that_breaks_the_model_or_crashes_is_named_as_its_fault(
        registry: Registry, tmp_path: Path) -> None:
    registry.add_seasoning(Recast)
    registry.add_seasoning(Boom)
    model = conv_bn(tmp_path / "m.onnx")
    opts = quick_spec(model=model, output=tmp_path / "out", shapes="x:1x3x32x32")
    broken = rebuild(opts, "recast", registry)
    assert broken.engine_file is None and not broken.failed
    assert broken.broken.startswith("after 'recast': the rewrite left a redundant Cast")
    crashed = rebuild(opts, "boom", registry)
    assert crashed.broken.startswith("seasoning 'boom' crashed after 'base': KeyError")
    fine = rebuild(opts, "fold-constants", registry)
    assert not fine.broken and not fine.failed and fine.verdict is not None


def test_a_declined_pass_is_one_line_and_exit_1(tmp_path: Path) -> None:
    # Conformance K11: ONNX Runtime's quantizer printed its own "WARNING:root:" line
    # ahead of routetune's; int8-qdq declines a float16 model, and one line says why.
    w = (np.arange(80, dtype=np.float32).reshape(8, 10) / 80).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 10])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m16.onnx")
    done = subprocess.run([sys.executable, "-m", "routetune", "build", str(tmp_path / "m16.onnx"),
                           "--route", "int8-qdq", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("not built: int8-qdq: seasoning 'int8-qdq' failed after 'base'")
    assert "computes in float16 already" in lines[0]


def test_several_backends_are_one_line_naming_the_folder_to_build_from(tmp_path: Path) -> None:
    # a multi-backend search keeps each backend's run in OUTDIR/<backend>; build takes one
    done = subprocess.run([sys.executable, "-m", "routetune", "build", "--example", "ppocr-cls",
                           "--backend", "onnxruntime,openvino", "--route", "base", "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0] == ("routetune: error: --backend onnxruntime,openvino: build rebuilds a "
                        "route on one backend; name one, with that backend's folder of the "
                        "search, e.g. --backend openvino --output OUTDIR/openvino")
    assert not (tmp_path / "out").exists()  # nothing written
