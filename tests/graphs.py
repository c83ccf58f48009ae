"""Small generated ONNX models for the tests, every node named."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def conv_bn(path: Path, batch: int | str = "N") -> Path:
    """x f32[N,3,32,32] -> Conv(16) -> BatchNormalization -> Relu -> Identity -> y."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array((rng.random(16) + 0.5).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "mean"),
        numpy_helper.from_array((rng.random(16) + 0.5).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"],
                         name="bn"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Identity", ["r"], ["y"], name="identity"),
    ]
    graph = helper.make_graph(
        nodes, "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16, 32, 32])], inits,
    )
    return _save(graph, path)


def matmul_chain(path: Path, depth: int = 8, width: int = 256, batch: int = 64) -> Path:
    """x f32[batch,width] -> ``depth`` MatMul+Tanh layers -> y f32[batch,width].

    Heavy enough that removing layers is measurably faster.
    """
    rng = np.random.default_rng(1)
    inits, nodes, prev = [], [], "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == depth - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out], name=f"tanh{i}"))
        prev = out
    graph = helper.make_graph(
        nodes, "matmul_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits,
    )
    return _save(graph, path)


def wasteful(path: Path, width: int = 256, depth: int = 6) -> Path:
    """y = Relu(x) + 0 * tanh-MatMul-chain(x): a heavy branch that changes nothing.

    x f32[64,width] -> y f32[64,width]. Removing the branch is exact and much faster.
    """
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(np.zeros(1, np.float32), "zero")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    prev = "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Mul", [prev, "zero"], ["waste"], name="times_zero"))
    nodes.append(helper.make_node("Add", ["r", "waste"], ["y"], name="add"))
    graph = helper.make_graph(
        nodes, "wasteful",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, width])], inits,
    )
    return _save(graph, path)


