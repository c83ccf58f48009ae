"""The trial table's verdict column."""

from __future__ import annotations

from routetune.registry import Registry
from routetune.reporting.display import status_line, verdict_text, wrap_route
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


def test_a_route_wraps_only_between_steps() -> None:
    route = ("fuse-bn-into-conv,ort-no-spinning,fp16{op_types_to_exclude=[Softmax,Pow,Exp]},"
             "ort-threads{inter_op=2,intra_op=1}")
    lines = wrap_route(route, 30).splitlines()
    assert lines == ["fuse-bn-into-conv,", "ort-no-spinning,",
                     "fp16{op_types_to_exclude=[Softmax,Pow,Exp]},",  # one step, kept whole
                     "ort-threads{inter_op=2,intra_op=1}"]
    assert "".join(lines) == route  # copied back, it is the route
    assert wrap_route("base") == "base"


def test_the_status_line_counts_and_names_the_common_reason() -> None:
    trials = [Trial(str(i), "m", f"r{i}", "b", "d", "s", status, reason)
              for i, (status, reason) in enumerate([
                  ("ok", ""), ("ok", ""), ("accuracy-failed", "y: cos 0.9, needs >= 0.99"),
                  ("accuracy-failed", "y: cos 0.9, needs >= 0.99"),
                  ("skipped", "no kernels")])]
    line = status_line(trials)
    assert line.startswith("5 trials: ")
    assert "2 ok" in line and "2 accuracy-failed" in line
    assert "most often, 2x: y: cos 0.9, needs >= 0.99" in line and "e.g.: no kernels" in line
