"""Which element types ONNX Runtime's CUDA provider runs ``com.microsoft:FusedConv`` in.

Usage, on a machine with a CUDA GPU and onnxruntime-gpu:

    python benchmarks/fused_conv_probe.py

A fused Conv + residual Add + Relu is what would close the 28% of ResNet-50's node time
that its Relu and Add nodes take on this provider (docs/benchmarks.md, "Where
ResNet-50's time goes"). For each element type, one ``FusedConv`` node (activation
Relu, with and without the residual input ``Z``) is opened on the CUDA provider with the
CPU fallback disabled (``session.disable_cpu_ep_fallback``): a type the provider has no
kernel for fails to open. Where it opens, its output is checked against a plain
Conv + Add + Relu on the CPU. Prints one line per case.
"""

from __future__ import annotations

import numpy as np


def model(dtype: int, residual: bool) -> bytes:
    """One FusedConv [1,16,32,32] → [1,16,32,32] (3×3, pad 1), in `dtype`."""
    from onnx import helper, numpy_helper

    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np_type),
                                "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np_type), "b")
    inputs = ["x", "w", "b", *(["z"] if residual else [])]
    node = helper.make_node("FusedConv", inputs, ["y"], domain="com.microsoft",
                            activation="Relu", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    shape = [1, 16, 32, 32]
    graph = helper.make_graph(
        [node], "fused", [helper.make_tensor_value_info("x", dtype, shape),
                          *([helper.make_tensor_value_info("z", dtype, shape)]
                            if residual else [])],
        [helper.make_tensor_value_info("y", dtype, shape)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9).SerializeToString()


def main() -> None:
    import onnxruntime as ort
    from onnx import TensorProto

    print(f"onnxruntime {ort.__version__}, providers {ort.get_available_providers()}")
    for name, dtype in (("float32", TensorProto.FLOAT), ("float16", TensorProto.FLOAT16)):
        for residual in (False, True):
            so = ort.SessionOptions()
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            case = f"FusedConv {name}{' + Z' if residual else ''}"
            try:
                sess = ort.InferenceSession(model(dtype, residual), so,
                                            providers=["CUDAExecutionProvider"])
            except Exception as e:  # noqa: BLE001 - the probe reports any refusal
                print(f"{case}: refused ({' '.join(str(e).split())[-240:]})")
                continue
            rng = np.random.default_rng(1)
            feeds = {"x": rng.standard_normal((1, 16, 32, 32)).astype(np.float32)}
            if residual:
                feeds["z"] = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)
            np_type = np.float16 if name == "float16" else np.float32
            y = sess.run(None, {k: v.astype(np_type) for k, v in feeds.items()})[0]
            print(f"{case}: runs on CUDA, output {y.dtype} {list(y.shape)}, "
                  f"max {float(np.abs(y).max()):.3g}")


if __name__ == "__main__":
    main()