def layernorm(path: Path, rows: int = 4, width: int = 64, opset: int = 13) -> Path:
    """A written-out LayerNorm on x f32[rows,width] -> y, over the last axis.

    ReduceMean(mean) -> Sub(sub) -> Pow(pow, 2) -> ReduceMean(var) -> Add(add_eps, 1e-5)
    -> Sqrt(sqrt) -> Div(div).
    """
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["centered"], name="sub"),
        helper.make_node("Pow", ["centered", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="sqrt"),
        helper.make_node("Div", ["centered", "std"], ["y"], name="div"),
    ]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    graph = helper.make_graph(
        nodes, "layernorm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])], inits)
    return _save(graph, path, opset)


def cancellation(path: Path, width: int = 64) -> Path:
    """x f32[1,width] -> Mul(scale, 2) -> Add(shift, 300) -> Sub(unshift, 300) -> Relu(relu) -> y.

    For small x the shift and unshift cancel: exact in FP32, while FP16 rounds 300 + 2x to
    a multiple of 0.25 and the output loses everything. Both ``shift`` and ``unshift``
    must stay FP32 to fix it; ``scale`` and ``relu`` are exact in FP16 for inputs that
    FP16 represents exactly.
    """
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(300.0, np.float32), "offset")]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["s"], name="scale"),
        helper.make_node("Add", ["s", "offset"], ["a"], name="shift"),
        helper.make_node("Sub", ["a", "offset"], ["d"], name="unshift"),
        helper.make_node("Relu", ["d"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "cancellation", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    return _save(graph, path)


def folded_mul_one(path: Path, producer: str = "Cast") -> Path:
    """x f32[2,64] -> Cast(to FLOAT) or Identity -> mid; mid * (1/1) + 0 -> y.

    Valid, and runs in ONNX Runtime with graph optimisations off; from the basic level on,
    ONNX Runtime 1.30–1.32 refuses it ("Node input 'mid' is not a graph input …"):
    onnxruntime#32416 (the same-type Cast) and #32413 (the Identity).
    """
    first = (helper.make_node("Cast", ["x"], ["mid"], to=TensorProto.FLOAT, name="same_cast")
             if producer == "Cast" else helper.make_node("Identity", ["x"], ["mid"], name="ident"))
    nodes = [
        first,
        helper.make_node("Div", ["one_a", "one_b"], ["folded_one"], name="div"),
        helper.make_node("Mul", ["mid", "folded_one"], ["wrapped"], name="mul"),
        helper.make_node("Add", ["wrapped", "zero"], ["y"], name="add"),
    ]
    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("one_a", 1.0), ("one_b", 1.0), ("zero", 0.0))]
    graph = helper.make_graph(nodes, "folded_mul_one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              inits)
    return _save(graph, path)


def scaled(path: Path) -> Path:
    """x f32[N,16] -> MatMul(W) * t -> y, with t f32[] a rank-0 input (a temperature)."""
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((16, 16))
                                .astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "t"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "scaled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
                               helper.make_tensor_value_info("t", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
                              [w])
    return _save(graph, path)


def uint8_mask(path: Path) -> Path:
    """x f32[1,8] * float(uint8(mask)) -> y, the mask a constant subgraph (DeBERTa-style).

    TensorRT's ONNX parser refuses the ``Cast(to=UINT8)`` (TensorRT#3124); after
    constant folding the mask is one float initializer and the model builds.
    """
    mask = helper.make_tensor("mask_value", TensorProto.INT64, [1, 8], [1, 1, 1, 0, 1, 0, 1, 1])
    nodes = [
        helper.make_node("Constant", [], ["mask"], value=mask, name="mask_const"),
        helper.make_node("Cast", ["mask"], ["mask_u8"], to=TensorProto.UINT8, name="to_uint8"),
        helper.make_node("Cast", ["mask_u8"], ["mask_f"], to=TensorProto.FLOAT, name="to_float"),
        helper.make_node("Mul", ["x", "mask_f"], ["y"], name="apply_mask"),
    ]
    graph = helper.make_graph(nodes, "uint8_mask",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    return _save(graph, path)


def constant_unique(path: Path) -> Path:
    """x f32[1,8] * Unique([2, 2, 2]) -> y: an operator TensorRT's parser cannot take,
    on constants only, so constant folding removes it."""
    values = helper.make_tensor("values", TensorProto.FLOAT, [3], [2.0, 2.0, 2.0])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=values, name="const"),
        helper.make_node("Unique", ["c"], ["u"], sorted=1, name="unique"),
        helper.make_node("Mul", ["x", "u"], ["y"], name="scale"),
    ]
    graph = helper.make_graph(nodes, "constant_unique",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    return _save(graph, path)


def transformer_mlp(path: Path, batch: int = 2, seq: int = 8, width: int = 16) -> Path:
    """A transformer block's MLP as exporters write it, every operator decomposed.

    x f32[batch,seq,width] -> MatMul+bias -> GELU (x * 0.5 * (1 + erf(x / sqrt 2))) ->
    MatMul+bias -> + x (the residual) -> LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add
    eps, Sqrt, Div, Mul gamma, Add beta) -> y f32[batch,seq,width]. ONNX Runtime's
    transformer optimizer fuses it into BiasGelu/Gelu and SkipLayerNormalization.
    """
    rng = np.random.default_rng(5)

    def const(name: str, value: np.ndarray | float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    hidden = 2 * width
    inits = [const("w1", rng.standard_normal((width, hidden)) / np.sqrt(width)),
             const("b1", rng.standard_normal(hidden) * 0.1),
             const("w2", rng.standard_normal((hidden, width)) / np.sqrt(hidden)),
             const("b2", rng.standard_normal(width) * 0.1),
             const("sqrt2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5),
             const("two", 2.0), const("eps", 1e-5),
             const("gamma", 1 + rng.standard_normal(width) * 0.1),
             const("beta", rng.standard_normal(width) * 0.1)]
    steps = [  # (op, inputs, output, name)
        ("MatMul", ["x", "w1"], "h0", "fc1"), ("Add", ["h0", "b1"], "h", "fc1_bias"),
        ("Div", ["h", "sqrt2"], "g0", "gelu_div"), ("Erf", ["g0"], "g1", "gelu_erf"),
        ("Add", ["g1", "one"], "g2", "gelu_add"), ("Mul", ["h", "g2"], "g3", "gelu_mul"),
        ("Mul", ["g3", "half"], "g", "gelu_half"),
        ("MatMul", ["g", "w2"], "o0", "fc2"), ("Add", ["o0", "b2"], "o", "fc2_bias"),
        ("Add", ["o", "x"], "r", "residual"), ("ReduceMean", ["r"], "mu", "ln_mean"),
        ("Sub", ["r", "mu"], "d", "ln_sub"), ("Pow", ["d", "two"], "d2", "ln_pow"),
        ("ReduceMean", ["d2"], "var", "ln_var"), ("Add", ["var", "eps"], "ve", "ln_eps"),
        ("Sqrt", ["ve"], "sd", "ln_sqrt"), ("Div", ["d", "sd"], "nrm", "ln_div"),
        ("Mul", ["nrm", "gamma"], "sc", "ln_scale"), ("Add", ["sc", "beta"], "y", "ln_shift"),
    ]
    nodes = [helper.make_node(op, ins, [out], name=name,
                              **({"axes": [-1]} if op == "ReduceMean" else {}))
             for op, ins, out, name in steps]
    graph = helper.make_graph(
        nodes, "transformer_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, width])], inits)
    return _save(graph, path)


def product(path: Path, width: int = 8) -> Path:
    """a f32[1,width], b f32[1,width] -> Mul -> y: zero for denormal inputs under FTZ/DAZ."""
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, width]) for n in "ab"]
    graph = helper.make_graph([helper.make_node("Mul", ["a", "b"], ["y"], name="mul")],
                              "product", spec,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])])
    return _save(graph, path)


