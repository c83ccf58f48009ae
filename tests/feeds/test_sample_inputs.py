"""routetune.feeds.sample_inputs: shapes, determinism, and realism through the real models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from routetune.feeds import sample_audio as sa
from routetune.feeds import sample_inputs as si

# ------------------------------------------------------------------- shapes, determinism


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (si.det_inputs, (2, 3, 160, 224)),
        (si.rec_inputs, (3, 3, 48, 320)),
        (si.cls_inputs, (2, 3, 48, 192)),
    ],
)
def test_image_inputs_shape_dtype_range(make, shape) -> None:
    sets = make(shape, seed=1, count=3)
    assert len(sets) == 3
    for inputs in sets:
        assert list(inputs) == ["x"]
        assert inputs["x"].shape == shape and inputs["x"].dtype == np.float32
        assert inputs["x"].flags.c_contiguous
    if make is not si.det_inputs:
        x = np.stack([s["x"] for s in sets])
        assert x.min() >= -1.0 and x.max() <= 1.0


@pytest.mark.parametrize("make", [si.det_inputs, si.rec_inputs, si.cls_inputs])
def test_image_inputs_reject_bad_shape(make) -> None:
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\)"):
        make((1, 1, 48, 320))


@pytest.mark.parametrize("make", [si.det_inputs, si.rec_inputs, si.cls_inputs, sa.vad_inputs])
def test_same_seed_same_arrays(make) -> None:
    shape = (128, 576) if make is sa.vad_inputs else (1, 3, 48, 192)
    a, b, c = make(shape, 5, 3), make(shape, 5, 3), make(shape, 6, 3)
    for x, y in zip(a, b, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert not np.array_equal(a[0][next(iter(a[0]))], c[0][next(iter(c[0]))])
    # The sets within one call differ from each other.
    assert not np.array_equal(a[0][next(iter(a[0]))], a[1][next(iter(a[1]))])


def test_det_normalisation_matches_paddleocr() -> None:
    from PIL import Image

    white = si.normalize_det(Image.new("RGB", (4, 2), (255, 255, 255)))
    expected = (1.0 - np.asarray(si.DET_MEAN)) / np.asarray(si.DET_STD)
    np.testing.assert_allclose(white[:, 0, 0], expected, rtol=1e-6)
    assert white.shape == (3, 2, 4) and white.dtype == np.float32


def test_rec_resize_keeps_aspect_and_pads_with_zero() -> None:
    from PIL import Image

    img = Image.new("RGB", (100, 24), (255, 255, 255))  # ratio 4.2 -> 200 wide at height 48
    out = si.resize_norm_rec(img, 48, 320)
    assert out.shape == (3, 48, 320) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, :, :200], 1.0)
    np.testing.assert_array_equal(out[:, :, 200:], 0.0)


def test_text_lines_flip_every_second_line() -> None:
    lines = si.text_lines(0, 6, 192 / 48, flip_every=2)
    assert [line.flipped for line in lines] == [False, True] * 3
    assert all(line.text and line.text.isascii() for line in lines)


def test_vad_inputs_shape_and_state() -> None:
    (inputs,) = sa.vad_inputs((64, 576), seed=0, count=1)
    assert inputs["input"].shape == (64, 576) and inputs["input"].dtype == np.float32
    assert np.abs(inputs["input"]).max() <= 1.0
    for key in ("h", "c"):
        assert inputs[key].shape == (1, 1, 128) and inputs[key].dtype == np.float32
        assert not inputs[key].any()
    with pytest.raises(ValueError, match="576"):
        sa.vad_inputs((64, 512))


def test_vad_frames_carry_64_samples_of_context() -> None:
    audio = np.arange(3 * 512 + 100, dtype=np.float32)
    frames = sa.vad_frames(audio)
    assert frames.shape == (4, 576)
    np.testing.assert_array_equal(frames[0, :64], 0.0)
    np.testing.assert_array_equal(frames[0, 64:], audio[:512])
    for k in range(1, 4):
        np.testing.assert_array_equal(frames[k, :64], frames[k - 1, -64:])
    np.testing.assert_array_equal(frames[3, 64 + 100 :], 0.0)  # zero-padded last frame


def test_speech_audio_alternates_voiced_and_silence() -> None:
    audio, voiced = sa.speech_audio(0, 5 * sa.VAD_RATE)
    assert audio.dtype == np.float32 and voiced.dtype == bool
    assert 0.2 < voiced.mean() < 0.8
    rms_voiced = np.sqrt(np.mean(audio[voiced] ** 2))
    rms_silence = np.sqrt(np.mean(audio[~voiced] ** 2))
    assert rms_voiced > 30 * rms_silence


# ----------------------------------------------------- realism through the real models


def test_detector_finds_text(session) -> None:  # noqa: F811
    det = session("ppocr-det")
    sets = si.det_inputs((1, 3, 320, 320), 0, 6)
    fractions = [float((det.run(None, s)[0] > 0.3).mean()) for s in sets]
    rng = np.random.default_rng(0)
    noise = {"x": rng.normal(0, 1, (1, 3, 320, 320)).astype(np.float32)}
    noise_fraction = float((det.run(None, noise)[0] > 0.3).mean())
    assert min(fractions) > 0.01, fractions
    assert np.mean(fractions) > 10 * noise_fraction + 0.02, (fractions, noise_fraction)


def _ctc_decode(probs: np.ndarray, chars: list[str]) -> str:
    best = probs.argmax(-1)
    keep = [i for t, i in enumerate(best) if i != 0 and (t == 0 or best[t - 1] != i)]
    return "".join(chars[i] for i in keep)


def test_recogniser_reads_the_rendered_text(session, model_path) -> None:  # noqa: F811
    rec = session("ppocr-rec")
    meta = {p.key: p.value for p in onnx.load(str(model_path("ppocr-rec"))).metadata_props}
    chars = ["<blank>", *meta["character"].splitlines(), " "]  # PaddleOCR: blank first, space last
    assert len(chars) == 6625
    shape, n = (1, 3, 48, 320), 12
    truth = si.text_lines(0, n, shape[3] / shape[2])
    outputs = [rec.run(None, s)[0][0] for s in si.rec_inputs(shape, 0, n)]
    nonblank = [float((o.argmax(-1) != 0).mean()) for o in outputs]
    assert min(nonblank) > 0 and max(nonblank) >= 0.25, nonblank
    read = [_ctc_decode(o, chars) for o in outputs]
    same = [r.replace(" ", "") == t.text.replace(" ", "") for r, t in zip(read, truth, strict=True)]
    assert np.mean(same) >= 0.75, list(zip(read, [t.text for t in truth], strict=True))


def test_classifier_is_confident_and_sees_both_directions(session) -> None:  # noqa: F811
    cls = session("ppocr-cls")
    shape, n = (1, 3, 48, 192), 12
    truth = [line.flipped for line in si.text_lines(0, n, shape[3] / shape[2], flip_every=2)]
    probs = np.concatenate([cls.run(None, s)[0] for s in si.cls_inputs(shape, 0, n)])
    predicted = probs.argmax(-1) == 1  # class 1 is "180"
    assert set(predicted.tolist()) == {False, True}
    assert np.mean(probs.max(-1) > 0.9) >= 0.9, probs
    assert np.mean(predicted == np.asarray(truth)) >= 0.9


def test_vad_is_higher_on_voiced_frames(session) -> None:  # noqa: F811
    vad = session("silero-vad")
    seed, frames = 0, 128
    voiced_p, silent_p = [], []
    for i, inputs in enumerate(sa.vad_inputs((frames, 576), seed, 4)):
        _, voiced = sa.speech_audio(seed * 1000 + i, frames * sa.VAD_FRAME)
        mask = voiced.reshape(frames, sa.VAD_FRAME)
        probs = vad.run(None, inputs)[0]
        voiced_p.extend(probs[mask.all(1)])
        silent_p.extend(probs[~mask.any(1)])
    assert np.mean(voiced_p) > 0.6 and np.mean(silent_p) < 0.2
    assert np.mean(voiced_p) - np.mean(silent_p) > 0.5
