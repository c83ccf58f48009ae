"""The installed CUDA execution provider: its name and the options it reports.

Apart from the backend (`routetune.plugins.onnxruntime.cuda`) so that the option
seasonings (`routetune.plugins.onnxruntime.cuda_options`) can ask which options exist
without importing the backend.
"""

from __future__ import annotations

import functools

import onnx
import onnxruntime as ort

PROVIDER = "CUDAExecutionProvider"


@functools.cache
def provider_defaults() -> dict[str, str]:
    """The installed CUDA provider's options and their defaults, by name.

    Read from a one-node session (``get_provider_options``); empty when the provider
    cannot start (no GPU, no CUDA libraries).
    """
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every supported onnxruntime reads
    if PROVIDER not in ort.get_available_providers():  # onnxruntime, not onnxruntime-gpu
        return {}
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=[PROVIDER])
        return dict(session.get_provider_options().get(PROVIDER, {}))
    except Exception:  # noqa: BLE001 - any failure means: no usable provider
        return {}