def shared_dim(path: Path) -> Path:
    """``y = a + b``: float32 ``a`` and ``b``, both ``[N, 4]``, sharing the named dim ``N``."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    return _save(helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "shared",
                                   [a, b], [y]), path)


def square(path: Path) -> Path:
    """``y = x @ x``: float32 ``x`` is ``[N, N]``, one named dim twice (a square matrix)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "N"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "N"])
    return _save(helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "square",
                                   [x], [y]), path)


def external_model(path: Path, seed: int = 0) -> Path:
    """x [2, 64] float32 -> MatMul(W1) -> Add(b) -> Relu -> MatMul(Transpose(W2)) -> y [2, 64].

    W1 [64, 128] and W2 [64, 128] (32 KiB each) live in ``<name>.data`` beside the
    model; ``Transpose(W2)`` is a constant subgraph that fold-constants folds.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    b = np.linspace(-0.1, 0.1, 128, dtype=np.float32)  # 512 bytes: kept inside the model
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Transpose", ["W2"], ["W2t"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["r", "W2t"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
         numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime here reads (a newer onnx writes more)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path


def run_path(path: Path, x: np.ndarray) -> np.ndarray:
    """`path`'s output for input ``x``, from an ONNX Runtime CPU session."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def rmsnorm(path: Path, width: int = 16, layers: int = 2) -> Path:
    """x f32[2,8,width] -> layers × (RMSNorm written out: Pow, ReduceMean, Add eps, Sqrt,
    Div, Mul weight; then MatMul) -> y: the norm of Llama and T5, as exporters write it."""
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        rng = np.random.default_rng(i)
        inits += [numpy_helper.from_array(np.array(2.0, np.float32), p + "two"),
                  numpy_helper.from_array(np.array(1e-6, np.float32), p + "eps"),
                  numpy_helper.from_array(rng.random(width).astype(np.float32) + 0.5, p + "w"),
                  numpy_helper.from_array(
                      rng.standard_normal((width, width)).astype(np.float32) * 0.3, p + "m")]
        nodes += [helper.make_node("Pow", [x, p + "two"], [p + "sq"], name=p + "pow"),
                  helper.make_node("ReduceMean", [p + "sq"], [p + "mean"], name=p + "mean",
                                   axes=[-1], keepdims=1),
                  helper.make_node("Add", [p + "mean", p + "eps"], [p + "var"], name=p + "add"),
                  helper.make_node("Sqrt", [p + "var"], [p + "std"], name=p + "sqrt"),
                  helper.make_node("Div", [x, p + "std"], [p + "n"], name=p + "div"),
                  helper.make_node("Mul", [p + "w", p + "n"], [p + "y"], name=p + "mul"),
                  helper.make_node("MatMul", [p + "y", p + "m"], [p + "out"], name=p + "mm")]
        x = p + "out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "rmsnorm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, width])], inits)
    return _save(graph, path)


