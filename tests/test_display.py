"""The trial table's verdict column."""

from __future__ import annotations

import pytest

from routetune.display import status_line, verdict_text
from routetune.records.trial import Trial
from routetune.registry import Registry
from routetune.reporting.report_text import short_route, wrap_route


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


def test_a_route_is_shortened_between_steps() -> None:
    route = "ort-denormal-as-zero,ort-parallel{inter_op_threads=2},ort-threads{intra_op=2}"
    assert short_route(route, 100) == route
    assert short_route(route, 60) == "ort-denormal-as-zero,ort-parallel{inter_op_threads=2},… +1"
    assert short_route(route, 50) == "ort-denormal-as-zero,… +2"
    long_step = "int8-qdq{per_channel=false,symmetric_activations=false},fp16"
    assert short_route(long_step, 30) == "int8-qdq{per_channel=false,sy…"
    assert wrap_route(long_step, 24, cut=24) == "int8-qdq{per_channel=fa…\nfp16"


def test_the_compact_table_fits_80_columns_with_its_figures_whole(registry: Registry) -> None:
    from rich.console import Console

    from routetune.display import accurate_table, compact_table
    from routetune.timing.measure import Latency, Speedup

    lat = Latency(n=30, p50=12.345, p90=13.0, p99=13.5, mean=12.4, ci_low=12.2, ci_high=12.5)
    trials = [Trial("f", "m", r, "onnxruntime", "cpu", "s", status, reason, latency=lat,
                    base_latency=lat, paired=Speedup(1.234, 1.1, 1.3, 30, 0.02),
                    accuracy={"y": {"rel_l2": 7.2e-7}})
              for r, status, reason in (
                  ("base", "ok", ""),
                  ("fold-constants,fuse-bn-into-conv,ort-threads{intra_op=2}", "ok", ""),
                  ("int8-qdq{per_channel=false,symmetric_activations=false},ort-threads",
                   "accuracy-failed", "sigmoid_0.tmp_0: l0 0.0101563, needs <= 0.001"))]
    console = Console(width=80, record=True, color_system=None)
    console.print(accurate_table(trials, trials[0], registry, width=80))
    console.print(compact_table(trials, trials[0], "all", width=80))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "1.23x [1.10, 1.30]" in text and "7.2e-07" in text and "12.345" in text
    for step in ("fold-constants,", "fuse-bn-into-conv,", "ort-threads{intra_op=2}"):
        assert step in text  # wrapped after a comma, each step whole
    assert "int8-qdq{per_channe…" in text  # a step too long is cut, never wrapped


@pytest.mark.parametrize("width", [80, 100, 200])
def test_a_decoders_table_keeps_every_figure_whole_and_long_routes_at_200(
        registry: Registry, width: int) -> None:
    """A decoder's headline (``logits:top1``), noisy intervals and p50 pairs at 80-200."""
    from rich.console import Console

    from routetune.display import accurate_table
    from routetune.timing.measure import Latency, Speedup

    def lat(p50: float) -> Latency:
        return Latency(n=30, p50=p50, p90=p50, p99=p50, mean=p50, ci_low=p50, ci_high=p50)

    routes = ("base", "int8-qdq{per_channel=false,symmetric_activations=false}",
              "int8-qdq{per_channel=false,symmetric_activations=true}")
    trials = [Trial("f", "m", r, "onnxruntime", "cpu", "s", "ok", latency=lat(7.909),
                    base_latency=lat(12.381), paired=Speedup(1.6412, 1.4712, 1.7823, 30, 0.02),
                    accuracy={"logits": {"top1": 0.99942}, "present.0.key": {"top1": 0.5}},
                    noisy="busy")
              for r in routes]
    console = Console(width=width, record=True, color_system=None)
    console.print(accurate_table(trials, trials[0], registry, width=width,
                                 headline=("logits:top1", True)))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    assert text.count("1.64x [1.47, 1.78] noisy") == 3  # never cut
    assert text.count("7.909 / 12.381") == (2 if width > 80 else 0) and "logits:top1" in text
    assert ("p50 / base p50 ms: in report.md" in text) == (width == 80)
    assert text.count("0.999") == 3  # the logits' 0.99942, not rounded up to 1
    assert ("int8-qdq{per_channel=false,symmetric_activations=false}" in text) == (width > 100)
    assert text.count("int8-qdq{per_channel=") == 2  # cut where narrow, never dropped


def test_a_fallback_that_fails_the_constraint_is_not_called_accurate(registry: Registry
                                                                      ) -> None:
    from rich.console import Console

    from routetune.display import accurate_table
    from routetune.timing.measure import Latency

    lat = Latency(n=30, p50=1.0, p90=1.1, p99=1.2, mean=1.0, ci_low=0.9, ci_high=1.1)
    trials = [Trial("f", "m", r, "onnxruntime", "cpu", "s", "accuracy-failed",
                    "p: prob_abs 4.02e-06, needs <= 1e-06", latency=lat, base_latency=lat)
              for r in ("base", "fp16")]
    console = Console(width=100, record=True, color_system=None)
    console.print(accurate_table(trials, trials[0], registry, width=100))
    text = console.export_text()
    assert "0 accurate routes" in text and "the fallback, 'base', is accuracy-failed" in text
    assert "prob_abs 4.02e-06" in text and "fp16" not in text  # the base's reason, shown


