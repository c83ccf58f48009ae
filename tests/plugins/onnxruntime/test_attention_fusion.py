"""``fuse-attention`` on real PyTorch exports (tests/data/attention, made by make_models.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from command import routetune
from graphs import conv_bn
from quick import quick_spec

from routetune.plugins.onnxruntime.attention_fusion import AttentionFusion
from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.registry import Registry
from routetune.run.tuning import tune
from routetune.seasoning import PassResult, RouteContext, RouteState
from routetune.testing import check_seasoning

DATA = Path(__file__).parents[2] / "data" / "attention"
MASKED = ("bert_eager_torchscript", "bert_sdpa_torchscript", "bert_eager_dynamo",
          "bert_sdpa_dynamo", "bert_static_torchscript", "gpt2_eager_torchscript",
          "gpt2_sdpa_torchscript", "gpt2_eager_dynamo",
          "gpt2_sdpa_dynamo")  # GPT-2's: causal and padding
TIMM = ("timm_vit_eager_torchscript", "timm_vit_eager_dynamo", "timm_vit_sdpa_torchscript",
        "timm_vit_sdpa_dynamo")  # Q, K and V packed in one projection, then unbound
UNMASKED = ("vit_torchscript", "vit_dynamo", "encoder_torchscript",  # as gpu.py exports it
            "encoder_dynamic_torchscript", *TIMM)
FOLD_FIRST = ("timm_vit_sdpa_torchscript",)
"""Exports whose attention scale is computed from a Shape: fused after fold-constants, as
the seasoning's order (``after fold-constants``) has it in a route."""
LAYERS, HEADS, HEAD_SIZE = 2, 4, 8  # every fixture: hidden 32


