"""The trial table's verdict column."""

from __future__ import annotations

from routetune.registry import Registry
from routetune.reporting.display import verdict_text
from routetune.trial import Trial


def test_the_verdict_names_what_each_precision_step_decided(registry: Registry) -> None:
    passes = (
        {"step": "fold-constants", "stats": {"folded": 3}, "note": ""},
        {"step": "int8-qdq{per_channel=false}", "stats": {"quantized_nodes": 6,
                                                          "excluded_range_mismatch": 0}},
        {"step": "precision-repair{count=2}", "stats": {"ranked": 8, "kept_fp32": 2},
         "note": "kept in FP32: matmul0 (MatMul, adds rel-L2 0.01), matmul4 (MatMul, adds "
                 "rel-L2 0.004); 8 converted nodes ranked; int8-qdq: "},
    )
    trial = Trial("f", "m", "fold-constants,int8-qdq{per_channel=false},precision-repair"
                  "{count=2}", "onnxruntime", "cpu", "s", "ok", "y: rel_l2 0.01",
                  passes=passes)
    assert verdict_text(trial, registry) == (
        "y: rel_l2 0.01 | int8-qdq: quantized_nodes 6 | precision-repair: ranked 8, "
        "kept_fp32 2; kept in FP32: matmul0 (MatMul, adds rel-L2 0.01), matmul4 (MatMul, "
        "adds rel-L2 0.004)")
