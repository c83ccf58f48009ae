"""Task metrics (routetune.judging.task_metrics): known answers, non-finite values, grammar."""

from __future__ import annotations

import re

import numpy as np
import pytest

from routetune.errors import UsageError
from routetune.judging.accuracy import (
    check_accuracy,
    check_outputs,
    judge,
    measure_accuracy,
    parse_accuracy,
)
from routetune.judging.metrics import TaskMetric
from routetune.judging.task_metrics import TASK_METRICS, ctc_greedy
from routetune.registry import Registry
from routetune.reporting.report_text import worst_of
from routetune.testing import check_metric

RNG = np.random.default_rng(17)


def metric(registry: Registry, name: str) -> TaskMetric:
    found = registry.metric(name)
    assert isinstance(found, TaskMetric)
    return found


def probabilities(*shape: int) -> np.ndarray:
    x = RNG.standard_normal(shape)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def swap_top_two(row: np.ndarray) -> None:
    """Exchange a probability row's two largest values in place: its argmax moves."""
    first, second = np.argsort(row)[::-1][:2]
    row[first], row[second] = row[second], row[first]


# ------------------------------------------------------------------ known answers


def test_one_flipped_argmax_in_40_samples_is_top1_0_975(registry: Registry) -> None:
    ref = probabilities(40, 10)
    out = ref.copy()
    swap_top_two(out[7])
    top1 = metric(registry, "top1")
    as_one_set = top1.measure([out], [ref])
    as_40_sets = top1.measure(list(out[:, None]), list(ref[:, None]))  # (1, C) per set
    as_rank_1 = top1.measure(list(out), list(ref))  # (C,) per set: one sample each
    assert as_one_set == as_40_sets == as_rank_1 == 0.975
    assert metric(registry, "topk").measure([out], [ref], 2) == 1.0  # still in the top 2


def test_topk_is_the_rate_of_reference_classes_in_the_candidates_top_k(
        registry: Registry) -> None:
    ref = np.array([[0.1, 0.6, 0.2, 0.1]] * 4)
    out = np.array([[0.1, 0.6, 0.2, 0.1],     # class 1 first
                    [0.3, 0.25, 0.4, 0.05],   # class 1 third
                    [0.05, 0.3, 0.6, 0.05],   # class 1 second
                    [0.25, 0.25, 0.25, 0.25]])  # a tie: class 1 after class 0
    topk = metric(registry, "topk")
    assert [topk.measure([out], [ref], k) for k in (1, 2, 3, 4)] == [0.25, 0.75, 1.0, 1.0]
    assert topk.measure([out], [ref], 1) == metric(registry, "top1").measure([out], [ref])
    assert topk.key() == "topk@5" and topk.key(2) == "topk@2"


def test_greedy_ctc_collapses_repeats_then_drops_blanks() -> None:
    def one_hot(ids: list[int], classes: int = 6) -> np.ndarray:
        return np.eye(classes)[ids][None]

    # PaddleOCR's CTCLabelDecode: 3 3 | 3 (blank between) 5 5 -> 3 3 5
    [seq] = ctc_greedy(one_hot([0, 3, 3, 0, 3, 5, 5, 0]))
    assert seq.tolist() == [3, 3, 5]
    [seq] = ctc_greedy(one_hot([0, 3, 3, 0, 3, 5, 5, 0]), blank=5)  # 0 is a class now
    assert seq.tolist() == [0, 3, 0, 3, 0]
    [seq] = ctc_greedy(one_hot([1, 1, 1]), blank=99)  # a blank outside the classes
    assert seq.tolist() == [1]


def test_ctc_is_the_rate_of_sequences_read_the_same(registry: Registry) -> None:
    ref = probabilities(32, 40, 12)
    out = ref.copy()
    t = int(np.argmax(ref[5, 3]))  # a different class at one step of line 5
    out[5, 3, (t + 1) % 12] = 2.0
    ctc = metric(registry, "ctc")
    assert ctc.measure([out], [ref]) == 31 / 32
    # a change that decoding does not see: the step's class stays the argmax
    same = ref.copy()
    same[9, 0, np.argmax(ref[9, 0])] += 0.5
    assert ctc.measure([same], [ref]) == 1.0
    assert ctc.measure([ref[i] for i in range(32)], [ref[i] for i in range(32)]) == 1.0