def feeds(model: onnx.ModelProto, batch: int = 2, seq: int = 16) -> dict[str, np.ndarray]:
    """Token ids with a padding mask whose last sequence has its second half padded, or
    (2, 3, 32, 32) float32 images."""
    rng = np.random.default_rng(7)
    names = [i.name for i in model.graph.input]
    first = model.graph.input[0].type.tensor_type.shape.dim
    if first and first[0].dim_value:  # a static batch (benchmarks/exports.py's BERT: 1)
        batch = first[0].dim_value
    if names == ["pixel_values"]:
        return {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    out = {names[0]: rng.integers(0, 100, (batch, seq)).astype(np.int64)}
    if "attention_mask" in names:
        mask = np.ones((batch, seq), np.int64)
        mask[-1, seq // 2:] = 0
        out["attention_mask"] = mask
    return out


def model_of(name: str) -> onnx.ModelProto:
    """A fixture, its constants folded first where `FOLD_FIRST` says."""
    model = onnx.load(DATA / f"{name}.onnx")
    if name not in FOLD_FIRST:
        return model
    from routetune.passes.graph.fold_constants import FoldConstants

    state = RouteState(graph=gs.import_onnx(model))
    assert FoldConstants()(state, RouteContext(backend=OnnxRuntimeBackend())).modified
    return gs.export_onnx(state.graph)


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The first output on ONNX Runtime's CPU provider, its graph optimisations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feed)[0])


def fuse(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    graph = gs.import_onnx(model)
    state = RouteState(graph=graph)
    result = AttentionFusion()(state, RouteContext(backend=OnnxRuntimeBackend()))
    assert state.graph is graph
    fused = gs.export_onnx(graph)
    onnx.checker.check_model(fused, full_check=True)
    return fused, result


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


@pytest.mark.parametrize("name", MASKED + UNMASKED)
def test_every_block_becomes_one_multi_head_attention_that_computes_the_same(name: str
                                                                             ) -> None:
    model = model_of(name)
    fused, result = fuse(model)
    ops = [n.op_type for n in fused.graph.node]
    assert result.modified
    assert dict(result.stats) == {"MultiHeadAttention": LAYERS, "blocks_seen": LAYERS,
                                  "blocks_left": 0}
    assert ops.count("MultiHeadAttention") == LAYERS and "Softmax" not in ops
    heads = [n for n in fused.graph.node if n.op_type == "Transpose"
             and len(onnx.helper.get_attribute_value(n.attribute[0])) == 4]
    assert heads == []  # the head split and merge are gone
    assert any(o.domain == "com.microsoft" for o in fused.opset_import)
    feed = feeds(model)
    want, got = run(model, feed), run(fused, feed)
    assert got.shape == want.shape
    assert rel_l2(want, got) <= 1e-4


@pytest.mark.parametrize("name", MASKED + UNMASKED)
def test_the_node_takes_the_heads_the_scale_and_the_graph_s_own_mask(name: str) -> None:
    fused, _ = fuse(model_of(name))
    for node in (n for n in fused.graph.node if n.op_type == "MultiHeadAttention"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["num_heads"] == HEADS
        assert attrs["scale"] == pytest.approx(HEAD_SIZE ** -0.5, rel=1e-6)
        # query, key, value, (no QKV bias), (no key padding mask), attention_bias; the
        # ViT dynamo export's constant zero bias is dropped
        assert list(node.input[3:5]) == (["", ""] if name in MASKED else [])
        assert len(node.input) == (6 if name in MASKED else 3)


@pytest.mark.parametrize("name", ["bert_eager_torchscript", "bert_sdpa_torchscript",
                                  "gpt2_eager_torchscript", "gpt2_sdpa_torchscript",
                                  "encoder_dynamic_torchscript"])
def test_dynamic_batch_and_sequence_stay_dynamic(name: str) -> None:
    model = onnx.load(DATA / f"{name}.onnx")
    fused, _ = fuse(model)
    for batch, seq in ((3, 10), (1, 5)):
        feed = feeds(model, batch, seq)
        want, got = run(model, feed), run(fused, feed)
        assert got.shape == want.shape == (batch, seq, 32)
        assert rel_l2(want, got) <= 1e-4


def test_the_padding_mask_is_what_the_fused_node_reads() -> None:
    model = onnx.load(DATA / "bert_sdpa_dynamo.onnx")
    fused, _ = fuse(model)
    feed = feeds(model)
    unpadded = dict(feed, attention_mask=np.ones_like(feed["attention_mask"]))
    # the padded half changes the last sequence's first half, in both models alike
    assert rel_l2(run(fused, unpadded)[-1, :8], run(fused, feed)[-1, :8]) > 1e-2
    assert rel_l2(run(model, feed), run(fused, feed)) <= 1e-4


def test_a_block_whose_probabilities_are_an_output_is_left_with_its_reason() -> None:
    model = onnx.load(DATA / "bert_eager_torchscript.onnx")
    graph = gs.import_onnx(model)
    first = next(n for n in graph.nodes if n.op == "Softmax")
    probs = first.outputs[0]
    probs.dtype, probs.shape = np.float32, ["batch", HEADS, "seq", "seq"]
    graph.outputs.append(probs)  # as output_attentions=True exports them
    fused, result = fuse(gs.export_onnx(graph))
    reason = "left: the attention probabilities are used outside the block"
    assert dict(result.stats) == {"MultiHeadAttention": 1, "blocks_seen": 2,
                                  "blocks_left": 1, reason: 1}
    assert f"{first.name}: the attention probabilities are used outside" in result.note
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("Softmax") == 1 and ops.count("MultiHeadAttention") == 1
    feed = feeds(model)
    assert rel_l2(run(model, feed), run(fused, feed)) <= 1e-4


def test_a_softmax_that_is_no_attention_is_counted_and_nothing_changes() -> None:
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        head (float[2, 32] x, float[32, 10] w) => (float[2, 10] y) {
            logits = MatMul(x, w)
            y = Softmax<axis = -1>(logits)
        }
    """
    fused, result = fuse(onnx.parser.parse_model(text))
    assert not result.modified
    assert dict(result.stats) == {
        "MultiHeadAttention": 0, "blocks_seen": 1, "blocks_left": 1,
        "left: Softmax over axis -1 of a rank-2 tensor, not the last axis of (B, N, S, T) "
        "scores": 1}
    assert [n.op_type for n in fused.graph.node] == ["MatMul", "Softmax"]


def test_a_model_without_softmax_is_not_applicable(tmp_path: Path) -> None:
    graph = gs.import_onnx(onnx.load(conv_bn(tmp_path / "cnn.onnx")))
    assert AttentionFusion().why_not(graph, OnnxRuntimeBackend()) == (
        "no Softmax in the model: no attention block")
    result = tune(quick_spec(model=tmp_path / "cnn.onnx", shapes="x:1x3x32x32",
                             output=tmp_path / "out", seasonings=("fuse-attention",
                                                               "ort-threads"), max_trials=2))
    assert result.not_applicable["fuse-attention"] == (
        "no Softmax in the model: no attention block")


def test_a_tune_on_the_cpu_records_the_fusion_and_passes_accuracy(tmp_path: Path) -> None:
    model = onnx.load(DATA / "bert_sdpa_dynamo.onnx")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    np.savez(inputs / "set0.npz", **feeds(model))
    result = tune(quick_spec(model=DATA / "bert_sdpa_dynamo.onnx", inputs=inputs,
                             output=tmp_path / "out", seasonings=("fuse-attention",),
                             search="exhaustive", accuracy="rel_l2<=1e-4"))
    fused = next(t for t in result.trials if t.route == "fuse-attention")
    assert fused.status == "ok", fused.reason
    record = fused.passes[0]
    assert record["stats"] == {"MultiHeadAttention": 2, "blocks_seen": 2, "blocks_left": 0}
    assert record["note"] == "2 of 2 attention blocks fused"


def test_it_keeps_the_seasoning_contract(registry: Registry, tmp_path: Path) -> None:
    record = check_seasoning(registry, "fuse-attention", DATA / "vit_torchscript.onnx",
                             tmp_path / "work", refused=conv_bn(tmp_path / "cnn.onnx"))
    assert record["modified"] and record["stats"]["MultiHeadAttention"] == LAYERS


def tiny_block(merged: list[int], shape: list[int] | None = None) -> onnx.ModelProto:
    """One self-attention block on x (2, 4, 8) float32, 2 heads of 4, no mask; its heads
    merged by Reshape to `merged`, giving y of `shape` (default: `merged`)."""
    rng = np.random.default_rng(3)
    w = {n: rng.standard_normal((8, 8)).astype(np.float32) for n in ("wq", "wk", "wv")}
    h = onnx.helper
    nodes = [h.make_node("MatMul", ["x", f"w{c}"], [c]) for c in "qkv"]
    for c, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [h.make_node("Reshape", [c, "split"], [f"{c}4"]),
                  h.make_node("Transpose", [f"{c}4"], [f"{c}t"], perm=perm)]
    nodes += [h.make_node("MatMul", ["qt", "kt"], ["qk"]),
              h.make_node("Div", ["qk", "two"], ["scores"]),
              h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              h.make_node("MatMul", ["probs", "vt"], ["pv"]),
              h.make_node("Transpose", ["pv"], ["pvt"], perm=[0, 2, 1, 3]),
              h.make_node("Reshape", ["pvt", "merge"], ["y"])]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in w.items()] + [
        onnx.numpy_helper.from_array(np.array([2, 4, 2, 4], np.int64), "split"),
        onnx.numpy_helper.from_array(np.array(merged, np.int64), "merge"),
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    graph = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", 1, [2, 4, 8])],
                         [h.make_tensor_value_info("y", 1, shape or merged)], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_a_hand_written_block_becomes_exactly_the_projections_and_the_node() -> None:
    model = tiny_block([2, 4, 8])
    fused, result = fuse(model)
    assert [n.op_type for n in fused.graph.node] == ["MatMul"] * 3 + ["MultiHeadAttention"]
    node = fused.graph.node[-1]
    assert list(node.input) == ["q", "k", "v"] and list(node.output) == ["y"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"num_heads": 2, "scale": pytest.approx(0.5)}
    feed = {"x": np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)}
    assert rel_l2(run(model, feed), run(fused, feed)) <= 1e-6


def test_heads_merged_into_another_layout_keep_their_reshape() -> None:
    model = tiny_block([1, 8, 8])  # (1, B·S, N·H), as GPT-2's dynamo export has (B·S, N·H)
    fused, result = fuse(model)
    assert result.stats["MultiHeadAttention"] == 1
    assert [n.op_type for n in fused.graph.node] == ["MatMul"] * 3 + [
        "MultiHeadAttention", "Reshape"]
    feed = {"x": np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)}
    want, got = run(model, feed), run(fused, feed)
    assert got.shape == want.shape == (1, 8, 8) and rel_l2(want, got) <= 1e-6


def test_a_merge_that_copies_a_head_axis_is_left_with_the_reason() -> None:
    # its third 0 copies N from (B, S, N, Hv); from (B, S, N·Hv) it would copy N·Hv
    fused, result = fuse(tiny_block([0, 0, 0, 2, 2], [2, 4, 2, 2, 2]))
    assert not result.modified
    assert result.stats["left: the head-merging Reshape's target may copy (0) an axis after "
                        "the sequence axis"] == 1
    assert "Softmax" in [n.op_type for n in fused.graph.node]


def test_a_classifiers_softmax_over_weights_is_no_attention_block() -> None:
    # a classifier's last Softmax reads a MatMul with a weight, not Q·Kᵀ: the route would
    # change nothing, so no trial is spent on it (the ppocr-cls example has one such)
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["p"], axis=-1)], "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4])], [weight])
    why = AttentionFusion().applicable(gs.import_onnx(helper.make_model(graph)),
                                       OnnxRuntimeBackend())
    assert why is not None and why.startswith("no Softmax reads a MatMul of two activations")
    for name in (*MASKED, *UNMASKED):  # every real export has attention blocks
        model = gs.import_onnx(onnx.load(DATA / f"{name}.onnx"))
        assert AttentionFusion().applicable(model, OnnxRuntimeBackend()) is None, name


def test_building_a_route_whose_fusion_fused_nothing_says_so(tmp_path: Path) -> None:
    onnx.save(tiny_block([0, 0, 0, 2, 2], [2, 4, 2, 2, 2]), tmp_path / "m.onnx")
    done = routetune("build", str(tmp_path / "m.onnx"), "--route", "fuse-attention",
                     "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert ("'fuse-attention' changed nothing on this model: " in text
            and "the head-merging Reshape's target may copy (0) an axis" in text), text
    assert "no step changed the model or the settings: this engine is the base route's" in text


def packed_block(unbind: str, rotary: bool = False, head: int = 4) -> onnx.ModelProto:
    """timm's ``Attention`` on x (2, 4, 8) float32, 2 heads of 4: one qkv projection
    (8 → 24), Reshape (B, S, 3, N, H), Transpose (2, 0, 3, 1, 4), unbound by ``Gather``
    (``unbind="gather"``) or ``Split`` and ``Squeeze`` (``"split"``); q scaled, k
    transposed (-2, -1). With `rotary`, Q and K get x·cos + rotate_half(x)·sin first;
    `head` -1 writes the head size as timm's Swin does."""
    rng = np.random.default_rng(5)
    h, nh = onnx.helper, onnx.numpy_helper
    inits = [nh.from_array(rng.standard_normal((8, 24)).astype(np.float32), "wqkv"),
             nh.from_array(np.array([2, 4, 3, 2, head], np.int64), "packed"),
             nh.from_array(np.array([2, 4, 8], np.int64), "merge"),
             nh.from_array(np.array(0.5, np.float32), "scale")]
    nodes = [h.make_node("MatMul", ["x", "wqkv"], ["qkv"]),
             h.make_node("Reshape", ["qkv", "packed"], ["qkv5"]),
             h.make_node("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4])]
    if unbind == "gather":
        for i, c in enumerate("qkv"):
            inits.append(nh.from_array(np.array(i, np.int64), f"i{c}"))
            nodes.append(h.make_node("Gather", ["qkvt", f"i{c}"], [c], axis=0))
    else:
        inits.append(nh.from_array(np.array([0], np.int64), "axis0"))
        nodes.append(h.make_node("Split", ["qkvt"], ["q1", "k1", "v1"], axis=0,
                                 num_outputs=3))
        nodes += [h.make_node("Squeeze", [f"{c}1", "axis0"], [c]) for c in "qkv"]
    q, k = "q", "k"
    if rotary:
        inits += [nh.from_array(rng.standard_normal((4, 4)).astype(np.float32), n)
                  for n in ("cos", "sin")]
        for c in "qk":
            nodes += [h.make_node("Mul", [c, "cos"], [f"{c}c"]),
                      h.make_node("Neg", [c], [f"{c}n"]),  # rotate_half, shortened
                      h.make_node("Mul", [f"{c}n", "sin"], [f"{c}sin"]),
                      h.make_node("Add", [f"{c}c", f"{c}sin"], [f"{c}r"])]
        q, k = "qr", "kr"
    nodes += [h.make_node("Mul", [q, "scale"], ["qs"]),
              h.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
              h.make_node("MatMul", ["qs", "kt"], ["scores"]),
              h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              h.make_node("MatMul", ["probs", "v"], ["pv"]),
              h.make_node("Transpose", ["pv"], ["pvt"], perm=[0, 2, 1, 3]),
              h.make_node("Reshape", ["pvt", "merge"], ["y"])]
    graph = h.make_graph(nodes, "timm_block", [h.make_tensor_value_info("x", 1, [2, 4, 8])],
                         [h.make_tensor_value_info("y", 1, [2, 4, 8])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize(("unbind", "head"), [("gather", 4), ("split", 4), ("split", -1)])
def test_a_packed_qkv_unbound_in_three_becomes_one_split_and_the_node(unbind: str,
                                                                      head: int) -> None:
    """timm's ViT and Swin write Q, K and V as one projection unbound in three: 0 of 9
    blocks fused ("Q comes from Squeeze"); now one Split feeds the fused node (issue 39,
    kind 2)."""
    model = packed_block(unbind, head=head)
    fused, result = fuse(model)
    assert result.stats["MultiHeadAttention"] == 1, result.note
    assert [n.op_type for n in fused.graph.node] == ["MatMul", "Split", "MultiHeadAttention"]
    node = fused.graph.node[-1]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"num_heads": 2, "scale": pytest.approx(0.5)}
    assert list(node.input) == list(fused.graph.node[1].output) and node.output[0] == "y"
    feed = {"x": np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)}
    assert rel_l2(run(model, feed), run(fused, feed)) <= 1e-6


def test_a_rotary_embedding_is_named_as_the_reason() -> None:
    fused, result = fuse(packed_block("split", rotary=True))
    assert not result.modified
    assert ("Q has a rotary position embedding (x·cos + rotate_half(x)·sin) between its "
            "projection and Q·Kᵀ, which MultiHeadAttention does not compute") in result.note


def decoder_feeds(batch: int, new: int, past: int, padded: int = 0, heads: int = HEADS,
                  head_dim: int = HEAD_SIZE, layers: int = LAYERS, vocab: int = 256,
                  ) -> dict[str, np.ndarray]:
    """One call of a KV-cache decoder: `new` token ids after a cache of `past` (random
    keys and values), the last sequence's first `padded` positions masked out."""
    rng = np.random.default_rng(11)
    mask = np.ones((batch, past + new), np.int64)
    mask[-1, :padded] = 0
    feed = {"input_ids": rng.integers(0, vocab, (batch, new)).astype(np.int64),
            "attention_mask": mask}
    for i in range(layers):
        for kv in ("key", "value"):
            feed[f"past_key_values.{i}.{kv}"] = rng.standard_normal(
                (batch, heads, past, head_dim)).astype(np.float32)
    return feed


def run_all(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output by name, on ONNX Runtime's CPU provider, its optimisations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed), strict=True))


@pytest.mark.parametrize(("new", "past", "padded"), [(1, 12, 0), (5, 0, 2), (3, 7, 4)],
                         ids=["decode", "prefill-padded", "chunk-padded"])
def test_a_decoder_with_rotary_and_a_kv_cache_fuses_and_computes_the_same(
        new: int, past: int, padded: int) -> None:
    model = onnx.load(DATA / "decoder_torchscript.onnx")
    fused, result = fuse(model)
    assert result.stats == {"MultiHeadAttention": LAYERS, "blocks_seen": LAYERS,
                            "blocks_left": 0}
    ops = [n.op_type for n in fused.graph.node]
    assert "Softmax" not in ops and ops.count("MultiHeadAttention") == LAYERS
    for node in (n for n in fused.graph.node if n.op_type == "MultiHeadAttention"):
        # query, key, value, -, -, the graph's causal and padding mask, past key, past value
        i = int(node.output[1].split(".")[1])
        assert list(node.input[3:5]) == ["", ""] and node.input[5]
        assert list(node.input[6:]) == [f"past_key_values.{i}.key",
                                        f"past_key_values.{i}.value"]
        assert list(node.output[1:]) == [f"present.{i}.key", f"present.{i}.value"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {"num_heads": HEADS, "scale": pytest.approx(HEAD_SIZE ** -0.5)}
    feed = decoder_feeds(2, new, past, padded)
    want, got = run_all(model, feed), run_all(fused, feed)
    assert list(got) == list(want)  # logits, then every present, in the export's order
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert rel_l2(value, got[name]) <= 1e-5, name


def test_a_hand_written_kv_cache_without_a_mask_fuses_with_no_attention_bias(
        tmp_path: Path) -> None:
    from graphs import kv_decoder

    model = onnx.load(kv_decoder(tmp_path / "kv.onnx", layers=2, heads=2, head_dim=8))
    fused, result = fuse(model)
    assert result.stats["MultiHeadAttention"] == 2, result.note
    node = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    assert list(node.input[3:6]) == ["", "", ""]  # its scores have no mask
    feed = decoder_feeds(1, 1, 9, heads=2, head_dim=8, layers=2, vocab=48)
    want, got = run_all(model, feed), run_all(fused, feed)
    for name, value in want.items():
        assert rel_l2(value, got[name]) <= 1e-5, name

