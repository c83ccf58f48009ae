"""Built-in passes over the ONNX project's own node tests (issue 21), in-process.

Each kind of defect the conformance run found is pinned by its named node test and one
more of the same kind; a seeded sample of the node tests then runs through every
built-in pass with the targets: no wrong output from an exact pass, no invalid model, no
traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from routetune.conformance import (
    DEFECTS,
    ROUTES,
    Row,
    node_tests,
    run_route,
    sample_tests,
    write_case,
)
from routetune.registry import Registry

SAMPLE = 300
"""Node tests in the seeded sample (of 1,884 in onnx 1.23): about 90 s here, in `SHARDS`."""


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    return {c.name: c for c in node_tests()}


def run(cases: dict[str, Any], name: str, route: str, registry: Registry,
        tmp_path: Path) -> Row:
    why = write_case(cases[name], tmp_path / name)
    assert not why, why
    return run_route(tmp_path / name, route, registry)


# (kind, node test, route, the outcome expected): each kind's named test, then one more.
# "unchanged" and "not-applicable" still built the base, ran it and checked its outputs.
# INT8 on these one-operator tests misses the tolerance (an attention's softmax in INT8):
# allowed for a precision route; what is pinned is that the model is valid and runs.
PINNED = [
    ("K1 Shape start/end folded whole", "test_shape_end_1", "fold-constants", "ok"),
    ("K1", "test_shape_start_1_end_negative_1", "fold-constants", "ok"),
    ("K1 expanded functions", "test_attention_3d_expanded", "fold-constants", "ok"),
    ("K2 nodes out of order with If", "test_affine_grid_2d_align_corners_expanded",
     "int8-qdq", "tolerance-miss"),
    ("K2", "test_affine_grid_3d_expanded", "int8-qdq", "tolerance-miss"),
    ("K3 type fixed by an attribute", "test_bitcast_2d_float32_to_int32", "fp16", "unchanged"),
    ("K3", "test_eyelike_populate_off_main_diagonal", "fp16", "unchanged"),
    ("K3", "test_eyelike_with_dtype", "fp16", "not-applicable"),
    ("K3: the attribute left to its FLOAT default", "test_hannwindow", "fp16", "unchanged"),
    ("K5 sequence output", "test_split_to_sequence_2", "fp16", "unchanged"),
    ("K5 ragged sequence", "test_split_to_sequence_1", "fp16", "unchanged"),
    ("K5", "test_split_to_sequence_nokeepdims", "fp16", "unchanged"),
    ("K6 zero-size and rank-0 inputs: loaded, and the reference ran", "test_cumsum_1d",
     "fp16", "not-applicable"),
    ("K6", "test_reduce_min_empty_set", "fp16", "ok"),
    ("K7 string inputs: loaded, and the reference ran", "test_equal_string", "eliminate-noops",
     "not-applicable"),
    ("K8 Q/DQ types: what int8-qdq writes is valid; ONNX Runtime's own transpose optimiser "
     "then makes a QuantizeLinear it refuses, in one line",
     "test_attention_3d_expanded", "int8-qdq", "refused"),
    ("K8", "test_attention_4d_expanded", "int8-qdq", "tolerance-miss"),
    ("K9 inputs written by a run", "test_batchnorm_epsilon_training_mode", "fp16", "ok"),
    ("K10 float8 tensors", "test_cast_FLOAT_to_FLOAT8E4M3FN", "fp16", "unchanged"),
    ("K10: ONNX Runtime cannot return float8 e5m2 to Python, so the original model "
     "cannot be checked: skipped, in one line", "test_cast_FLOAT_to_FLOAT8E5M2", "fp16",
     "skipped"),
]


@pytest.mark.parametrize(("kind", "name", "route", "expected"), PINNED,
                         ids=[f"{p[1]}-{p[2]}" for p in PINNED])
def test_each_kind_is_fixed(cases: dict[str, Any], registry: Registry, tmp_path: Path,
                            kind: str, name: str, route: str, expected: str) -> None:
    row = run(cases, name, route, registry, tmp_path)
    assert row.outcome == expected, f"{kind}: {row.outcome}: {row.reason}"


@pytest.mark.parametrize("name", ["test_scatternd_max", "test_scatter_elements_with_reduction_max"])
def test_a_node_without_a_kernel_of_the_low_type_stays_fp32(
        cases: dict[str, Any], registry: Registry, tmp_path: Path, name: str) -> None:
    # K4: ONNX Runtime's CPU provider has no float16 ScatterND/ScatterElements with a
    # reduction, which it says only when the node runs: fp16 asks the backend
    # (Backend.kernel_gaps) and keeps such a node in FP32
    row = run(cases, name, "fp16", registry, tmp_path)
    assert row.outcome in ("ok", "unchanged"), f"{row.outcome}: {row.reason}"


SHARDS = 4
"""The sample runs in this many parts, each a test class of its own: under ``pytest -n
--dist loadscope`` the parts run in parallel."""


class SampleShard:
    """One part of the seeded sample: its `shard`-th of `SHARDS`."""

    shard = 0

    @pytest.mark.slow
    def test_a_seeded_sample_meets_the_targets(self, cases: dict[str, Any],
                                               registry: Registry, tmp_path: Path) -> None:
        rows = []
        sample = sample_tests(list(cases.values()), SAMPLE, seed=0)[self.shard::SHARDS]
        for case in sample:
            if write_case(case, tmp_path / case.name):
                continue  # sequence or optional inputs: not expressible as .npz
            rows.extend(run_route(tmp_path / case.name, route, registry) for route in ROUTES)
        defects = [f"{r.test} {r.route} {r.outcome}: {r.reason[:200]}" for r in rows
                   if r.outcome in DEFECTS]
        ran = [r for r in rows if r.outcome != "skipped"]
        assert len(ran) > len(sample) * len(ROUTES) // 2  # most of the sample really ran
        assert not defects, "\n".join(defects)


class TestSampleShard0(SampleShard):
    shard = 0


class TestSampleShard1(SampleShard):
    shard = 1


class TestSampleShard2(SampleShard):
    shard = 2


class TestSampleShard3(SampleShard):
    shard = 3