def test_mask_iou_is_the_mean_iou_of_the_maps_above_the_threshold(registry: Registry) -> None:
    ref = np.zeros((2, 1, 10, 10), np.float32)
    out = ref.copy()
    ref[0, 0, :2, :] = 0.9          # 20 pixels of text
    out[0, 0, 0, :] = 0.8           # 10 of them ...
    out[0, 0, 5, :5] = 0.31         # ... and 5 others: IoU 10 / 25
    out[0, 0, 9, 9] = 0.3           # not above 0.3: DBPostProcess's pred > thresh
    mask_iou = metric(registry, "mask_iou")
    assert mask_iou.measure([out], [ref]) == pytest.approx((0.4 + 1.0) / 2)  # empty = empty
    assert mask_iou.measure([out], [ref], 0.5) == pytest.approx((0.5 + 1.0) / 2)
    assert mask_iou.key() == "mask_iou@0.3"


def test_prob_abs_is_the_largest_difference_of_probabilities(registry: Registry) -> None:
    ref = np.linspace(0, 1, 128, dtype=np.float32)
    out = ref + np.where(np.arange(128) == 70, 0.004, 0.001).astype(np.float32)
    prob_abs = metric(registry, "prob_abs")
    assert prob_abs.measure([out, ref], [ref, ref]) == pytest.approx(0.004, rel=1e-4)
    assert prob_abs.measure([ref + 5], [ref]) == 1.0  # capped: probabilities differ by <= 1


def test_kl_is_the_mean_divergence_of_next_token_distributions(registry: Registry) -> None:
    # two rows of logits over 3 tokens: the first identical, the second from
    # p = (0.5, 0.25, 0.25) to q = (0.25, 0.5, 0.25): KL(p||q) = 0.5 ln 2 - 0.25 ln 2
    ref = np.log(np.array([[[0.2, 0.3, 0.5], [0.5, 0.25, 0.25]]], np.float32))
    out = np.log(np.array([[[0.2, 0.3, 0.5], [0.25, 0.5, 0.25]]], np.float32)) + 3.0
    kl = metric(registry, "kl")
    assert kl.measure([out], [ref]) == pytest.approx(0.25 * np.log(2) / 2, rel=1e-6)
    assert kl.measure([ref], [ref]) == 0.0
    verdict = check_accuracy(parse_accuracy("kl<=0.09", registry, ["logits"]), registry,
                             [{"logits": out}], [{"logits": ref}])
    assert verdict.passed  # (0 + 0.173) / 2 = 0.087 nats
    assert not check_accuracy(parse_accuracy("kl<=0.08", registry, ["logits"]), registry,
                              [{"logits": out}], [{"logits": ref}]).passed


@pytest.mark.parametrize("name", [m.name for m in TASK_METRICS])
def test_every_task_metric_keeps_the_metric_contract(registry: Registry, name: str) -> None:
    check_metric(registry, name)


# ------------------------------------------------------------------ non-finite values


@pytest.mark.parametrize(("name", "ref"), [
    ("top1", probabilities(40, 10)), ("ctc", probabilities(40, 6, 5)),
    ("mask_iou", probabilities(40, 4, 4, 4)),
])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_where_the_reference_is_finite_spoils_its_sample(
        registry: Registry, name: str, ref: np.ndarray, bad: float) -> None:
    out = ref.copy()
    out.reshape(40, -1)[3, 0] = bad  # sample 3; its argmax and mask might not change
    assert metric(registry, name).measure([out], [ref]) == pytest.approx(39 / 40)
    verdict = check_accuracy(parse_accuracy(f"{name}>=0.9", registry, ["y"]), registry,
                             [{"y": out}], [{"y": ref}])
    assert not verdict.passed and "1 NaN/Inf value(s) that differ" in verdict.reason


