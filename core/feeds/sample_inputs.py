"""Realistic validation inputs, made locally: rendered text for OCR.

Speech for VAD is in `routetune.feeds.sample_audio`.

Accuracy figures on random noise say nothing: the PP-OCRv4 detector answers noise with an
all-zero probability map, so any candidate looks "exact". These generators make inputs that
the real models respond to, with no download:

- OCR: lines of words and numbers rendered with Pillow's built-in scalable font on plain,
  gradient, noisy and textured backgrounds, then put through PaddleOCR's own preprocessing.
- VAD (`routetune.feeds.sample_audio`): vowel-like voiced segments (harmonics of a gliding
  fundamental, shaped by formants and a syllable envelope) separated by silence and low
  noise, at 16 kHz.

Every generator is deterministic: the same ``seed`` gives bit-identical arrays. Every array
is float32 and every image tensor is NCHW.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

InputSet = dict[str, np.ndarray]

#: Words drawn on the OCR images (plus generated numbers, prices, dates and codes).
WORDS: tuple[str, ...] = (
    "the", "and", "total", "price", "order", "invoice", "date", "name", "street", "road",
    "city", "open", "close", "today", "model", "speed", "paper", "water", "coffee", "green",
    "light", "north", "south", "station", "exit", "entry", "ticket", "amount", "balance",
    "account", "number", "phone", "email", "report", "summary", "table", "page", "chapter",
    "Monday", "Friday", "March", "October", "London", "Berlin", "Paris", "Tokyo", "Hotel",
    "Market", "Bank", "Cafe", "Museum", "Garden", "Route", "Engine", "Server", "Delta",
    "Total", "Receipt", "Welcome", "STOP", "SALE", "OPEN", "INFO", "TAXI", "PARKING",
)

#: Detector normalisation, applied after scaling pixels to [0, 1]. Source: PaddleOCR
#: ``NormalizeImage`` (ppocr/data/imaug/operators.py) with the values of the det configs
#: (configs/det/ch_PP-OCRv4/*.yml); PaddleOCR applies them to OpenCV's BGR channel order.
DET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
DET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def _rngs(seed: int) -> tuple[np.random.Generator, random.Random]:
    return np.random.default_rng(seed), random.Random(seed)


# ----------------------------------------------------------------------------- OCR


def random_text(rnd: random.Random, max_words: int = 4) -> str:
    """Return a line of 1..``max_words`` words, numbers, prices, dates or codes.

    Args:
        rnd: The random source.
        max_words: The most tokens on the line.

    Returns:
        The line, ASCII only (every character is in the PP-OCRv4 recogniser's dictionary).
    """
    tokens = []
    for _ in range(rnd.randint(1, max_words)):
        kind = rnd.random()
        if kind < 0.65:
            tokens.append(rnd.choice(WORDS))
        elif kind < 0.75:
            tokens.append(str(rnd.randint(0, 9999)))
        elif kind < 0.85:
            tokens.append(f"{rnd.randint(1, 999)}.{rnd.randint(0, 99):02d}")
        elif kind < 0.93:
            year, month, day = rnd.randint(2000, 2030), rnd.randint(1, 12), rnd.randint(1, 28)
            tokens.append(f"{year}-{month:02d}-{day:02d}")
        else:
            tokens.append(f"{rnd.choice('ABCDEFGHKLMNPRSTXZ')}{rnd.randint(10, 999)}")
    return " ".join(tokens)


def _background(
    rng: np.random.Generator, rnd: random.Random, width: int, height: int
) -> np.ndarray:
    """Return an HxWx3 float image in [0, 255]: plain, gradient, noisy or textured."""
    kind = rnd.choice(("plain", "gradient", "noise", "texture"))
    base = rng.uniform(150, 255, size=3) if rnd.random() < 0.8 else rng.uniform(0, 90, size=3)
    img = np.broadcast_to(base, (height, width, 3)).astype(np.float64)
    if kind == "gradient":
        other = np.clip(base + rng.uniform(-70, 70, size=3), 0, 255)
        angle = rng.uniform(0, math.pi)
        yy, xx = np.mgrid[0:height, 0:width]
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = (t - t.min()) / max(float(np.ptp(t)), 1.0)
        img = img * (1 - t[..., None]) + other * t[..., None]
    elif kind == "noise":
        img = img + rng.normal(0, rng.uniform(4, 14), size=(height, width, 1))
    elif kind == "texture":
        # Paper-like: low-frequency blotches plus fine grain and faint ruled lines.
        coarse = rng.normal(0, 1, size=(height // 16 + 2, width // 16 + 2))
        blotch = np.asarray(
            Image.fromarray(coarse.astype(np.float32)).resize(
                (width, height), Image.Resampling.BICUBIC)
        )
        img = img + 12 * blotch[..., None] + rng.normal(0, 4, size=(height, width, 1))
        step = rnd.randint(18, 40)
        img[rnd.randint(0, step - 1) :: step, :, :] -= rng.uniform(15, 35)
    return np.clip(img, 0, 255)


def _ink(rng: np.random.Generator, background: np.ndarray) -> tuple[int, int, int]:
    """Pick a text colour that contrasts with the mean of ``background``."""
    light = float(background.mean()) > 127
    lo, hi = (0, 80) if light else (190, 255)
    tint = rng.uniform(lo, hi, size=3)
    return tuple(int(v) for v in tint)  # type: ignore[return-value]


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def det_image(rng: np.random.Generator, rnd: random.Random, height: int, width: int) -> Image.Image:
    """Render a detector scene: up to 7 lines of text at random positions, sizes and colours.

    Args:
        rng: The numpy random source (backgrounds, colours).
        rnd: The Python random source (words, layout).
        height: Image height in pixels.
        width: Image width in pixels.

    Returns:
        An RGB image of ``width`` x ``height`` pixels.
    """
    background = _background(rng, rnd, width, height)
    img = Image.fromarray(background.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    y = rnd.randint(2, max(3, height // 10))
    for _ in range(rnd.randint(3, 7)):
        size = rnd.randint(max(10, height // 24), max(14, height // 9))
        font = _font(size)
        text = random_text(rnd)
        left, top, right, bottom = map(int, draw.textbbox((0, 0), text, font=font))
        while right - left > width - 8 and " " in text:
            text = text.rsplit(" ", 1)[0]
            left, top, right, bottom = map(int, draw.textbbox((0, 0), text, font=font))
        if y + bottom > height - 2:
            break
        x = rnd.randint(2, max(2, width - 2 - (right - left)))
        region = background[y : y + bottom, x : x + right]
        draw.text((x - left, y), text, font=font, fill=_ink(rng, region))
        y += bottom + rnd.randint(size // 4, size)
    if rnd.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rnd.uniform(0.3, 0.9)))
    return img


def normalize_det(img: Image.Image) -> np.ndarray:
    """Apply PaddleOCR's detector preprocessing to an RGB image.

    Converts to BGR channel order (PaddleOCR reads images with OpenCV), scales to [0, 1],
    subtracts :data:`DET_MEAN` and divides by :data:`DET_STD` per channel, and moves
    channels first.

    Args:
        img: An RGB image of H x W pixels.

    Returns:
        A float32 array of shape (3, H, W).
    """
    bgr = np.asarray(img.convert("RGB"), dtype=np.float32)[..., ::-1] / 255.0
    mean = np.asarray(DET_MEAN, dtype=np.float32)
    std = np.asarray(DET_STD, dtype=np.float32)
    return np.ascontiguousarray(((bgr - mean) / std).transpose(2, 0, 1), dtype=np.float32)


@dataclass(frozen=True)
class TextLine:
    """One rendered text line, with its ground truth.

    Args:
        image: The tight crop of the line (RGB), before resizing.
        text: The text drawn, as it reads in the upright image.
        flipped: True when ``image`` was rotated by 180 degrees.
    """

    image: Image.Image
    text: str
    flipped: bool


def text_line(rng: np.random.Generator, rnd: random.Random, max_ratio: float) -> TextLine:
    """Render one line of text on a background, cropped with a small margin.

    Args:
        rng: The numpy random source.
        rnd: The Python random source.
        max_ratio: The widest width/height ratio allowed; words are dropped until the crop
            fits, so the recogniser's input does not squeeze the text.

    Returns:
        The upright line (``flipped`` is False).
    """
    size = rnd.randint(22, 44)
    font = _font(size)
    text = random_text(rnd, max_words=3)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    while True:
        left, top, right, bottom = map(int, probe.textbbox((0, 0), text, font=font))
        mx, my = rnd.randint(2, size // 3), rnd.randint(2, size // 4)
        width, height = right - left + 2 * mx, bottom - top + 2 * my
        if width / height <= max_ratio or len(text) <= 2:
            break
        text = text.rsplit(" ", 1)[0] if " " in text else text[: len(text) * 3 // 4]
    background = _background(rng, rnd, width, height)
    img = Image.fromarray(background.astype(np.uint8), "RGB")
    ImageDraw.Draw(img).text((mx - left, my - top), text, font=font, fill=_ink(rng, background))
    if rnd.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rnd.uniform(0.3, 0.8)))
    return TextLine(img, text, False)


def resize_norm_rec(img: Image.Image, height: int, width: int) -> np.ndarray:
    """Apply PaddleOCR's recogniser/classifier preprocessing (``resize_norm_img``).

    Resizes to ``height`` keeping the aspect ratio (width ``min(width, ceil(height * w/h))``),
    scales to [-1, 1] with ``(x / 255 - 0.5) / 0.5``, and right-pads with zeros to ``width``.
    Source: ``resize_norm_img`` in PaddleOCR tools/infer/predict_rec.py and predict_cls.py.

    Args:
        img: An RGB image.
        height: The model's input height in pixels (48 for PP-OCR).
        width: The model's input width in pixels.

    Returns:
        A float32 array of shape (3, height, width), in BGR channel order like PaddleOCR.
    """
    w, h = img.size
    new_w = min(width, max(1, math.ceil(height * w / h)))
    resized = np.asarray(img.convert("RGB").resize((new_w, height), Image.Resampling.BILINEAR))
    chw = (resized[..., ::-1].astype(np.float32) / 255.0 - 0.5) / 0.5
    out = np.zeros((3, height, width), dtype=np.float32)
    out[:, :, :new_w] = chw.transpose(2, 0, 1)
    return out


def _check_image_shape(shape: Sequence[int]) -> tuple[int, int, int]:
    if len(shape) != 4 or shape[1] != 3 or min(shape) < 1:
        raise ValueError(f"expected an image shape (N, 3, H, W), got {tuple(shape)}")
    return int(shape[0]), int(shape[2]), int(shape[3])


def det_inputs(shape: Sequence[int], seed: int = 0, count: int = 4) -> list[InputSet]:
    """Make detector inputs: scenes of several text lines, normalised like PaddleOCR.

    Args:
        shape: The input shape (N, 3, H, W), e.g. (1, 3, 320, 320).
        seed: The random seed.
        count: The number of input sets.

    Returns:
        ``count`` dicts ``{"x": float32 array of shape (N, 3, H, W)}``, values roughly in
        [-2.1, 2.7] (ImageNet-normalised pixels).

    Raises:
        ValueError: ``shape`` is not (N, 3, H, W).
    """
    n, height, width = _check_image_shape(shape)
    rng, rnd = _rngs(seed)
    return [
        {"x": np.stack([normalize_det(det_image(rng, rnd, height, width)) for _ in range(n)])}
        for _ in range(count)
    ]


def text_lines(seed: int, count: int, max_ratio: float, flip_every: int = 0) -> list[TextLine]:
    """Render ``count`` single text lines, the ground truth of :func:`rec_inputs`.

    Args:
        seed: The random seed.
        count: The number of lines.
        max_ratio: The widest width/height ratio allowed (input width / height).
        flip_every: When > 0, every line whose index is odd is rotated by 180 degrees
            (so both classes of the direction classifier occur); 0 keeps all upright.

    Returns:
        The lines, in order.
    """
    rng, rnd = _rngs(seed)
    lines = []
    for i in range(count):
        line = text_line(rng, rnd, max_ratio)
        if flip_every and i % 2 == 1:
            line = TextLine(line.image.rotate(180), line.text, True)
        lines.append(line)
    return lines


def _line_inputs(shape: Sequence[int], seed: int, count: int, flip: bool) -> list[InputSet]:
    n, height, width = _check_image_shape(shape)
    lines = text_lines(seed, n * count, width / height, flip_every=2 if flip else 0)
    arrays = [resize_norm_rec(line.image, height, width) for line in lines]
    return [{"x": np.stack(arrays[i * n : (i + 1) * n])} for i in range(count)]


def rec_inputs(shape: Sequence[int], seed: int = 0, count: int = 4) -> list[InputSet]:
    """Make recogniser inputs: one upright text line per image, preprocessed like PaddleOCR.

    Args:
        shape: The input shape (N, 3, 48, W), e.g. (1, 3, 48, 320).
        seed: The random seed.
        count: The number of input sets.

    Returns:
        ``count`` dicts ``{"x": float32 array of shape (N, 3, 48, W)}`` in [-1, 1]; the
        padding on the right is 0. ``text_lines(seed, N * count, W / 48)`` gives the texts.

    Raises:
        ValueError: ``shape`` is not (N, 3, H, W).
    """
    return _line_inputs(shape, seed, count, flip=False)


def cls_inputs(shape: Sequence[int], seed: int = 0, count: int = 4) -> list[InputSet]:
    """Make direction-classifier inputs: text lines, every second one rotated by 180°.

    Args:
        shape: The input shape (N, 3, 48, W), e.g. (1, 3, 48, 192).
        seed: The random seed.
        count: The number of input sets.

    Returns:
        ``count`` dicts ``{"x": float32 array of shape (N, 3, 48, W)}`` in [-1, 1]. Image
        ``k`` (counting across sets) is upside down when ``k`` is odd, so both classes
        (0° and 180°) occur in every two images.

    Raises:
        ValueError: ``shape`` is not (N, 3, H, W).
    """
    return _line_inputs(shape, seed, count, flip=True)


# ----------------------------------------------------------------------------- VAD

# Formant frequencies (F1, F2, F3) in Hz of a few vowels, adult speaker averages
# (Peterson & Barney, 1952).
_VOWELS: tuple[tuple[float, float, float], ...] = (
    (730, 1090, 2440),  # a
    (270, 2290, 3010),  # i
    (300, 870, 2240),  # u
    (530, 1840, 2480),  # e
    (570, 840, 2410),  # o
)


