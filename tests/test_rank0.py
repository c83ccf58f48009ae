"""Rank-0 (scalar) and zero-size inputs on every shape path (real-models issue, kind 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from command import routetune as cli
from graphs import scaled
from quick import QUICK_FLAGS, quick_spec

from routetune.feeds.examples import Example, fetch_example
from routetune.feeds.inputs import parse_shapes, synthesize
from routetune.feeds.profile import make_profile
from routetune.feeds.sample_audio import VAD_FRAME, VAD_RATE, speech_audio
from routetune.model.loading import prepare
from routetune.registry import Registry
from routetune.run.tuning import tune


def test_shape_texts_take_scalars_and_empty_sizes() -> None:
    assert parse_shapes("x:1x512,sr:") == {"x": (1, 512), "sr": ()}
    assert parse_shapes("x:0x4") == {"x": (0, 4)}


def test_the_profile_from_inputs_spans_a_scalar_input(tmp_path: Path) -> None:
    model = prepare(scaled(tmp_path / "m.onnx"))
    feeds = [{"x": np.ones((n, 16), np.float32), "t": np.array(0.5, np.float32)}
             for n in (2, 5)]
    profile = make_profile(model.inputs, {"x": (2, 16), "t": ()}, feeds=feeds)
    assert profile.shapes == {"x": ((2, 16), (2, 16), (5, 16))}
    sets = synthesize(model.inputs, {"x": (3, 16), "t": ()})
    assert sets[0]["t"].shape == () and isinstance(sets[0]["t"], np.ndarray)


@pytest.mark.slow
def test_a_scalar_input_given_through_inputs_shapes_or_a_recipe_tunes(
        registry: Registry, tmp_path: Path) -> None:
    model = scaled(tmp_path / "m.onnx")
    data = tmp_path / "sets"
    data.mkdir()
    for i, n in enumerate((4, 4, 6)):
        np.savez(data / f"{i}.npz", x=np.full((n, 16), 0.1 * i, np.float32),
                 t=np.array(0.25 * (i + 1), np.float32))
    result = tune(quick_spec(model=model, inputs=data, output=tmp_path / "a",
                             seasonings=("ort-no-spinning",)), registry)
    assert result.base.status == "ok", result.base.reason
    flags = cli("tune", str(model), "--shapes", "x:4x16,t:", "--seasonings",
                "ort-no-spinning", *QUICK_FLAGS, "--output", str(tmp_path / "b"))
    assert flags.returncode == 0, flags.stderr
    run = json.loads((tmp_path / "b" / "run.json").read_text())
    assert run["given"]["shapes"] == "x:4x16,t:"
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'schema_version = 2\n[model]\npath = "{model}"\n[inputs]\n'
                      'shapes = "x:2x16,t:"\n[search]\nmax_depth = 0\n')
    from_recipe = cli("tune", "--recipe", str(recipe), "--output", str(tmp_path / "c"),
                      *QUICK_FLAGS)
    assert from_recipe.returncode == 0, from_recipe.stderr
    assert "Traceback" not in flags.stderr + from_recipe.stderr


SILERO_STEP = Example(
    name="silero-vad-step", summary="Silero VAD 16 kHz, one 512-sample step with sr",
    package="silero-vad", version="6.2.3", member="silero_vad/data/silero_vad.onnx",
    sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", shapes={},
    make_inputs=lambda shapes, seed, count: [])


@pytest.mark.slow
def test_silero_vads_single_step_model_tunes_on_its_real_sample_rate(
        registry: Registry, model_cache: Path, tmp_path: Path) -> None:
    try:
        model = fetch_example(SILERO_STEP, model_cache)
    except Exception as e:  # no network: say why
        pytest.skip(f"cannot fetch silero-vad from PyPI: {e}")
    spec = {s.name: s for s in prepare(model).inputs}
    assert spec["sr"].shape == () and spec["sr"].dtype == np.int64  # silero-vad#208
    audio, _ = speech_audio(seed=1, n_samples=8 * VAD_FRAME)
    data = tmp_path / "sets"
    data.mkdir()
    for i in range(8):  # consecutive speech-like frames, the state carried as zeros
        np.savez(data / f"{i}.npz", input=audio[None, i * VAD_FRAME:(i + 1) * VAD_FRAME]
                 .astype(np.float32), state=np.zeros((2, 1, 128), np.float32),
                 sr=np.array(VAD_RATE, np.int64))
    result = tune(quick_spec(model=model, inputs=data, output=tmp_path / "out",
                             seasonings=("fold-constants", "ort-threads"), max_depth=1),
                  registry)
    assert result.base.status == "ok", result.base.reason
    assert result.winner.status == "ok"
    # fold-constants inlines the decoder's nested If, whose condition folds to a constant
    # and whose taken branch returns a constant: the model stays valid and accurate
    folded = [t for t in result.trials if t.route.startswith("fold-constants")]
    assert folded and all(t.status == "ok" for t in folded), [(t.route, t.reason)
                                                             for t in folded]