def test_matching_infinities_and_nans_are_compared_as_they_are(registry: Registry) -> None:
    # masked log-softmax: -inf on purpose, at the same places on both sides
    ref = np.log(probabilities(40, 6))
    ref[:, 2] = -np.inf
    out = ref.copy()
    out[ref > -np.inf] += 1e-6
    out[0, 0] = np.nan
    ref[0, 0] = np.nan  # NaN for NaN matches
    for m in TASK_METRICS:
        assert m.measure([out], [ref]) == pytest.approx(m.best, abs=1e-5), m.name
    flipped = out.copy()
    flipped[1, 2] = np.inf  # +inf where the reference has -inf
    assert metric(registry, "top1").measure([flipped], [ref]) == pytest.approx(39 / 40)
    assert metric(registry, "prob_abs").measure([flipped], [ref]) == 1.0


# ------------------------------------------------------------------ measure and judge


def test_a_measurement_holds_each_task_metric_at_its_default_and_the_constraints_values(
        registry: Registry) -> None:
    ref = [{"y": probabilities(8, 10)} for _ in range(5)]
    out = [{"y": r["y"].copy()} for r in ref]
    swap_top_two(out[2]["y"][4])
    c = parse_accuracy("topk@3>=0.99,top1>=0.99,y:mask_iou@0.05>=0.5", registry, ["y"])
    assert c.task_params() == {"mask_iou": (0.05,), "topk": (3.0,)}
    measured = measure_accuracy(registry, out, ref, c.tolerance_map(["y"]), c.task_params())
    values = measured.metrics["y"]
    assert {"topk@3", "topk@5", "mask_iou@0.05", "mask_iou@0.3", "ctc@0"} <= set(values)
    assert values["top1"] == 39 / 40 and values["topk@3"] == 1.0
    assert [s["top1"] for s in measured.per_set["y"]] == [1.0, 1.0, 7 / 8, 1.0, 1.0]
    verdict = judge(measured, c)
    assert verdict.failures == ("y: top1 0.975, needs >= 0.99",)


def test_an_output_of_another_shape_cannot_be_read_the_same(registry: Registry) -> None:
    ref = [{"y": probabilities(4, 6)}, {"y": probabilities(4, 6)}]
    out = [{"y": ref[0]["y"]}, {"y": ref[1]["y"].reshape(6, 4)}]  # as many elements
    values = measure_accuracy(registry, out, ref, {}).metrics["y"]
    assert values["top1"] == 0.5 and values["prob_abs"] == 1.0


# ------------------------------------------------------------------ the grammar


def test_a_term_takes_a_task_metrics_parameter_after_at(registry: Registry) -> None:
    outputs = ["probs", "save_infer_model/scale_0.tmp_1"]
    c = parse_accuracy("mask_iou@0.30>=0.99,ctc>=0.99,probs:topk@5>=0.9,"
                       "save_infer_model/scale_0.tmp_1:top1>=0.95,cos>=0.9", registry, outputs)
    assert [str(t) for t in c.thresholds] == [
        "mask_iou@0.3>=0.99", "ctc@0>=0.99", "probs:topk@5>=0.9",
        "save_infer_model/scale_0.tmp_1:top1>=0.95", "cos>=0.9"]
    assert [t.key for t in c.thresholds][:2] == ["mask_iou@0.3", "ctc@0"]
    # two levels of one metric are two bounds; the same level twice is a repeat
    assert len(parse_accuracy("mask_iou@0.3>=0.99,mask_iou@0.5>=0.9", registry,
                              ["y"]).thresholds) == 2
    # a scoped term replaces the unscoped ones of its metric, whatever their parameter
    c = parse_accuracy("mask_iou>=0.99,probs:mask_iou@0.5>=0.9", registry, ["probs", "y"])
    assert [str(t) for t in c.for_output("probs")] == ["probs:mask_iou@0.5>=0.9"]
    assert [str(t) for t in c.for_output("y")] == ["mask_iou@0.3>=0.99"]