def test_the_tables_show_the_task_metric_the_constraint_bounds(tmp_path) -> None:  # noqa: ANN001
    from command import routetune
    from graphs import matmul_chain
    from quick import QUICK_FLAGS

    model = matmul_chain(tmp_path / "m.onnx", depth=2, width=32, batch=8)
    out = tmp_path / "out"
    tune = routetune("tune", str(model), "--accuracy", "top1>=0.9,rel_l2<=0.5", "--seasonings",
                     "ort-threads", "--output", str(out), *QUICK_FLAGS)
    assert tune.returncode == 0, tune.stderr[-2000:]
    show = routetune("show", str(out), "--all")
    for text in (tune.stdout, show.stdout):  # the judged value, not rel-L2
        header = next(line for line in text.splitlines() if "speed-up [95%]" in line)
        assert "top1" in header and "rel_l2" not in header, header
        base = next(line for line in text.splitlines() if line.split()[1:2] == ["base"])
        at = header.index("top1")  # right-justified under its header
        assert base[at:at + 4].strip() == "1", (header, base)  # every argmax agrees
    report = (out / "report.md").read_text()
    assert "| speed-up | top1 |" in report
    row = next(line for line in report.splitlines() if line.startswith("| `base`"))
    assert row.split("|")[6].strip() == "1", row


def test_a_hopeless_speedup_keeps_its_digits() -> None:
    from routetune.reporting.report_text import speedup_figure, speedup_text

    assert speedup_figure(1.2345, (1.2, 1.31)) == "1.23x [1.20, 1.31]"
    assert speedup_figure(0.026, (0.023, 0.031)) == "0.026x [0.023, 0.031]"
    assert speedup_figure(0.0063, (0.0042, 0.0064)) == "0.0063x [0.0042, 0.0064]"  # not 0.00
    assert speedup_figure(0.5) == "0.50x"
    assert speedup_text({"speedup": 0.0063, "speedup_ci": [0.0042, 0.0064], "noisy": "x"}) == (
        "0.0063x [0.0042, 0.0064] *noisy*")


def test_the_table_shows_each_p50_beside_its_base_and_marks_busy_trials(
        registry: Registry) -> None:
    """A lower p50 beside a lower speed-up read as a contradiction: trials are timed at
    different moments, so each p50 stands beside the base p50 timed with it; a trial
    timed on a busy machine is marked, and a busy route left unconfirmed is named
    (issue 39, kind 8)."""
    from rich.console import Console

    from routetune.display import accurate_table
    from routetune.timing.measure import Latency, Speedup

    def lat(p50: float) -> Latency:
        return Latency(n=30, p50=p50, p90=p50, p99=p50, mean=p50, ci_low=p50, ci_high=p50)

    slow_base = Trial("f", "m", "fp16", "onnxruntime", "cpu", "s", "ok", latency=lat(2.0),
                      base_latency=lat(4.82), paired=Speedup(2.41, 2.3, 2.5, 30, 0.02),
                      noisy="other processes used 1.2 of 2 CPU cores")
    quiet = Trial("f", "m", "ort-threads", "onnxruntime", "cpu", "s", "ok",
                  latency=lat(1.5), base_latency=lat(1.38),
                  paired=Speedup(0.92, 0.9, 0.94, 30, 0.02))
    base = Trial("f", "m", "base", "onnxruntime", "cpu", "s", "ok", latency=lat(1.4),
                 base_latency=lat(1.4))
    console = Console(width=100, record=True, color_system=None)
    console.print(accurate_table([base, slow_base, quiet], base, registry, width=100))
    text = console.export_text()
    assert "p50 / base p50 ms" in text
    assert "2.000 / 4.820" in text and "1.500 / 1.380" in text
    assert "2.41x [2.30, 2.50] noisy" in text and "0.92x [0.90, 0.94] noisy" not in text


def test_a_confirmations_p50s_say_which_loop_they_come_from() -> None:
    from routetune.display import loop_of
    from routetune.records.trial import Confirmation
    from routetune.timing.measure import Latency, Speedup, across_repeats

    lat = Latency(n=30, p50=1.24, p90=1.3, p99=1.4, mean=1.25, ci_low=1.2, ci_high=1.3)
    loops = (Speedup(2.1, 2.0, 2.2, 11, 0.01), Speedup(2.0, 1.9, 2.1, 10, 0.01),
             Speedup(2.3, 2.1, 2.8, 12, 0.02))
    one = Confirmation("ort-cuda-graph", lat, lat, loops[0], {})
    assert loop_of(one) == "its confirmation loop"
    three = Confirmation("ort-cuda-graph", lat, lat, across_repeats(list(loops)), {},
                         repeats=loops)
    assert loop_of(three) == "the median by speed-up of its 3 fresh-process loops"
    assert three.paired.pairs == 33  # the pairs of all three loops: "over 3 processes"
