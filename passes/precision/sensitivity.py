"""Per-node sensitivity of a low-precision conversion: the error each node adds.

Both models, the FP32 one and its FP16/BF16/Q/DQ conversion, run once on the
validation inputs with every float tensor as an output (Polygraphy's ``--onnx-outputs
mark all`` layer-wise comparison). A tensor's error is its relative L2 distance from
the FP32 value. A node's sensitivity is the error it adds: its output's error minus the
worst error among its inputs. Ranking by added error rather than by output error points
at the node where precision is lost, not at everything downstream of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import onnx

from routetune.model.loading import with_intermediates

LOW_DTYPES = frozenset({"float16", "bfloat16"})


@dataclass(frozen=True)
class Sensitivity:
    """One node's share of the conversion's error.

    Args:
        node: The node's name (as in the FP32 model; ``nodes_to_exclude`` takes it).
        op: Its operator type.
        added: Relative L2 error it adds over the worst of its inputs; inf when its
            output overflows while its inputs are finite.
        output: Relative L2 error of its output against FP32, worst over the inputs sets.
        why: Another reason it ranks where it does (a strict-FP16 overflow); empty when
            the error figures say it all.
    """

    node: str
    op: str
    added: float
    output: float
    why: str = ""

    def __str__(self) -> str:
        return f"{self.node} ({self.why or f'{self.op}, adds rel-L2 {self.added:.2g}'})"


def rank_nodes(
    fp32: onnx.ModelProto,
    low: onnx.ModelProto,
    evaluate: Callable[[onnx.ModelProto], Iterable[dict[str, np.ndarray]]],
    evaluate_low: Callable[[onnx.ModelProto], Iterable[dict[str, np.ndarray]]] | None = None,
) -> list[Sensitivity]:
    """Rank the converted nodes of `low` by the error each one adds, largest first.

    The two models run side by side, one input set at a time, and each set's tensors
    are reduced to their errors before the next runs: one set's intermediates of each
    model are held at once (212 MB each for PP-OCRv4's recogniser), not all sets'.

    Args:
        fp32: The model before conversion.
        low: The converted model; its nodes keep their names, and tensors that exist in
            both keep theirs (as `Fp16`, `Bf16` and ONNX Runtime's QDQ quantizer do).
        evaluate: Runs a model on every validation input set and yields all outputs,
            one mapping per set (`routetune.seasoning.RouteContext.evaluate`).
        evaluate_low: Runs `low` instead of `evaluate`: the measured device, where the
            reference has no kernels for its type (bfloat16 on ONNX Runtime's CPU
            provider). None: `evaluate`.

    Returns:
        Every node of `fp32` that runs in low precision in `low` (it writes a float16 or
        bfloat16 tensor, reads a DequantizeLinear output, or is another operator under
        its name, as a weight-only quantized MatMul), sorted by added error,
        largest first, then by name. Nodes whose output is no worse than their inputs
        (added error 0 or below) come last, so that keeping the whole list in FP32
        undoes the conversion.

    Raises:
        Exception: Whatever `evaluate` raises for a model it cannot run.
    """
    error: dict[str, float] = {}
    dtypes: dict[str, str] = {}
    low_runs = (evaluate_low or evaluate)(with_intermediates(low))
    for got, ref in zip(low_runs, evaluate(with_intermediates(fp32)), strict=True):
        dtypes.update((name, value.dtype.name) for name, value in got.items())
        _add_errors(error, ref, got)
    lowered = _lowered_nodes(fp32, low, dtypes)
    ranked = []
    for node in fp32.graph.node:
        outs = [error[o] for o in node.output if o in error]
        if node.name not in lowered or not outs:
            continue
        out = max(outs)
        inp = max((error[i] for i in node.input if i in error), default=0.0)
        added = out - inp if math.isfinite(out) or math.isinf(inp) else math.inf
        added = 0.0 if math.isnan(added) else added
        ranked.append(Sensitivity(node.name, node.op_type, added, out))
    return sorted(ranked, key=lambda s: (-s.added, s.node))


def _add_errors(errors: dict[str, float], ref: dict[str, np.ndarray],
                got: dict[str, np.ndarray]) -> None:
    """Per tensor in both runs of one input set: keep the worst relative L2 error so far."""
    for name, value in got.items():
        expected = ref.get(name)
        if expected is None or expected.shape != value.shape or value.dtype.kind != "f":
            continue
        errors[name] = max(errors.get(name, 0.0), _rel_l2(value, expected))


def _rel_l2(value: np.ndarray, expected: np.ndarray) -> float:
    got = value.astype(np.float64)
    if not np.isfinite(got).all():
        return math.inf
    want = expected.astype(np.float64)
    scale = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / (scale if scale > 0 else 1.0)


def _lowered_nodes(fp32: onnx.ModelProto, low: onnx.ModelProto, dtypes: dict[str, str]
                   ) -> set[str]:
    """The nodes `low` runs in low precision.

    Those that write a float16/bfloat16 tensor, read a DequantizeLinear output, or
    became another operator under their own name (a MatMul written as ONNX Runtime's
    weight-only ``MatMulNBits``).
    """
    dequantized = {o for n in low.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    ops = {n.name: n.op_type for n in fp32.graph.node if n.name}
    lowered = set()
    for node in low.graph.node:
        writes_low = any(dtypes.get(o) in LOW_DTYPES for o in node.output)
        replaced = node.name in ops and ops[node.name] != node.op_type
        if writes_low or replaced or any(i in dequantized for i in node.input):
            lowered.add(node.name)
    return lowered
