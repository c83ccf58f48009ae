"""``ort-transformer-fusion``: ONNX Runtime's transformer optimizer in a real search."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from graphs import conv_bn, rmsnorm, transformer_mlp
from quick import quick_spec

from routetune.plugins.onnxruntime.transformer_fusion import detect_model_type
from routetune.run.tuning import tune


def test_it_fuses_gelu_and_the_layer_norm_and_stays_accurate(tmp_path: Path) -> None:
    result = tune(quick_spec(model=transformer_mlp(tmp_path / "m.onnx"), output=tmp_path / "out",
                             seasonings=("ort-transformer-fusion",), search="exhaustive"))
    fused = next(t for t in result.trials if t.route == "ort-transformer-fusion")
    assert fused.status == "ok", fused.reason  # the default accuracy bound, against FP32
    record = fused.passes[0]
    assert record["stats"] == {"BiasGelu": 1, "SkipLayerNormalization": 1}
    assert "model type bert" in record["note"]


def test_a_model_without_a_transformer_block_is_not_offered_it(tmp_path: Path) -> None:
    result = tune(quick_spec(model=conv_bn(tmp_path / "m.onnx"), shapes="x:1x3x32x32",
                             output=tmp_path / "out", seasonings=("ort-transformer-fusion",
                                                               "ort-threads"), max_trials=2))
    assert result.not_applicable["ort-transformer-fusion"] == (
        "no Erf, LayerNormalization, ReduceMean, Softmax in the model: no transformer block")


def test_the_model_type_is_vit_for_an_image_model_with_a_conv(tmp_path: Path) -> None:
    image = gs.import_onnx(onnx.load(conv_bn(tmp_path / "c.onnx")))
    text = gs.import_onnx(onnx.load(transformer_mlp(tmp_path / "t.onnx")))
    assert detect_model_type(image) == "vit" and detect_model_type(text) == "bert"


def test_an_rmsnorm_fused_into_onnx_runtimes_own_operator_is_judged_by_onnx_runtime(
        tmp_path: Path) -> None:
    """ONNX Runtime writes SimplifiedLayerNormalization in the default domain; the ONNX
    checker does not know it ("No Op registered"), ONNX Runtime registers and runs it."""
    result = tune(quick_spec(model=rmsnorm(tmp_path / "m.onnx"), output=tmp_path / "out",
                             seasonings=("ort-transformer-fusion",), search="exhaustive",
                             space={"ort-transformer-fusion": {"model_type": ("t5",)}}))
    fused = next(t for t in result.trials if t.route.startswith("ort-transformer-fusion"))
    assert fused.status == "ok", fused.reason
    assert fused.passes[0]["stats"] == {"SimplifiedLayerNormalization": 2}


def test_operators_the_export_already_had_are_not_counted_as_fused() -> None:
    """An opset-20 export writes LayerNormalization and Gelu itself: the optimizer's
    statistics count them, but nothing was fused (issue 39, kind 8)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
    from routetune.plugins.onnxruntime.transformer_fusion import TransformerFusion
    from routetune.seasoning import RouteContext, RouteState

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("gamma", (16,)), ("beta", (16,)), ("w", (16, 16)))]
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1),
         helper.make_node("MatMul", ["n", "w"], ["m"]),
         helper.make_node("Gelu", ["m"], ["y"])], "native",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    result = TransformerFusion()(RouteState(gs.import_onnx(model)),
                                 RouteContext(OnnxRuntimeBackend()))
    assert not result.modified and result.stats == {}
    assert result.note == ("nothing fused (model type bert); the export has Gelu 1, "
                           "LayerNormalization 1 already")
