"""The postconditions every graph and precision seasoning must keep (`check_candidate`).

The full ONNX checker, the model's signature (names, order, element types; float32 may
become float16 or bfloat16 at the edges), unique node names, and no redundant Cast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from pathlib import Path

import onnx
from onnx import helper

from routetune.errors import PostconditionError, one_line
from routetune.model import weights_check
from routetune.model.loading import _all_graphs, _all_nodes, signature

BACKEND_DOMAIN = "routetune.backend-op"
"""The private domain a backend's own operator in an ONNX domain is checked under."""


def check_candidate(model: onnx.ModelProto, expected: tuple[tuple[str, int], ...],
                    allowed: Collection[str] = (), store: Path | None = None,
                    backend_ops: Collection[tuple[str, str]] = ()) -> frozenset[str]:
    """The postcondition of every graph and precision seasoning.

    The signature must keep its names, order and element types, except that a float32
    input or output may become float16 or bfloat16 (``fp16{keep_io_types=false}``);
    runners cast the validation inputs to the types the engine takes.

    Every node, in subgraphs too, must also keep a unique, non-empty name: the base
    pipeline gives every node one (`sanitize`), so a missing or repeated name is the
    rewrite's (ONNX Runtime's quantizer and opset conversion are known to make them).

    No Cast may be added that casts a tensor to the type it already has, or to a type
    another Cast of the same tensor already gives (`cast_faults`); the ones in `allowed`
    were in the model before the rewrite and are not its doing.

    An operator that ONNX does not define in its own domain at the model's opset but the
    target backend does (`backend_ops`: ONNX Runtime's ``SimplifiedLayerNormalization``,
    which its transformer optimizer writes in the default domain, and its
    ``LayerNormalization`` below opset 17) is the backend's to judge: the build runs it
    or fails. The ONNX checker judges everything else, on a copy where such
    nodes sit in a private domain (`BACKEND_DOMAIN`), which it does not check.

    Args:
        model: The rewritten model.
        expected: The signature it must keep (`routetune.model.loading.signature`).
        allowed: Redundant Casts that were in the model before the rewrite.
        store: The folder its external data lies in, if any.
        backend_ops: ``(domain, op_type)`` of the operators the target backend
            registers beyond ONNX's (`routetune.backend.Backend.operator_schemas`).

    Returns:
        The model's `cast_faults`, to pass as `allowed` to the next rewrite's check.

    Raises:
        PostconditionError: The full ONNX checker rejects the model, a node name is
            missing or repeated, a Cast is redundant, or the signature
            differs from `expected`.
    """
    names = Counter(n.name for n in _all_nodes(model.graph))
    if names[""]:
        raise PostconditionError(f"the rewrite left {names['']} node(s) without a name")
    repeated = sorted(name for name, k in names.items() if k > 1)
    if repeated:
        raise PostconditionError(f"the rewrite gave {len(repeated)} name(s) to several nodes: "
                                 + ", ".join(repeated[:5]))
    try:
        weights_check.check_model(_backend_ops_aside(model, backend_ops), store)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise PostconditionError(
            f"the ONNX checker rejects the rewritten model: {one_line(e)}") from e
    got = signature(model)
    if not _same_signature(got, expected):
        raise PostconditionError(
            f"the rewrite changed the model's signature from {_sig(expected)} to {_sig(got)}"
        )
    faults = cast_faults(model)
    added = sorted(faults - set(allowed))
    if added:
        more = f" (and {len(added) - 1} more)" if len(added) > 1 else ""
        raise PostconditionError(f"the rewrite left a redundant Cast: {added[0]}{more}")
    return faults


def _backend_ops_aside(model: onnx.ModelProto, backend_ops: Collection[tuple[str, str]]
                       ) -> onnx.ModelProto:
    """`model`, or a copy with its backend-only operators in `BACKEND_DOMAIN`.

    Those of ONNX's own domains that ONNX does not define at the model's opset; the
    checker skips them there.
    """
    ours = {(d or "", op) for d, op in backend_ops if d in ("", "ai.onnx")}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def aside(node: onnx.NodeProto) -> bool:
        return ((node.domain or "", node.op_type) in ours
                and not onnx.defs.has(node.op_type, opset, node.domain or ""))

    if not any(aside(n) for n in _all_nodes(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in _all_nodes(copy.graph):
        if aside(node):
            node.domain = BACKEND_DOMAIN
    copy.opset_import.append(helper.make_opsetid(BACKEND_DOMAIN, 1))
    return copy


def cast_faults(model: onnx.ModelProto) -> frozenset[str]:
    """The redundant Casts of `model`, in every graph, one line each.

    A Cast is redundant when its ``to`` is the type its input already has (ONNX shape
    inference's type where the graph declares none), or when an earlier Cast of the same
    tensor in the same graph already casts it to that type. A Cast whose input type is
    unknown is not judged.

    Returns:
        Lines such as ``Cast 'c1' casts 'x' to FLOAT16, the type it already has`` and
        ``Cast 'c2' casts 'x' to FLOAT16 again (as 'c1' does)``.
    """
    casts = [n for n in _all_nodes(model.graph) if n.op_type == "Cast" and n.input]
    if not casts:
        return frozenset()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    faults: set[str] = set()
    for graph in _all_graphs(inferred.graph):
        types = _elem_types(graph)
        seen: dict[tuple[str, int], str] = {}
        for node in graph.node:
            if node.op_type != "Cast" or not node.input:
                continue
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            src = node.input[0]
            name = onnx.TensorProto.DataType.Name(to) if to is not None else "?"
            if to is not None and types.get(src) == to:
                faults.add(f"Cast '{node.name}' casts '{src}' to {name}, the type it already has")
            elif to is not None and (src, to) in seen:
                faults.add(f"Cast '{node.name}' casts '{src}' to {name} again "
                           f"(as '{seen[src, to]}' does)")
            else:
                seen[src, to or 0] = node.name
    return frozenset(faults)


def _elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element types by tensor name, as `graph` declares them or inference found them."""
    types = {t.name: t.data_type for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types


LOW_IO = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def _same_signature(got: tuple[tuple[str, int], ...], expected: tuple[tuple[str, int], ...]
                    ) -> bool:
    if [n for n, _ in got] != [n for n, _ in expected]:
        return False
    return all(g == e or (e == onnx.TensorProto.FLOAT and g in LOW_IO)
               for (_, g), (_, e) in zip(got, expected, strict=True))


def _sig(sig: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{n}:{helper.tensor_dtype_to_np_dtype(t) if t else '?'}" for n, t in sig)
