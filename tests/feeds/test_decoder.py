"""Decoders with a KV cache: the signature, the phases' input sets, bad decoders (issue 40)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from command import routetune
from graphs import conv_bn, kv_decoder
from quick import QUICK_FLAGS

from routetune.errors import UsageError
from routetune.feeds.decoder import (
    PREFILL_SETS,
    DecoderSettings,
    phase_of,
    phase_sets,
    read_tokens,
    signature,
)
from routetune.model.loading import prepare


def _signature(path: Path):  # noqa: ANN202
    model = prepare(path)
    return signature(model.inputs, model.outputs, path)


def _infer(path: Path):  # noqa: ANN202
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(None, feed), strict=True))


def test_the_signature_is_read_from_the_cache_inputs_and_outputs(tmp_path: Path) -> None:
    cache = _signature(kv_decoder(tmp_path / "d.onnx", layers=3, heads=4, head_dim=8))
    assert cache is not None
    assert (cache.layers, cache.heads, cache.head_dim, cache.vocab) == (3, 4, 8, 48)
    assert (cache.input_ids, cache.attention_mask, cache.position_ids) == (
        "input_ids", "attention_mask", None)
    assert cache.logits == "logits" and cache.cache_dtype == np.float32
    assert _signature(conv_bn(tmp_path / "c.onnx")) is None  # no cache: not a decoder


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"drop": ("past_key_values.1.value",)}, "needs past_key_values.1.value among its inputs"),
    ({"drop": ("present.0.key",)}, "input past_key_values.0.key has no output present.0.key"),
    ({"heads": (2, 4)}, "mismatched head counts (axis 1): past_key_values.0.key has 2, "
                        "past_key_values.1.key has 4"),
])
def test_a_decoder_whose_cache_cannot_be_used_is_named(
        tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=None) as e:
        _signature(kv_decoder(tmp_path / "d.onnx", **kwargs))  # type: ignore[arg-type]
    assert message in str(e.value)


def test_decode_sets_are_the_reference_s_own_greedy_steps(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx")
    cache, infer = _signature(path), _infer(path)
    settings = DecoderSettings(cache_tokens=10, generate_tokens=5)
    sets = phase_sets(cache, settings, infer)
    assert [s["past_key_values.0.key"].shape for s in sets] == [
        (1, 2, 10 + k, 8) for k in range(5)]
    assert all(s["input_ids"].shape == (1, 1) and s["input_ids"].dtype == np.int64
               for s in sets)
    assert [s["attention_mask"].shape for s in sets] == [(1, 11 + k) for k in range(5)]
    for here, after in zip(sets, sets[1:], strict=False):  # each step feeds the next
        out = infer(here)
        assert int(np.argmax(out["logits"][0, -1])) == int(after["input_ids"][0, 0])
        np.testing.assert_array_equal(out["present.1.value"], after["past_key_values.1.value"])
    first = np.random.default_rng(0).integers(0, 48, 10)  # the prompt: seeded ids
    prompt = {"input_ids": first[None], "attention_mask": np.ones((1, 10), np.int64),
              **{f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 8), np.float32)
                 for i in range(2) for kv in ("key", "value")}}
    np.testing.assert_array_equal(infer(prompt)["present.0.key"],
                                  sets[0]["past_key_values.0.key"])
    assert phase_of(cache, sets) == "decode"


def test_prefill_sets_are_prompts_against_an_empty_cache(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx")
    cache = _signature(path)
    sets = phase_sets(cache, DecoderSettings(objective="prefill", prompt_tokens=6),
                      _infer(path))
    assert len(sets) == PREFILL_SETS
    assert all(s["input_ids"].shape == (1, 6) and s["past_key_values.1.key"].shape == (1, 2, 0, 8)
               for s in sets)
    assert phase_of(cache, sets) == "prefill"
    assert phase_of(cache, sets + [{**sets[0], "past_key_values.0.key": np.zeros((1, 2, 3, 8))}]
                    ) is None  # a mix of phases times neither


def test_generate_sets_are_a_prompt_then_its_own_greedy_steps(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx")
    cache, infer = _signature(path), _infer(path)
    sets = phase_sets(cache, DecoderSettings(objective="generate", prompt_tokens=7,
                                             generate_tokens=4), infer)
    # the prompt's pass gives the first of 4 tokens, 3 decode steps the rest
    assert [s["input_ids"].shape[1] for s in sets] == [7, 1, 1, 1]
    assert [s["past_key_values.0.key"].shape[2] for s in sets] == [0, 7, 8, 9]
    for here, after in zip(sets, sets[1:], strict=False):
        out = infer(here)
        assert int(np.argmax(out["logits"][0, -1])) == int(after["input_ids"][0, 0])
        np.testing.assert_array_equal(out["present.0.value"], after["past_key_values.0.value"])
    assert phase_of(cache, sets) == "generate"
    assert phase_of(cache, [sets[0], sets[2]]) is None  # a step that does not follow
    with pytest.raises(UsageError, match=r"^--generate-tokens 1000000 at --prompt-tokens 7: "
                       r"the generate input sets' caches would take .* give fewer generated "
                       r"tokens or a smaller --prompt-tokens$"):
        phase_sets(cache, DecoderSettings(objective="generate", prompt_tokens=7,
                                          generate_tokens=10**6), infer)


def test_cache_position_is_filled_and_an_unknown_input_is_refused(tmp_path: Path) -> None:
    path = kv_decoder(tmp_path / "d.onnx", extra="cache_position")
    cache = _signature(path)
    sets = phase_sets(cache, DecoderSettings(cache_tokens=7, generate_tokens=3), _infer(path))
    assert [s["cache_position"].tolist() for s in sets] == [[7], [8], [9]]
    assert all(np.isfinite(_infer(path)(s)["logits"]).all() for s in sets)  # NaN if wrong
    other = kv_decoder(tmp_path / "o.onnx", extra="token_type_ids")
    with pytest.raises(UsageError, match="a decoder with the input token_type_ids: "
                       "routetune fills only input_ids, attention_mask, position_ids, "
                       "cache_position and the cache; give the input sets with --inputs"):
        phase_sets(_signature(other), DecoderSettings(), _infer(other))


def test_tokens_come_from_a_file(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("héllo")
    assert read_tokens(text).tolist() == list("héllo".encode())
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([[3, 1, 4, 1]], np.int32))  # a tokenizer's (1, T) ids
    assert read_tokens(ids).tolist() == [3, 1, 4, 1]
    np.save(ids, np.array([[3, 1], [4, 1]], np.int32))  # two sequences: which?
    with pytest.raises(UsageError, match=r"holds an array of shape 2x2; give one sequence"):
        read_tokens(ids)
    np.save(ids, np.array([5, -1]))
    with pytest.raises(UsageError, match="holds id -1; token ids are 0 or more"):
        read_tokens(ids)
    floats = tmp_path / "f.npy"
    np.save(floats, np.zeros(3))
    with pytest.raises(UsageError, match="holds float64, not integer token ids"):
        read_tokens(floats)
    path = kv_decoder(tmp_path / "d.onnx")
    cache = _signature(path)
    with pytest.raises(UsageError, match="holds 6 tokens; the decode objective needs 10"):
        phase_sets(cache, DecoderSettings(cache_tokens=10, tokens=text), _infer(path))
    np.save(ids, np.arange(60))
    with pytest.raises(UsageError, match="holds id 59, beyond the model's vocabulary of 48"):
        phase_sets(cache, DecoderSettings(cache_tokens=10, tokens=ids), _infer(path))


def test_a_decoder_is_tuned_for_decode_and_reported_per_token(tmp_path: Path) -> None:
    model = kv_decoder(tmp_path / "d.onnx")
    out = tmp_path / "out"
    done = routetune("tune", str(model), "--cache-tokens", "24", "--generate-tokens", "6",
                     "--seasonings", "fp16", "--accuracy", "logits:top1>=0.99", "--in-process",
                     "--output", str(out), *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr
    header = " ".join(done.stderr.split())  # the header wraps at 80 columns
    assert "decoder decode · one token against a cache of 24-29 tokens, 6 greedy" in header
    assert "tokens drawn at random (seed 0)" in header
    assert "decode: " in done.stdout and " tokens/s)" in done.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["given"]["decoder"].startswith("decode · one token")
    trials = {t["route"]: t for t in json.loads((out / "report.json").read_text())["trials"]}
    assert set(trials) >= {"base", "fp16"}
    # the KV cache that no bound reads is neither kept from the reference nor measured
    assert set(trials["fp16"]["accuracy"]) == {"logits"}
    again = routetune("tune", "--recipe", str(out / "winner.toml"), "--in-process",
                      "--output", str(tmp_path / "again"), *QUICK_FLAGS)
    assert again.returncode == 0, again.stderr  # the recipe makes the same sets again
    assert "cache of 24-29 tokens" in " ".join(again.stderr.split())
    # the winner's stored outputs: the logits the constraint reads, not the KV cache
    # (most of a decode set's bytes); a rebuilt engine is judged on the same names
    with np.load(out / "winner_outputs.npz") as stored:
        assert sorted(stored.files) == [f"{i}/logits" for i in range(6)]
    built = routetune("build", "--recipe", str(out / "winner.toml"), "--output", str(out))
    assert built.returncode == 0, built.stderr
    assert "outputs match the stored winner's outputs (winner_outputs.npz)" in built.stdout


def test_a_decoder_is_tuned_end_to_end_and_reported_as_time_to_the_last_token(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = routetune("tune", str(kv_decoder(tmp_path / "d.onnx")), "--objective", "generate",
                     "--prompt-tokens", "12", "--generate-tokens", "5", "--cache-tokens", "7",
                     "--seasonings", "fp16",
                     "--accuracy", "logits:top1>=0.99,present.1.value:cos>=0.999",
                     "--in-process", "--output", str(out),
                     *QUICK_FLAGS)
    assert done.returncode == 0, done.stderr
    header = " ".join(done.stderr.split())
    assert ("decoder generate · a 12-token prompt and 5 greedy tokens of the FP32 model, "
            "timed as one call: time to the last token") in header
    assert "--cache-tokens not used by the generate objective" in header  # noted, not refused
    assert "generate: " in done.stdout and "ms from the prompt to the last token" in done.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["phase"] == "generate" and record["measure"]["sequence"] is True
    report = (out / "report.md").read_text()
    assert "so p50 is the time from the prompt to the last token" in report
    trials = {t["route"]: t for t in json.loads((out / "report.json").read_text())["trials"]}
    # a bound that names a cache output keeps it, and only it, among the cache's
    assert set(trials["fp16"]["accuracy"]) == {"logits", "present.1.value"}


@pytest.mark.parametrize(("args", "message"), [
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx", drop=("past_key_values.0.value",)))],
     "needs past_key_values.0.value among its inputs"),
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx", heads=(2, 1)))],
     "mismatched head counts"),
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx")), "--accuracy", "top1>=0.99"],
     "top1 would read 'present.0.key', a decoder's KV cache (keys and values, not "
     "classes), which gets the tensor metrics only; scope it to another output, e.g. "
     "logits:top1>=0.99"),
    (lambda d, c, s: [str(c), "--objective", "prefill"],
     "--objective: "),
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx")), "--inputs", str(s),
                      "--generate-tokens", "3"], "--generate-tokens with --inputs"),
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx")), "--inputs", str(s)],
     "attention_mask has 7 columns; a cache of 5 and 1 new tokens make 6"),
    (lambda d, c, s: [str(kv_decoder(d / "m.onnx")), "--tokens", str(d / "none.npy")],
     "--tokens"),
])
def test_a_bad_decoder_input_is_one_line_exit_2(tmp_path: Path, args, message: str  # noqa: ANN001
                                                 ) -> None:
    sets = tmp_path / "sets.npz"
    np.savez(sets, input_ids=np.zeros((1, 1), np.int64),
             attention_mask=np.ones((1, 7), np.int64),
             **{f"past_key_values.{i}.{kv}": np.zeros((1, 2, 5, 8), np.float32)
                for i in range(2) for kv in ("key", "value")})
    cnn = conv_bn(tmp_path / "c.onnx")
    done = routetune("tune", *args(tmp_path, cnn, sets), "--output", str(tmp_path / "o"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routetune: error: "), done.stderr
    assert message in lines[0], lines[0]
