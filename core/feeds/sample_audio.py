"""Realistic validation inputs for voice-activity detectors: synthetic speech at 16 kHz.

Voiced segments (a glottal pulse train through formant resonances) between pauses of
noise, cut into the frames, context and state a Silero-style VAD takes (`vad_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from routetune.feeds.sample_inputs import _VOWELS, InputSet

#: Silero VAD at 16 kHz reads 512-sample frames (32 ms), each prefixed with the last 64
#: samples of the previous frame: 576 = 64 + 512. Source: ``RATE_CONFIG`` and
#: ``frame_blocks`` in silero_vad/sequence_vad.py (silero-vad 6.2.3).
VAD_RATE = 16_000


VAD_FRAME = 512


VAD_CONTEXT = 64


VAD_STATE = (1, 1, 128)


def _voiced_segment(rng: np.random.Generator, n: int) -> np.ndarray:
    """Return ``n`` samples of vowel-like speech: formant-shaped harmonics, 3–6 syllables/s."""
    t = np.arange(n) / VAD_RATE
    f0_start, f0_end = rng.uniform(100, 250, size=2)
    f0 = np.linspace(f0_start, f0_end, n) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(3, 6) * t))
    phase = 2 * np.pi * np.cumsum(f0) / VAD_RATE
    syllable_rate = rng.uniform(3, 6)
    vowel_index = (t * syllable_rate).astype(int)
    formants = np.asarray(_VOWELS)[rng.integers(0, len(_VOWELS), size=vowel_index.max() + 1)]
    formants = formants[vowel_index]  # (n, 3)
    signal = np.zeros(n)
    for k in range(1, int(4000 / 100) + 1):
        freq = k * f0
        gain = sum(
            1.0 / (1.0 + ((freq - formants[:, j]) / (60 + 40 * j)) ** 2) / (j + 1) for j in range(3)
        )
        gain = np.where(freq < VAD_RATE / 2 - 500, gain, 0.0)
        signal += gain * np.sin(k * phase) / k**0.5
    syllable = np.sin(np.pi * ((t * syllable_rate) % 1.0)) ** 0.6
    edges = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.03)
    signal *= syllable * edges
    signal += 0.02 * rng.normal(size=n) * syllable  # breath / fricative noise
    return signal / max(float(np.abs(signal).max()), 1e-9)


def speech_audio(seed: int, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Make synthetic speech-like audio at 16 kHz and mark where it is voiced.

    Alternates silence-with-low-noise (0.3–1.2 s, noise RMS ~ -60..-50 dBFS) and voiced
    segments (0.4–1.5 s, peak 0.1–0.6 full scale).

    Args:
        seed: The random seed.
        n_samples: The length in samples (16 000 per second).

    Returns:
        ``(audio, voiced)``: float32 samples in [-1, 1] of shape (n_samples,), and a bool
        mask of the same shape, True inside voiced segments.
    """
    rng = np.random.default_rng(seed)
    audio = rng.normal(0, 1, size=n_samples) * 10 ** (rng.uniform(-60, -50) / 20)
    voiced = np.zeros(n_samples, dtype=bool)
    pos = int(rng.uniform(0.3, 1.0) * VAD_RATE)
    while pos < n_samples:
        length = min(int(rng.uniform(0.4, 1.5) * VAD_RATE), n_samples - pos)
        if length > VAD_RATE // 10:
            audio[pos : pos + length] += rng.uniform(0.1, 0.6) * _voiced_segment(rng, length)
            voiced[pos : pos + length] = True
        pos += length + int(rng.uniform(0.3, 1.2) * VAD_RATE)
    return np.clip(audio, -1, 1).astype(np.float32), voiced


def vad_frames(audio: np.ndarray) -> np.ndarray:
    """Frame audio the way Silero VAD's sequence model expects.

    Splits into 512-sample frames (the last zero-padded) and prefixes each with the last
    64 samples of the previous frame (zeros for the first). Source: ``frame_blocks`` in
    silero_vad/sequence_vad.py.

    Args:
        audio: float32 samples at 16 kHz, shape (n,).

    Returns:
        A float32 array of shape (ceil(n / 512), 576).
    """
    n_frames = max(1, -(-audio.size // VAD_FRAME))
    frames = np.zeros((n_frames, VAD_FRAME), dtype=np.float32)
    frames.reshape(-1)[: audio.size] = audio
    context = np.zeros((n_frames, VAD_CONTEXT), dtype=np.float32)
    context[1:] = frames[:-1, -VAD_CONTEXT:]
    return np.concatenate([context, frames], axis=1)


def vad_inputs(shape: Sequence[int], seed: int = 0, count: int = 4) -> list[InputSet]:
    """Make Silero VAD sequence-model inputs from synthetic speech.

    Args:
        shape: The ``input`` shape (frames, 576); e.g. (128, 576) is 4.1 s of audio.
        seed: The random seed; input set ``i`` uses audio of seed ``seed * 1000 + i``.
        count: The number of input sets.

    Returns:
        ``count`` dicts with ``input`` (float32, (frames, 576), samples in [-1, 1]), and the
        LSTM state ``h`` and ``c`` (float32 zeros of shape (1, 1, 128), the start state
        ``SileroVADSequence.audio_forward`` uses).

    Raises:
        ValueError: ``shape`` is not (frames, 576).
    """
    if len(shape) != 2 or shape[1] != VAD_CONTEXT + VAD_FRAME or shape[0] < 1:
        raise ValueError(f"expected a VAD input shape (frames, 576), got {tuple(shape)}")
    sets = []
    for i in range(count):
        audio, _ = speech_audio(seed * 1000 + i, int(shape[0]) * VAD_FRAME)
        sets.append(
            {
                "input": vad_frames(audio),
                "h": np.zeros(VAD_STATE, dtype=np.float32),
                "c": np.zeros(VAD_STATE, dtype=np.float32),
            }
        )
    return sets
