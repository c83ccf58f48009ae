from __future__ import annotations

import re

import numpy as np
import pytest

from routetune.errors import UsageError
from routetune.judging.accuracy import check_accuracy, measure_accuracy, parse_accuracy
from routetune.registry import Registry


def test_metrics_have_exact_values(registry: Registry) -> None:
    ref = np.array([1.0, 2.0, 0.0, -1.0], dtype=np.float32)
    out = np.array([1.0, 2.5, 0.0, -1.0], dtype=np.float32)
    m = {name: registry.metric(name)(out, ref, 0.1, 0.1) for name in registry.metrics}
    assert m["l0"] == 0.25  # |0.5| > 0.1 + 0.1*2 for one of four elements
    assert m["l1"] == pytest.approx(0.125)
    assert m["l2"] == pytest.approx(0.0625)
    assert m["linf"] == pytest.approx(0.5)
    assert m["rel_l2"] == pytest.approx(0.5 / np.sqrt(6))
    assert m["cos"] == pytest.approx(7.0 / (np.sqrt(6) * np.sqrt(8.25)))


def test_parse_scopes_and_tolerances(registry: Registry) -> None:
    c = parse_accuracy("l0<=0.001,atol=1e-3,rtol=1e-2,out0:linf<=0.01,out0:atol=0.5",
                       registry, ["out0", "out1"])
    assert c.tolerances("out0") == (0.5, 1e-2)
    assert c.tolerances("out1") == (1e-3, 1e-2)
    assert [str(t) for t in c.for_output("out0")] == ["l0<=0.001", "out0:linf<=0.01"]
    assert [str(t) for t in c.for_output("out1")] == ["l0<=0.001"]


def test_scoped_bound_replaces_unscoped_one(registry: Registry) -> None:
    c = parse_accuracy("cos>=0.999,a:cos>=0.9", registry, ["a", "b"])
    assert [str(t) for t in c.for_output("a")] == ["a:cos>=0.9"]
    assert [str(t) for t in c.for_output("b")] == ["cos>=0.999"]


