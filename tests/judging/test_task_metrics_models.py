"""Task metrics on the real example models, run by ONNX Runtime, with known answers.

The examples' own validation inputs (`routetune.feeds.examples`, rendered text and
synthetic speech) go through the real PP-OCR and Silero VAD models; a candidate whose
answer changes on known samples gives a known rate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from routetune.feeds import sample_inputs
from routetune.feeds.examples import examples, load_inputs
from routetune.judging.accuracy import check_accuracy, check_outputs, parse_accuracy
from routetune.judging.task_metrics import TASK_METRICS, ctc_greedy
from routetune.model.loading import prepare
from routetune.registry import Registry

METRICS = {m.name: m for m in TASK_METRICS}
Run = Callable[[str, list[dict[str, np.ndarray]], bool], list[list[np.ndarray]]]


@pytest.fixture(scope="module")
def run(model_path: Callable[[str], Path]) -> Run:
    """``run(example, feeds, optimised)``: every output of every input set.

    Unoptimised is the reference's setting (ONNX Runtime's CPU provider, optimisations
    off); optimised fuses and reorders, so its floats differ slightly.
    """
    sessions: dict[tuple[str, bool], ort.InferenceSession] = {}

    def infer(name: str, feeds: list[dict[str, np.ndarray]], optimised: bool = False
              ) -> list[list[np.ndarray]]:
        if (name, optimised) not in sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            options.graph_optimization_level = (
                ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimised
                else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
            sessions[name, optimised] = ort.InferenceSession(
                str(model_path(name)), options, providers=["CPUExecutionProvider"])
        return [sessions[name, optimised].run(None, feed) for feed in feeds]

    return infer


def test_ppocr_rec_reads_the_rendered_lines_and_ctc_counts_lines_read_otherwise(
        run: Run, model_path: Callable[[str], Path]) -> None:
    feeds = load_inputs("ppocr-rec")
    assert len(feeds) == examples()["ppocr-rec"].count == 32
    lines = sample_inputs.text_lines(0, 32, 320 / 48)
    model = onnx.load(str(model_path("ppocr-rec")), load_external_data=False)
    keys = {p.key: p.value for p in model.metadata_props}["character"].split("\n")
    table = ["<blank>", *keys, " "]  # rapidocr's CTCLabelDecode: blank first, space last
    refs = [outs[0] for outs in run("ppocr-rec", feeds, False)]
    assert refs[0].shape == (1, 40, len(table))
    texts = ["".join(table[i] for i in ctc_greedy(r)[0]) for r in refs]
    read = sum(t.replace(" ", "") == line.text.replace(" ", "")
               for t, line in zip(texts, lines, strict=True))
    assert read >= 30, list(zip(texts, (line.text for line in lines), strict=True))
    ctc = METRICS["ctc"]
    optimised = [outs[0] for outs in run("ppocr-rec", feeds, True)]
    assert ctc.measure(optimised, refs) == 1.0  # fused kernels, the same text
    # two lines swapped: exactly those two read otherwise
    assert lines[3].text != lines[11].text
    swapped = list(refs)
    swapped[3], swapped[11] = refs[11], refs[3]
    assert ctc.measure(swapped, refs) == 30 / 32


def test_ppocr_cls_finds_every_direction_and_top1_counts_the_turned_lines(run: Run) -> None:
    feeds = load_inputs("ppocr-cls")
    lines = sample_inputs.text_lines(0, 64, 192 / 48, flip_every=2)
    refs = [outs[0] for outs in run("ppocr-cls", feeds, False)]
    assert [int(np.argmax(r)) for r in refs] == [int(line.flipped) for line in lines]
    # the first four lines turned by 180 degrees: the classifier's answer flips for them
    turned = [{"x": sample_inputs.resize_norm_rec(line.image.rotate(180), 48, 192)[None]}
              for line in lines[:4]]
    outs = [o[0] for o in run("ppocr-cls", turned, False)] + refs[4:]
    assert METRICS["top1"].measure(outs, refs) == 60 / 64
    assert METRICS["top1"].measure([o[0] for o in run("ppocr-cls", feeds, True)], refs) == 1.0


def test_ppocr_det_mask_iou_sees_a_scene_whose_text_is_gone(run: Run) -> None:
    feeds = load_inputs("ppocr-det")
    assert len(feeds) == examples()["ppocr-det"].count == 8
    refs = [outs[0] for outs in run("ppocr-det", feeds, False)]
    assert all((r > 0.3).mean() > 0.01 for r in refs)  # every scene has text regions
    mask_iou = METRICS["mask_iou"]
    assert mask_iou.measure([o[0] for o in run("ppocr-det", feeds, True)], refs) > 0.999
    x = feeds[2]["x"]  # scene 2 as its mean colour: no text, an empty map
    blank = {"x": np.broadcast_to(x.mean(axis=(2, 3), keepdims=True), x.shape).copy()}
    outs = list(refs)
    outs[2] = run("ppocr-det", [blank], False)[0][0]
    assert not (outs[2] > 0.3).any()
    assert mask_iou.measure(outs, refs) == 7 / 8


def test_silero_vad_task_constraint_holds_for_optimised_kernels(
        run: Run, registry: Registry, model_path: Callable[[str], Path]) -> None:
    example = examples()["silero-vad"]
    model = prepare(model_path("silero-vad"))
    names = [o.name for o in model.outputs]
    assert names == ["speech_probs", "hn", "cn"]
    constraint = parse_accuracy(example.accuracy or "", registry, names)
    check_outputs(constraint, registry, {o.name: o.shape for o in model.outputs})
    feeds = load_inputs("silero-vad")
    refs = [dict(zip(names, outs, strict=True)) for outs in run("silero-vad", feeds, False)]
    outs = [dict(zip(names, o, strict=True)) for o in run("silero-vad", feeds, True)]
    verdict = check_accuracy(constraint, registry, outs, refs)
    assert verdict.passed, verdict.reason
    assert verdict.metrics["speech_probs"]["prob_abs"] < 1e-4
    moved = [{**o, "speech_probs": o["speech_probs"] + 0.02} for o in outs]
    assert check_accuracy(constraint, registry, moved, refs).failures[0].startswith(
        "speech_probs: prob_abs 0.02")