def contrib_inverse(path: Path, width: int = 16) -> Path:
    """x f32[W,W] -> MatMul -> Add(4I) -> ai.onnx.contrib::Inverse -> MatMul -> Relu -> y.

    `Inverse` is onnxruntime-extensions' (its library registered with the session); the
    added 4I keeps the matrix well away from singular on normal inputs.
    """
    from routetune.libraries import CONTRIB

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32),
                                "W1"),
        numpy_helper.from_array((np.eye(width) * 4).astype(np.float32), "I4"),
        numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32),
                                "W2"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"),
             helper.make_node("Add", ["a", "I4"], ["b"], name="shift"),
             helper.make_node("Inverse", ["b"], ["c"], name="inverse", domain=CONTRIB),
             helper.make_node("MatMul", ["c", "W2"], ["d"], name="mm2"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "contrib_inverse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [width, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(CONTRIB, 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)  # no full check: the checker knows no contrib schema
    onnx.save(model, path)
    return path


def kv_decoder(path: Path, layers: int = 2, heads: int | Sequence[int] = 2, head_dim: int = 8,
               vocab: int = 48, drop: Sequence[str] = (), extra: str = "",
               seed: int = 6) -> Path:
    """A decoder with a KV cache, in the signature torch.onnx and Optimum write.

    input_ids int64[batch,seq], attention_mask int64[batch,total] and per layer
    past_key_values.{i}.key/.value f32[batch,heads,past,head_dim] -> logits
    f32[batch,seq,vocab] and present.{i}.key/.value f32[batch,heads,past+seq,head_dim].
    Each layer: the keys and values of its input appended to the cache (Concat on axis
    2), softmax attention over the whole cache (no causal mask: the sets' mechanics, not
    a language model), a residual; then a projection to the vocabulary. The mask is
    used only to scale the logits by 1 (its mean), as a real mask leaves them for ones.
    `heads` per layer (an int: the same for all) makes mismatched head counts; `drop`
    leaves those outputs out, and those cache inputs (an empty constant cache instead).
    `extra` adds an int64 ``[seq]`` input of that name (``cache_position``), which must be
    the positions ``past .. past + seq - 1``: the logits are NaN otherwise.
    """
    rng = np.random.default_rng(seed)
    per_layer = [heads] * layers if isinstance(heads, int) else list(heads)
    width = per_layer[0] * head_dim

    def const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    inits = [const("embed", rng.standard_normal((vocab, width))),
             const("unembed", rng.standard_normal((width, vocab)) / np.sqrt(width)),
             numpy_helper.from_array(np.array([0, 0, -1, head_dim], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "merge_shape"),
             const("scale", np.float32(1 / np.sqrt(head_dim)))]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"], name="embed"),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], name="mask_cast",
                              to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["maskf"], ["mask_mean"], name="mask_mean",
                              keepdims=0)]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch", "total"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch", "seq", vocab])]
    for i, h in enumerate(per_layer):
        x = f"h{i}"
        for kv in ("q", "key", "value"):
            inits.append(const(f"w{kv}{i}", rng.standard_normal((width, h * head_dim))
                               / np.sqrt(width)))
            nodes += [helper.make_node("MatMul", [x, f"w{kv}{i}"], [f"{kv}{i}_flat"],
                                       name=f"l{i}_{kv}"),
                      helper.make_node("Reshape", [f"{kv}{i}_flat", "split_shape"],
                                       [f"{kv}{i}_bshd"], name=f"l{i}_{kv}_split"),
                      helper.make_node("Transpose", [f"{kv}{i}_bshd"], [f"{kv}{i}_new"],
                                       name=f"l{i}_{kv}_heads", perm=[0, 2, 1, 3])]
        for kv in ("key", "value"):
            nodes.append(helper.make_node(
                "Concat", [f"past_key_values.{i}.{kv}", f"{kv}{i}_new"], [f"present.{i}.{kv}"],
                name=f"l{i}_{kv}_cache", axis=2))
            shape = ["batch", h, "past", head_dim]
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}",
                                                        TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", TensorProto.FLOAT, ["batch", h, "total", head_dim]))
        inits.append(const(f"wo{i}", rng.standard_normal((h * head_dim, width))
                           / np.sqrt(h * head_dim)))
        nodes += [
            helper.make_node("Transpose", [f"present.{i}.key"], [f"kt{i}"], name=f"l{i}_kt",
                             perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [f"q{i}_new", f"kt{i}"], [f"s{i}"], name=f"l{i}_qk"),
            helper.make_node("Mul", [f"s{i}", "scale"], [f"ss{i}"], name=f"l{i}_scale"),
            helper.make_node("Softmax", [f"ss{i}"], [f"p{i}"], name=f"l{i}_softmax", axis=-1),
            helper.make_node("MatMul", [f"p{i}", f"present.{i}.value"], [f"a{i}"],
                             name=f"l{i}_pv"),
            helper.make_node("Transpose", [f"a{i}"], [f"a{i}_bshd"], name=f"l{i}_merge_t",
                             perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"a{i}_bshd", "merge_shape"], [f"a{i}_flat"],
                             name=f"l{i}_merge"),
            helper.make_node("MatMul", [f"a{i}_flat", f"wo{i}"], [f"o{i}"], name=f"l{i}_out"),
            helper.make_node("Add", [x, f"o{i}"], [f"h{i + 1}"], name=f"l{i}_residual")]
    nodes += [helper.make_node("MatMul", [f"h{layers}", "unembed"], ["raw_logits"],
                               name="unembed"),
              helper.make_node("Mul", ["raw_logits", "mask_mean"], ["logits"], name="masked")]
    if extra:  # checked: positions past .. past+seq-1, else NaN logits
        inputs.append(helper.make_tensor_value_info(extra, TensorProto.INT64, ["seq"]))
        nodes[-1:] = [
            helper.make_node("Shape", ["past_key_values.0.key"], ["past_len"], name="past_len",
                             start=2, end=3),
            helper.make_node("Sub", [extra, "past_len"], ["offsets"], name="offsets"),
            helper.make_node("Shape", [extra], ["seq_len"], name="seq_len"),
            helper.make_node("Squeeze", ["seq_len"], ["seq_scalar"], name="seq_scalar"),
            helper.make_node("Range", ["zero_i", "seq_scalar", "one_i"], ["expected"],
                             name="expected"),
            helper.make_node("Equal", ["offsets", "expected"], ["same"], name="same"),
            helper.make_node("Cast", ["same"], ["samef"], name="same_f", to=TensorProto.FLOAT),
            helper.make_node("ReduceMin", ["samef"], ["all_same"], name="all_same", keepdims=0),
            helper.make_node("Log", ["all_same"], ["log_same"], name="log_same"),  # 0 or -inf
            helper.make_node("Mul", ["raw_logits", "mask_mean"], ["masked_logits"],
                             name="masked"),
            helper.make_node("Sub", ["log_same", "log_same"], ["nan_or_zero"], name="nan"),
            helper.make_node("Add", ["masked_logits", "nan_or_zero"], ["logits"],
                             name="checked")]
        inits += [numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
                  numpy_helper.from_array(np.array(1, np.int64), "one_i")]
    for name in drop:  # a cache input left out: an empty constant, as a frozen export's
        if name.startswith("past_key_values."):
            h = per_layer[int(name.split(".")[1])]
            inits.append(const(name, np.zeros((1, h, 0, head_dim))))
    graph = helper.make_graph(
        nodes, "kv_decoder", [i for i in inputs if i.name not in drop],
        [o for o in outputs if o.name not in drop], inits)
    return _save(graph, path)