@pytest.mark.parametrize(
    ("text", "message"),
    [("cos>0.9x", "not a number"), ("banana", "cannot parse"), ("cos<=0.9", "bound it with >="),
     ("l0>=0.1", "bound it with <="), ("nope<=1", "unknown accuracy metric 'nope'"),
     ("zz:cos>=0.9", "unknown output 'zz'"), ("atol=1e-3", "no metric bound"),
     ("atol<=1", "atol=<non-negative number>"), ("cos=0.9", "needs <= or >=")],
)
def test_bad_expressions(registry: Registry, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_accuracy(text, registry, ["y"])


def test_check_reports_margin_and_nonfinite(registry: Registry) -> None:
    c = parse_accuracy("cos>=0.999", registry, ["y"])
    ref = [{"y": np.linspace(-1, 1, 100, dtype=np.float32)}]
    good = check_accuracy(c, registry, ref, ref)
    assert good.passed and good.metrics["y"]["cos"] == pytest.approx(1.0)
    bad_out = [{"y": -ref[0]["y"]}]
    bad = check_accuracy(c, registry, bad_out, ref)
    assert not bad.passed
    assert bad.failures == ("y: cos -1, needs >= 0.999",)
    nan_out = [{"y": ref[0]["y"].copy()}]
    nan_out[0]["y"][3] = np.nan
    nan = check_accuracy(parse_accuracy("l0<=0.99", registry, ["y"]), registry, nan_out, ref)
    assert not nan.passed
    assert "1 NaN/Inf value(s) that differ from the reference's" in nan.reason


@pytest.mark.parametrize(("text", "problem"), [
    ("cos>=1.5", "'cos>=1.5' can never hold (cos lies in [-1, 1]); loosen the bound"),
    ("rel_l2<=-1", "'rel_l2<=-1' can never hold (rel_l2 lies in [0, inf]); loosen the bound"),
    ("cos>=-2", "'cos>=-2' always holds (cos lies in [-1, 1]); tighten the bound"),
    ("l0<=1", "'l0<=1' always holds (l0 lies in [0, 1]); tighten the bound"),
])
def test_bounds_outside_a_metric_range_are_refused(registry: Registry, text: str,
                                                   problem: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_accuracy(text, registry, ["y"])
    assert str(e.value) == f"--accuracy '{text}': {problem}"


def test_almost_constant_reference_is_noted(registry: Registry) -> None:
    c = parse_accuracy("l0<=0.01,atol=1e-3", registry, ["y"])
    ref = [{"y": np.full(10, 1e-6, dtype=np.float32)}]
    result = check_accuracy(c, registry, ref, ref)
    assert result.passed
    assert "almost constant" in result.notes[0]


def test_metrics_span_every_input_set(registry: Registry) -> None:
    c = parse_accuracy("linf<=0.1", registry, ["y"])
    ref = [{"y": np.zeros(4, np.float32)}, {"y": np.zeros(4, np.float32)}]
    out = [{"y": np.zeros(4, np.float32)}, {"y": np.array([0, 0, 0, 1], np.float32)}]
    result = check_accuracy(c, registry, out, ref)
    assert result.metrics["y"]["linf"] == 1.0 and not result.passed


# --- non-finite values: one rule for every metric (real-models issue, kind 3) ---------

def masked_log_softmax() -> np.ndarray:
    """Log-probabilities with -inf where the mask removed a class, on purpose."""
    logits = np.array([[2.0, 1.0, -np.inf, 0.5], [0.1, -np.inf, -np.inf, 3.0]])
    return (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)


def ctc_log_probs() -> np.ndarray:
    """CTC-style log-probabilities of shape (T, C): -inf for impossible labels."""
    p = np.full((6, 5), -np.inf, np.float32)
    p[np.arange(6), [0, 1, 1, 0, 3, 0]] = np.log(0.9)
    p[np.arange(6), 4] = np.log(0.1)
    return p


@pytest.mark.parametrize("make", [masked_log_softmax, ctc_log_probs])
def test_the_same_infinities_match_in_every_metric(registry: Registry, make) -> None:  # noqa: ANN001
    ref = make()
    assert np.isneginf(ref).any()
    near = ref + np.where(np.isfinite(ref), 1e-6, 0).astype(np.float32)
    for name, metric in registry.metrics.items():
        value = metric.item(ref, ref, 1e-3, 1e-3)
        assert value == pytest.approx(metric.item.best, abs=1e-12), name  # exact passes
        assert np.isfinite(metric.item(near, ref, 1e-3, 1e-3)), name
    c = parse_accuracy("cos>=0.9999,l0<=0,rel_l2<=1e-4", registry, ["y"])
    assert check_accuracy(c, registry, [{"y": near}], [{"y": ref}]).passed


@pytest.mark.parametrize("make", [masked_log_softmax, ctc_log_probs])
@pytest.mark.parametrize("replace", [0.0, np.inf, np.nan, -50.0])
def test_a_value_where_the_reference_is_minus_inf_is_an_error_in_every_metric(
        registry: Registry, make, replace: float) -> None:  # noqa: ANN001
    ref = make()
    out = ref.copy()
    out[np.isneginf(ref)] = replace  # 0 or +inf where -inf belongs: `inf > inf` is False
    n_bad = int(np.isneginf(ref).sum())
    for name, metric in registry.metrics.items():
        value = metric.item(out, ref, 1e-3, 1e-3)
        if metric.item.fraction:
            assert value == pytest.approx(n_bad / ref.size), name
        else:
            assert value == metric.item.worst, (name, value)
    verdict = check_accuracy(parse_accuracy("l0<=0.001", registry, ["y"]), registry,
                             [{"y": out}], [{"y": ref}])
    assert not verdict.passed and f"{n_bad} NaN/Inf value(s) that differ" in verdict.reason


def test_nan_matches_only_where_the_reference_is_nan(registry: Registry) -> None:
    ref = np.array([1.0, np.nan, 3.0, np.inf], np.float32)
    assert registry.metric("linf")(ref.copy(), ref, 0, 0) == 0.0
    assert registry.metric("cos")(ref.copy(), ref, 0, 0) == pytest.approx(1.0)
    out = np.array([1.0, 2.0, 3.0, np.inf], np.float32)  # finite where the reference is NaN
    assert registry.metric("l0")(out, ref, 0, 0) == 0.25
    out = np.array([1.0, np.nan, np.nan, -np.inf], np.float32)  # NaN, and the other infinity
    assert registry.metric("l0")(out, ref, 0, 0) == 0.5
    assert registry.metric("rel_l2")(out, ref, 0, 0) == np.inf


@pytest.mark.parametrize(("text", "message"), [
    ("rel_l2<=", "'rel_l2<=' has no number after <=; write e.g. rel_l2<=0.01"),
    ("cos>>1", "'>>' in 'cos>>1' is not an operator; write e.g. cos>=0.99 or cos<=0.01"),
    ("cos>=0.99,foo=3", "unknown setting 'foo'; '=' sets only atol or rtol"),
    ("atol=1e-3,atol=1e-4,l0<=0.1", "atol is set twice; give it once"),
    ("y:rtol=0,y:rtol=1e-3,l0<=0.1", "rtol is set twice for y; give it once"),
    ("rel_l2<=1e-5,rel_l2<=1e-3", "rel_l2 is bounded twice; give one bound"),
])
def test_ambiguous_or_incomplete_expressions_are_one_line(registry: Registry, text: str,
                                                          message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_accuracy(text, registry, ["y"])
    # an output-scoped bound beside an unscoped one is not a repeat: it replaces it there
    assert len(parse_accuracy("y:cos>=0.9,cos>=0.99", registry, ["y"]).thresholds) == 2


def test_the_metrics_of_each_input_set_say_which_set_an_error_comes_from(
        registry: Registry, tmp_path) -> None:  # noqa: ANN001
    from routetune.judging.judge import measurement
    from routetune.records.store import TrialStore
    from routetune.records.trial import Trial

    refs = [{"y": np.ones(4, np.float32)}, {"y": np.arange(4, dtype=np.float32)}]
    outs = [{"y": np.ones(4, np.float32)}, {"y": np.array([0, 1, 2, 5], np.float32)}]
    measured = measure_accuracy(registry, outs, refs, {"y": (1e-3, 1e-3)})
    first, second = measured.per_set["y"]
    assert first["linf"] == 0.0 and second["linf"] == 2.0  # the error is the second set's
    assert measured.metrics["y"]["linf"] == 2.0  # pooled: what the bounds judge
    assert measure_accuracy(registry, outs[:1], refs[:1], {}).per_set == {}
    trial = Trial("f", "m", "base", "onnxruntime", "cpu", "s", "ok",
                  accuracy=measured.metrics, tolerances=measured.tolerances,
                  accuracy_per_set=measured.per_set)
    store = TrialStore.open(tmp_path / "t.sqlite")
    stored = store.add(trial)
    assert store.get("f").accuracy_per_set == stored.accuracy_per_set == measured.per_set
    assert measurement(store.get("f")).per_set == measured.per_set
    store.close()


def test_finite_values_whose_sum_overflows_are_still_compared_as_finite(
        registry: Registry) -> None:
    # the quick check (a finite sum) answers False here: the exact rule must then hold
    from routetune.judging.metrics import all_finite, finite_pair

    ref = np.array([1e308, 1e308, -1.0], np.float64)
    out = np.array([1e308, 1e308, -1.5], np.float64)
    assert not all_finite(ref) and all_finite(np.array([1.0, -2.0]))
    a, b, mismatches = finite_pair(out, ref)
    assert mismatches == 0 and a.tolist() == out.tolist() and b.tolist() == ref.tolist()
    assert registry.metric("linf")(out, ref, 0.0, 0.0) == 0.5
    assert registry.metric("l0")(out, ref, 0.1, 0.0) == pytest.approx(1 / 3)
    nan_out = np.array([np.nan, 1e308, -1.0])
    assert finite_pair(nan_out, ref)[2] == 1  # NaN where the reference is finite


def test_each_set_of_a_sequence_output_is_measured_on_its_own_tensors(
        registry: Registry) -> None:
    # a sequence output: each set a list of tensors of different shapes
    refs = [{"y": [np.zeros(3, np.float32), np.ones((2, 2), np.float32)]},
            {"y": [np.full(5, 2.0, np.float32)]}]
    outs = [{"y": [np.zeros(3, np.float32), np.ones((2, 2), np.float32)]},
            {"y": [np.array([2, 2, 2, 2, 3.5], np.float32)]}]
    measured = measure_accuracy(registry, outs, refs, {"y": (1e-3, 1e-3)})
    first, second = measured.per_set["y"]
    assert first["linf"] == 0.0 and first["l1"] == 0.0
    assert second["linf"] == 1.5 and second["l1"] == pytest.approx(0.3)
    assert measured.metrics["y"]["l1"] == pytest.approx(1.5 / 12)
    short = [outs[0], {"y": [np.full(4, 2.0, np.float32)]}]  # set 2 one value short …
    longer = [{"y": [np.zeros(3, np.float32), np.ones((2, 2), np.float32), np.zeros(1)]},
              short[1]]  # … and set 1 one value long: the pooled sizes agree
    uneven = measure_accuracy(registry, longer, refs, {"y": (1e-3, 1e-3)})
    assert uneven.per_set["y"] == ({}, {})


def test_a_decoders_cache_outputs_get_the_tensor_metrics_only(registry: Registry) -> None:
    rng = np.random.default_rng(0)
    refs = [{"logits": rng.standard_normal((1, 1, 16)),
             "present.0.key": rng.standard_normal((1, 2, 5 + k, 8))} for k in range(2)]
    outs = [{n: a + 1e-3 for n, a in r.items()} for r in refs]
    measured = measure_accuracy(registry, outs, refs, {})
    assert {"top1", "kl", "rel_l2"} <= set(measured.metrics["logits"])
    cache = measured.metrics["present.0.key"]
    assert "rel_l2" in cache and "cos" in cache
    assert not {"top1", "kl", "ctc@0", "mask_iou@0.3"} & set(cache)  # keys, not classes
    assert not {"top1"} & set(measured.per_set["present.0.key"][1])
    same_name = [{"present.0.key": r["logits"]} for r in refs]  # rank 3: not a cache
    assert "top1" in measure_accuracy(registry, same_name, same_name, {}).metrics[
        "present.0.key"]


def test_finite_outputs_are_checked_once_and_give_every_metric_its_own_value(
        registry: Registry) -> None:
    # measure_accuracy checks a finite output once (`Metric.of_finite`), not once per
    # metric and input set; each figure must still be the metric's own, bit for bit
    rng = np.random.default_rng(3)
    refs = [{"y": rng.standard_normal((2, 7, 30)).astype(np.float32)} for _ in range(4)]
    outs = [{"y": r["y"] + rng.normal(0, 1e-3, r["y"].shape).astype(np.float32)}
            for r in refs]
    measured = measure_accuracy(registry, outs, refs, {"y": (1e-3, 1e-3)})
    flat_out = np.concatenate([o["y"].ravel() for o in outs])
    flat_ref = np.concatenate([r["y"].ravel() for r in refs])
    tensor = {name: e.item for name, e in registry.metrics.items()
              if name in ("l0", "l1", "l2", "linf", "cos", "rel_l2")}
    assert 0 < measured.metrics["y"]["l0"] < 1  # a fraction, where n / size could round
    for name, metric in tensor.items():
        assert measured.metrics["y"][name] == metric(flat_out, flat_ref, 1e-3, 1e-3), name
        for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
            assert measured.per_set["y"][k][name] == metric(o["y"], r["y"], 1e-3, 1e-3), name