@pytest.mark.parametrize(("text", "problem"), [
    ("cos@3>=0.9", "cos takes no parameter, and 'cos@3>=0.9' gives @3; write cos>=0.9"),
    ("top1@5>=0.99", "top1 takes no parameter, and 'top1@5>=0.99' gives @5; write "
     "top1>=0.99; for the top-k rate write topk@5>=0.99"),
    ("topk@2.5>=0.9", "'topk@2.5>=0.9': topk's k must be a whole number (how many of the "
     "candidate's classes count); write e.g. topk@5>=0.9"),
    ("ctc@-1>=0.9", "'ctc@-1>=0.9': ctc's blank must be 0 or more (the blank class index); "
     "write e.g. ctc@0>=0.9"),
    ("mask_iou@abc>=0.9", "'abc' in 'mask_iou@abc>=0.9' is not a number; mask_iou@ takes "
     "the probability threshold, e.g. mask_iou@0.3>=0.9"),
    ("mask_iou@>=0.9", "'mask_iou@>=0.9' has nothing after @; give mask_iou's threshold (the "
     "probability threshold), e.g. mask_iou@0.3>=0.9, or drop the @ for 0.3"),
    ("mask_iou@nan>=0.9", "'mask_iou@nan>=0.9': mask_iou's threshold must be a finite number "
     "(the probability threshold); write e.g. mask_iou@0.3>=0.9"),
    ("top1<=0.9", "top1 is a similarity; bound it with >="),
    ("top1>=1.5", "'top1>=1.5' can never hold (top1 lies in [0, 1]); loosen the bound"),
    ("prob_abs<=1", "'prob_abs<=1' always holds (prob_abs lies in [0, 1]); tighten the bound"),
    ("ctc@0>=0.9,ctc>=0.99", "ctc@0 is bounded twice; give one bound"),
    ("atol@1=0.1,cos>=0.9", "write atol=<non-negative number>"),
])
def test_a_bad_parameter_is_one_line_naming_the_term_and_the_fix(
        registry: Registry, text: str, problem: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_accuracy(text, registry, ["y"])
    assert str(e.value) == f"--accuracy '{text}': {problem}"


def test_a_bound_on_an_output_the_metric_cannot_read_is_refused(registry: Registry) -> None:
    shapes = {"speech_probs": ("sequence_length",), "logits": ("N", 40, 6625)}
    check_outputs(parse_accuracy("logits:ctc>=0.99,top1>=0.9", registry, list(shapes)),
                  registry, shapes)
    with pytest.raises(UsageError) as e:
        check_outputs(parse_accuracy("ctc>=0.99", registry, list(shapes)), registry, shapes)
    assert str(e.value) == (
        "--accuracy 'ctc>=0.99': 'ctc@0>=0.99': ctc reads outputs of rank 2 or more, and "
        "'speech_probs' has shape ('sequence_length',); scope it to an output it fits, e.g. "
        "logits:ctc@0>=0.99")
    with pytest.raises(UsageError, match=re.escape(
            "'logits:ctc@6625>=0.99': ctc's blank 6625 is not below the 6625 classes of "
            "'logits' (the blank class index); give one below 6625")):
        check_outputs(parse_accuracy("logits:ctc@6625>=0.99", registry, list(shapes)),
                      registry, shapes)
    with pytest.raises(UsageError, match="topk's k 5 is not below the 2 classes of 'y'"):
        check_outputs(parse_accuracy("topk>=0.99", registry, ["y"]), registry, {"y": (1, 2)})


def test_a_scoped_task_bound_heads_the_tables_for_its_output_only(registry: Registry) -> None:
    # a decoder bounded on its logits: the cache outputs' own top1 (argmax over head_dim)
    # is measured too, and must not be what the tables show beside the speed-up
    constraint = parse_accuracy("logits:top1>=0.99", registry, ["logits", "present.0.key"])
    key, higher = constraint.headline(registry)
    assert (key, higher) == ("logits:top1", True)
    accuracy = {"logits": {"top1": 1.0, "kl": 0.002}, "present.0.key": {"top1": 0.97}}
    assert worst_of(accuracy, key, higher) == 1.0
    assert worst_of(accuracy, "top1", True) == 0.97  # unscoped: the worst of every output
    assert worst_of(accuracy, "kl", False) == 0.002
    assert worst_of({"output:0": {"top1": 0.5}}, "output:0:top1", True) == 0.5  # TF names
    assert parse_accuracy("top1>=0.99", registry, ["y"]).headline(registry) == ("top1", True)
