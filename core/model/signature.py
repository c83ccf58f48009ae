"""A model's signature: what a later run compares to judge whether two models are alike.

The route memory (`routetune.records.memory`) keys what it learned by it. It holds no
weights and no names: the operator histogram (how many nodes of each type, subgraphs
included), the parameter count, and the inputs' dtypes and shapes as the run feeds them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx


@dataclass(frozen=True)
class ModelSignature:
    """What makes two models alike, for the route memory.

    Args:
        ops: Nodes per operator, ``OpType`` (default domain) or ``domain::OpType``,
            subgraphs included.
        parameters: Elements in the initializers and ``Constant`` nodes (a count, not
            bytes).
        inputs: Per graph input, in order: its numpy dtype name and the shape it is
            fed at (``("float32", (1, 3, 320, 320))``).
    """

    ops: Mapping[str, int] = field(default_factory=dict)
    parameters: int = 0
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> ModelSignature:
        """The signature of `model` fed `feeds` (one input set: name to array).

        Large tensors are counted from their dims; no external data is read.
        """
        ops: Counter[str] = Counter()
        parameters = 0
        for graph in _graphs(model.graph):
            for node in graph.node:
                ops[node.op_type if node.domain in ("", "ai.onnx")
                    else f"{node.domain}::{node.op_type}"] += 1
                if node.op_type == "Constant":
                    for attr in node.attribute:
                        if attr.type == onnx.AttributeProto.TENSOR:
                            parameters += math.prod(attr.t.dims)
            parameters += sum(math.prod(t.dims) for t in graph.initializer)
        inputs = tuple((str(np.asarray(a).dtype), tuple(int(d) for d in np.shape(a)))
                       for a in feeds.values())
        return cls(dict(sorted(ops.items())), int(parameters), inputs)

    def to_json(self) -> dict[str, object]:
        """As JSON: ``{"ops": {...}, "parameters": N, "inputs": [[dtype, [dims]], ...]}``."""
        return {"ops": dict(self.ops), "parameters": self.parameters,
                "inputs": [[d, list(s)] for d, s in self.inputs]}

    @classmethod
    def from_json(cls, data: object) -> ModelSignature:
        """The signature `to_json` wrote.

        Raises:
            ValueError: Not such an object (a memory file is untrusted input).
        """
        if not isinstance(data, dict):
            raise ValueError("a signature is a JSON object")
        ops, parameters, inputs = data.get("ops"), data.get("parameters"), data.get("inputs")
        if (not isinstance(ops, dict) or len(ops) > 2000
                or not all(isinstance(k, str) and len(k) <= 200 and type(v) is int and v >= 0
                           for k, v in ops.items())):
            raise ValueError("its ops are not a histogram of operator names to counts")
        if type(parameters) is not int or parameters < 0:
            raise ValueError("its parameter count is not a whole number")
        if (not isinstance(inputs, list) or len(inputs) > 1000 or not all(
                isinstance(i, list) and len(i) == 2 and isinstance(i[0], str)
                and isinstance(i[1], list) and all(type(d) is int for d in i[1])
                for i in inputs)):
            raise ValueError("its inputs are not [dtype, [dims]] pairs")
        return cls(dict(ops), parameters, tuple((d, tuple(s)) for d, s in inputs))

    @property
    def key(self) -> str:
        """sha256 of the signature's JSON (hex): equal for the same model fed alike."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def similarity(self, other: ModelSignature) -> float:
        """How alike two models are, from 0 (no operator in common) to 1 (the same mix).

        The cosine of the two operator histograms, counts taken as ``log(1 + n)`` so
        that a deeper model of the same blocks stays alike (a 50-layer and a 101-layer
        ResNet: about 0.99); times ``exp(-|log10(p1 / p2)| / 4)`` for the parameter
        counts (10x more parameters: 0.78x).
        """
        names = sorted(set(self.ops) | set(other.ops))
        a = np.log1p([self.ops.get(n, 0) for n in names])
        b = np.log1p([other.ops.get(n, 0) for n in names])
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        if norm == 0.0:
            return 0.0
        sizes = math.log10(max(self.parameters, 1) / max(other.parameters, 1))
        return float(a @ b) / norm * math.exp(-abs(sizes) / 4)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (If, Loop, Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)
