"""Model preparation, which every route starts from: load, validate, infer shapes, sanitise.

It also holds the postcondition that every graph or precision seasoning must keep: the
model passes ``onnx.checker.check_model(full_check=True)`` and keeps its input/output
signature (names and element types, in order).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import helper

from routetune.errors import UsageError, one_line
from routetune.libraries import ORT_DOMAINS
from routetune.model import weights, weights_check

Dim = int | str
"""A dimension: a fixed size, or the name of a dynamic dimension."""


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output.

    Args:
        name: The tensor's name.
        dtype: Its numpy dtype (``float32``, ``int64`` …); None for a value that is not
            a tensor (a sequence or an optional).
        shape: Its dimensions; a str names a dynamic dimension.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...]

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name} {self.dtype}[{dims}]"


@dataclass(frozen=True)
class PreparedModel:
    """The model as prepared (loaded, checked, shapes inferred, sanitised).

    Args:
        source: Where the model was read from.
        source_sha256: sha256 of the model file's bytes, then its external data files',
            hex.
        proto: The prepared model.
        data: The prepared model, serialized (external tensors as references).
        inputs: The graph inputs (initializers excluded).
        outputs: The graph outputs.
        weights: The folder that the model's external data locations are relative to;
            None when the model holds all its data (`routetune.model.weights`).
        changes: What the preparation changed that a user should know (inlined local
            functions), one line each; the run's header and ``run.json`` show them.
    """

    source: Path
    source_sha256: str
    proto: onnx.ModelProto
    data: bytes
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weights: Path | None = None
    changes: tuple[str, ...] = ()

    @property
    def signature(self) -> tuple[tuple[str, int], ...]:
        """Input and output names with their ONNX element types, in order."""
        return signature(self.proto)


def sha256(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def load_model(path: Path, allow_outside: bool = False) -> tuple[onnx.ModelProto, str]:
    """Read and parse an ONNX file; external data stays in its files.

    Args:
        path: The ``.onnx`` file.
        allow_outside: Accept external data outside the model's folder
            (`routetune.model.weights_check.check_files`).

    Returns:
        The model (its external tensors, if any, not loaded: see `routetune.model.weights`)
        and its sha256, hex: of the file's bytes, followed by its data files'.

    Raises:
        UsageError: The file is missing, unreadable, empty, truncated or not an ONNX model, or
            one of its external data files is missing, unreadable, too short, or
            outside the model's folder.
    """
    fix = "pass the path of an .onnx model file"
    if path.exists() and not path.is_file():  # a FIFO or a device: reading it never ends
        raise UsageError(f"{path}: not a regular file; {fix}")
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise UsageError(f"{path}: no such file; {fix}") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror}); {fix}") from e
    if not data:  # protobuf reads no bytes as an empty model
        raise UsageError(f"{path}: the file is empty (0 bytes); {fix}")
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise UsageError(f"{path}: not a valid ONNX file (truncated or corrupt); {fix}") from e
    if not model.graph.node or not model.opset_import:
        raise UsageError(f"{path}: not an ONNX model (no graph nodes or no opset); {fix}")
    if not weights.has_external_data(model):
        return model, sha256(data)
    del data
    weights_check.check_files(model, path.parent, path, allow_outside)
    return model, weights.source_sha256(path, model)


def prepare(path: Path, allow_outside: bool = False,
            fed: Collection[str] = ()) -> PreparedModel:
    """Prepare an ONNX file: load, validate, infer shapes, sanitise.

    A model with external data is prepared without loading its data: shape inference
    and the checker need only the graph. Its `PreparedModel.weights` is the file's
    folder until `with_weights_in` moves the data to a run's store.

    Args:
        path: The ``.onnx`` file.
        allow_outside: Accept external data outside the model's folder.
        fed: The names the user feeds (``--inputs``): an initializer that is also a
            graph input (an overridable constant, such as a ``temperature``) named
            here becomes an input of every route (`sanitize`).

    Raises:
        UsageError: The file is not a valid ONNX model, or its external data is missing
            or outside the model's folder.
    """
    model, digest = load_model(path, allow_outside)
    changes = []
    try:
        inlined = inline_functions(model)
        if inlined:
            shown = ", ".join(inlined[:2]) + (", …" if len(inlined) > 2 else "")
            changes.append(f"inlined {len(inlined)} local function"
                           f"{'s' * (len(inlined) != 1)} ({shown})")
        overridden = [i.name for i in overridable(model) if i.name in fed]
        if overridden:
            changes.append(f"{', '.join(overridden)}: overridable initializer fed, "
                           "so an input (no default) of every route")
        model = sanitize(onnx.shape_inference.infer_shapes(model), fed=overridden)
        weights_check.check_model(model, path.parent, allow_outside)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise UsageError(f"{path}: the ONNX checker rejects the model: {one_line(e)}") from e
    except ValueError as e:  # protobuf's 2 GiB limit: the weights must be external data
        raise UsageError(f"{path}: {one_line(e)}; save models over 2 GiB with their weights "
                         "as external data (onnx.save_model(..., save_as_external_data=True))"
                         ) from e
    external = path.parent if weights.has_external_data(model) else None
    return PreparedModel(
        path, digest, model, model.SerializeToString(),
        tuple(_specs(graph_inputs(model))), tuple(_specs(model.graph.output)), external,
        tuple(changes),
    )


def inline_functions(model: onnx.ModelProto) -> list[str]:
    """Inline the model's local functions (``ModelProto.functions``) in place.

    Passes see a graph's nodes, not the bodies of the functions they call (a function
    call is one node of a custom domain to them), so a model that keeps its layers in
    local functions (as torch.onnx's dynamo exporter can write them) is inlined once,
    before any route: `onnx.inliner.inline_local_functions`, recursive. The domains
    the functions declared stay imported.

    Returns:
        The names of the functions inlined (``domain::name``); empty when there were none.

    Raises:
        onnx.checker.ValidationError: A function cannot be inlined (an undefined one).
    """
    if not model.functions:
        return []
    names = [f"{f.domain}::{f.name}" for f in model.functions]
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception as e:  # the inliner's C++ errors are plain exceptions
        raise onnx.checker.ValidationError(f"cannot inline its local functions: {e}") from e
    model.CopyFrom(inlined)
    del model.functions[:]
    return names


MODEL_FIELDS = ("doc_string", "model_version", "domain", "producer_name", "producer_version")
"""The model's scalar fields that a rewritten model keeps (`keep_model_fields`)."""


def keep_model_fields(source: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Give `model` what `source` carries besides its graph, in place.

    Its `MODEL_FIELDS`, its ``metadata_props`` (author, class names, stride, task: what
    deployment code reads) and every opset import of a domain `model` does not import
    (a pass may add domains or move the default opset, never lose one). ONNX
    GraphSurgeon exports a graph without them, so every route's model goes through
    this (`routetune.candidate.application.RouteApplier.export`).
    """
    for name in MODEL_FIELDS:
        if source.HasField(name):
            setattr(model, name, getattr(source, name))
    del model.metadata_props[:]
    model.metadata_props.extend(source.metadata_props)
    imported = {o.domain for o in model.opset_import}
    model.opset_import.extend(o for o in source.opset_import if o.domain not in imported)


def with_weights_in(model: PreparedModel, store: Path) -> PreparedModel:
    """The model with its external data copied into a run's store (`weights.adopt`).

    Args:
        model: A prepared model.
        store: The run's candidate folder, ``OUTDIR/artifacts/models``.

    Returns:
        `model` itself when it has no external data or has it in `store` already.
    """
    if model.weights is None or model.weights == store:
        return model
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    weights.adopt(proto, model.weights, store)
    return replace(model, proto=proto, data=proto.SerializeToString(), weights=store)


def overridable(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are initializers too: constants a caller may override."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name in inits]


def sanitize(model: onnx.ModelProto, fed: Collection[str] = ()) -> onnx.ModelProto:
    """Make a model safe to rewrite, without changing what it computes.

    0. Nodes are put in topological order (`toposort`): a valid graph stored out of
       order, which ONNX Runtime runs, is not refused.
    1. Every node, in subgraphs too, gets a unique, non-empty name (``<op>_<index>``
       where missing or repeated).
    2. Graph inputs that are initializers (an IR < 4 habit, or a constant a caller may
       override) are dropped from the inputs, unless `fed` names them: those lose
       their initializer and are inputs from here on.
    3. Input and output dimensions stored as ``dim_value <= 0`` or named ``?`` become
       named dynamic dimensions (``<input>_dim<i>``), so that unrelated unknown
       dimensions do not share one name.
    4. ``value_info`` entries that repeat a graph input or output, in subgraphs too, are
       dropped: the input or output declares its type, and ONNX GraphSurgeon lets a
       weaker repeat (an output's type without its shape, as ONNX Runtime's optimiser
       saves it) replace the declaration, which the ONNX checker then rejects ("Field
       'shape' of 'type' is required but missing").

    Returns:
        The same model object, changed in place.
    """
    toposort(model.graph)
    name_nodes(model)
    for graph in _all_graphs(model.graph):
        declared = {v.name for v in (*graph.input, *graph.output)}
        repeats = [v for v in graph.value_info if v.name in declared]
        for value in repeats:
            graph.value_info.remove(value)
    inputs = {i.name for i in model.graph.input}
    defaults = [t for t in model.graph.initializer if t.name in fed and t.name in inputs]
    for tensor in defaults:  # fed by the user: a plain input from here on
        model.graph.initializer.remove(tensor)
    inits = {t.name for t in model.graph.initializer}
    keep = [i for i in model.graph.input if i.name not in inits]
    if len(keep) != len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(keep)
    for value in (*model.graph.input, *model.graph.output):
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            unknown = dim.HasField("dim_value") and dim.dim_value <= 0
            if unknown or dim.dim_param == "?":
                dim.dim_param = f"{value.name}_dim{i}"
    return model


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every node, in subgraphs too, a unique, non-empty name, in place.

    A node without a name, or with a name an earlier node has, becomes
    ``<op>_<index>`` (index in depth-first order; ``_`` appended until it is neither
    another node's nor a tensor's name, which some tools confuse). For the
    preparation (`sanitize`), and for passes that bring a model back from a tool that
    leaves nodes unnamed (ONNX Runtime's quantizer).

    Returns:
        How many nodes were renamed.
    """
    nodes = list(_all_nodes(model.graph))
    seen: Counter[str] = Counter(n.name for n in nodes if n.name)
    tensors = {name for n in nodes for name in (*n.input, *n.output)}
    renamed = 0
    for i, node in enumerate(nodes):
        if not node.name or seen[node.name] > 1:
            seen[node.name] -= 1
            name = f"{node.op_type}_{i}"
            while name in seen or name in tensors:
                name += "_"
            node.name = name
            seen[name] += 1
            renamed += 1
    return renamed


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """The graph's nodes and its subgraphs', depth first."""
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for attr in node.attribute:
        if attr.HasField("g"):
            out.append(attr.g)
        out.extend(attr.graphs)
    return out


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs, and the outer names its subgraphs use."""
    names = set(node.input)
    for graph in _subgraphs(node):
        inner = ({o for n in graph.node for o in n.output} | {i.name for i in graph.input}
                 | {t.name for t in graph.initializer})
        for n in graph.node:
            names |= _reads(n) - inner
    names.discard("")
    return names


def toposort(graph: onnx.GraphProto) -> bool:
    """Put `graph`'s nodes (and its subgraphs') in topological order, in place.

    Kahn's algorithm, stable: among the nodes ready at each step the one stored first
    goes first, so a sorted graph is unchanged. A node depends on the nodes that
    produce its inputs and the outer-scope names its subgraphs read. A cycle is left as
    stored (the ONNX checker then rejects the model).

    Returns:
        Whether any node moved.
    """
    moved = False
    for node in graph.node:
        for sub in _subgraphs(node):
            moved |= toposort(sub)
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    needs = [{producer[x] for x in _reads(n) if x in producer and producer[x] != i}
             for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, deps in enumerate(needs):
        for d in deps:
            users[d].append(i)
    waiting = [len(deps) for deps in needs]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes) or order == list(range(len(nodes))):
        return moved
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies[i] for i in order)
    return True


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def signature(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    """Input and output names with their ONNX element types, inputs first."""
    return tuple(
        (v.name, v.type.tensor_type.elem_type)
        for v in (*graph_inputs(model), *model.graph.output)
    )


def with_intermediates(model: onnx.ModelProto, names: Iterable[str] | None = None
                       ) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs also list intermediate float tensors.

    Polygraphy's ``--onnx-outputs mark all``: running the copy returns every float
    tensor's value, for range analysis, layer-wise comparison and strict-FP16 checks.

    Args:
        model: The model; not changed. Top-level tensors only (subgraphs stay closed).
        names: The tensors to add; None for every float tensor whose type shape
            inference knows, graph inputs included, and every output of a custom
            operator (`routetune.libraries.ORT_DOMAINS`), whose type shape inference
            cannot know: added without a type, which ONNX Runtime fills in.

    Returns:
        The copy, with the original outputs first (less those of a type ONNX Runtime
        cannot return to Python, `NO_NUMPY`); ``value_info`` is cleared.
    """
    probe = onnx.shape_inference.infer_shapes(model)
    known = {v.name for v in probe.graph.output}
    wanted = None if names is None else set(names)
    for value in [*probe.graph.value_info, *graph_inputs(probe)]:
        if value.name in known or (wanted is not None and value.name not in wanted):
            continue
        if value.type.tensor_type.elem_type in FLOAT_TYPES:
            out = onnx.ValueInfoProto()
            out.name = value.name
            out.type.tensor_type.elem_type = value.type.tensor_type.elem_type
            probe.graph.output.append(out)
            known.add(value.name)
    if names is None:
        custom = [t for n in probe.graph.node if (n.domain or "") not in ORT_DOMAINS
                  for t in n.output if t and t not in known]
        for name in custom:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
            known.add(name)
    del probe.graph.value_info[:]
    unreadable = [o for o in probe.graph.output if o.type.tensor_type.elem_type in NO_NUMPY]
    for output in unreadable:  # ONNX Runtime cannot hand them to Python
        probe.graph.output.remove(output)
    return probe


NO_NUMPY = frozenset({
    onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.UINT4, onnx.TensorProto.INT4,
    *([onnx.TensorProto.FLOAT4E2M1] if hasattr(onnx.TensorProto, "FLOAT4E2M1") else []),
})
"""Tensor types that ONNX Runtime's Python API cannot return as NumPy arrays (1.32:
"No corresponding Numpy type for Tensor Type. Float8E5M2"; onnx node test
``test_cast_FLOAT_to_FLOAT8E5M2``); float8 e4m3fn it returns."""


def _specs(values: list[onnx.ValueInfoProto]) -> list[TensorSpec]:
    specs = []
    for v in values:
        tt = v.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
        dims: list[Dim] = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                dims.append(d.dim_param or f"{v.name}_dim{i}")
        specs.append(TensorSpec(v.name, dtype, tuple(dims)))
    return specs


def _all_graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _all_graphs(sub)


FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                         onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16})
