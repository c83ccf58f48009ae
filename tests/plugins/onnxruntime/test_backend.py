"""The ONNX Runtime backend's runners, with real sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from graphs import conv_bn
from onnx import TensorProto, helper

from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend


def transposed_weight(path: Path, width: int) -> int:
    """y = x @ Transpose(w), w f32[width,width] (x f32[1,width]); the Transpose's bytes.

    With graph optimisations off the Transpose runs at every inference: a large
    intermediate in the run's memory block, next to the small output.
    """
    w = np.random.default_rng(0).standard_normal((width, width), dtype=np.float32)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], name="t"),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, width])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, width])], [onnx.numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return width * width * 4


def test_reference_outputs_own_their_memory(tmp_path: Path) -> None:
    model = conv_bn(tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feed = {"x": np.ones((1, 3, 32, 32), np.float32)}
    assert not session.run(None, feed)[0].flags.owndata  # ONNX Runtime lends a view
    with OnnxRuntimeBackend().reference(model) as runner:
        outputs = runner.infer(feed)
    assert all(a.flags.owndata for a in outputs.values())


HELD = """
import gc, sys
from pathlib import Path
import numpy as np
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend

def rss_anon():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

folder = Path(sys.argv[1])
with OnnxRuntimeBackend().reference(folder / "m.onnx") as runner:
    runner.infer({"x": np.ones((1, 3, 32, 32), np.float32)})  # ORT's one-time set-up
gc.collect()
before = rss_anon()
with OnnxRuntimeBackend().reference(folder / "t.onnx") as runner:
    kept = [runner.infer({"x": np.ones((1, 4096), np.float32)}) for _ in range(2)]
gc.collect()
print(len(kept), rss_anon() - before)
"""
"""Measured in a process of its own: how much memory a test worker holds before (and
what its allocator kept of other tests) is no part of the figure."""


def test_kept_outputs_do_not_hold_a_closed_sessions_memory(tmp_path: Path) -> None:
    # The large-model benchmark: two kept reference outputs of a 1 GiB model held
    # 0.55 GiB of the closed session in tune's main process for the whole run (each
    # output a view into its run's block of intermediates, a 256 MiB Transpose among them).
    intermediate = transposed_weight(tmp_path / "t.onnx", width=4096)  # 64 MiB
    conv_bn(tmp_path / "m.onnx")
    done = subprocess.run([sys.executable, "-c", HELD, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    kept, held = map(int, done.stdout.split())
    assert kept == 2 and held < intermediate // 2, f"{held / 2**20:.0f} MiB still held"


def test_each_run_gets_a_private_copy_of_its_inputs(tmp_path: Path) -> None:
    # Conformance K9: a run that writes into an input (a training-mode
    # BatchNormalization updating its mean and variance) must not change the caller's
    # arrays, which the FP32 reference reads next
    model = conv_bn(tmp_path / "m.onnx")
    feed = {"x": np.ones((1, 3, 32, 32), np.float32)}
    with OnnxRuntimeBackend().reference(model) as runner:
        handed = runner._cast(feed)  # what the session receives
        call = runner.prepare(feed)
        call()
    assert not np.shares_memory(handed["x"], feed["x"])
    assert np.array_equal(feed["x"], np.ones((1, 3, 32, 32), np.float32))


def test_a_bfloat16_output_comes_back_as_bfloat16_from_the_device() -> None:
    # ONNX Runtime's Python API has no bfloat16 array ("No corresponding Numpy type"):
    # precision-repair's ranking on the device reads every bfloat16 tensor this way
    import ml_dtypes
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
         helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("h", TensorProto.BFLOAT16, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.array([1.0, 1.00390625, -2.5], np.float32)  # the middle one rounds in bfloat16
    (run,) = list(OnnxRuntimeBackend().run_on_device(model, [{"x": x}]))
    assert set(run) == {"y", "h"} and run["h"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(run["h"].astype(np.float32), [1.0, 1.0, -2.5])
    assert [o.name for o in model.graph.output] == ["y", "h"]  # the caller's model unchanged
