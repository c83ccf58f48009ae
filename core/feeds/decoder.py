"""Decoders with a KV cache: their signature, and input sets for one phase (issue 40).

A decoder exported with its cache (torch.onnx with ``use_cache``, Hugging Face Optimum,
ONNX Runtime GenAI's model builder) takes ``input_ids`` int64/int32 ``[batch, seq]``,
often ``attention_mask`` ``[batch, past + seq]`` and ``position_ids`` ``[batch, seq]``,
and per layer ``i`` the cache ``past_key_values.{i}.key`` and ``.value`` ``[batch,
kv_heads, past, head_dim]``; it gives ``logits`` ``[batch, seq, vocab]`` and
``present.{i}.key``/``.value`` ``[batch, kv_heads, past + seq, head_dim]``
(`CacheSignature`). One model, two workloads:

- **prefill**: a prompt of P tokens against an empty cache (``past`` 0): the time to
  the first token, compute-bound;
- **decode**: one token against a cache of L tokens: the per-token latency, and
  tokens/s = 1000 / p50 ms at batch 1, bound by memory and kernel launches;
- **generate**, both end to end: a prompt of P tokens, then greedy decode steps until
  G tokens are generated, timed as one call: the time from the prompt to the last
  token, what a user of a chat or completion endpoint waits.

The route that is fastest for one is not always fastest for the other, so a search
ranks one, the objective (`DecoderSettings.objective`, default ``decode``).
Without ``--inputs`` routetune makes that phase's input sets from the FP32 reference
itself (`phase_sets`):

- decode: the reference reads a prompt of L tokens (`DecoderSettings.cache_tokens`) and
  generates N more greedily (`DecoderSettings.generate_tokens`); each generated step is
  one input set (its token, the reference's own cache of L + k tokens). The accuracy
  constraint on ``logits`` then judges every route at each of those N steps, teacher
  forced: ``logits:top1`` is the greedy next-token agreement with the FP32 model over N
  generated tokens, ``logits:kl`` the mean KL divergence of their next-token
  distributions (`routetune.judging.task_metrics`). Each step's error is its own: a
  route that flips one token is not judged on the text that flip would lead to.
- prefill: `PREFILL_SETS` prompts of P tokens (`DecoderSettings.prompt_tokens`), empty
  cache; ``logits:top1`` is next-token agreement at every prompt position.
- generate: one prompt of P tokens, empty cache, then the G - 1 greedy decode steps of
  the reference that follow it (the prompt's pass gives the first of G tokens), in that
  order; the timing runs them in order as one call (`MeasureSettings.sequence`), and
  ``logits:top1`` is next-token agreement at the P prompt positions and the G - 1
  steps.

Without ``--accuracy`` a decoder is judged on its logits by `ACCURACY`. The prompt's
tokens come from a file (`DecoderSettings.tokens`: a ``.npy`` of integer
ids, or a text read as UTF-8 bytes for a byte-level vocabulary) or are drawn from
``numpy.random.default_rng(0)`` over the vocabulary.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from routetune.errors import UsageError, one_line
from routetune.options import OptionError, option

if TYPE_CHECKING:
    from routetune.model.loading import TensorSpec

Feed = dict[str, np.ndarray]

PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
"""A cache input: layer index, key or value (torch.onnx, Optimum and GenAI's builder)."""

CACHE_OUTPUT = re.compile(r"^present\.(\d+)\.(key|value)$")
"""A cache output: layer index, key or value."""


def is_cache_output(name: str, rank: int) -> bool:
    """Whether an output of this name and rank is a decoder's KV cache.

    ``present.{i}.key`` or ``.value``, rank 4: keys and values, not classes or
    probabilities, so it gets the tensor metrics only
    (`routetune.judging.accuracy.measure_accuracy`).
    """
    return rank == 4 and CACHE_OUTPUT.match(name) is not None


PREFILL_SETS = 4
"""Prompts a prefill search judges and times, each from its own stretch of the tokens."""

TOKENS_SEED = 0
"""The seed of the prompt's tokens when no ``--tokens`` file is given."""

COPIES = 6
"""Copies of the decode sets' caches a search holds at once, as measured (process RSS)
on a two-backend search over 128 steps of ``benchmarks/decoder.py``'s 26 M decoder
(2.4 GB of caches): the tuner's own sets (one per backend), the worker that builds
(its inputs: about two), the worker that times (the sets, and the prepared copies of
the candidate and of the base route: three). The reference's ``present`` outputs are
not kept (`routetune.judging.accuracy.judged`)."""

OBJECTIVES = ("decode", "prefill", "generate")

USES = {"decode": ("cache_tokens", "generate_tokens"), "prefill": ("prompt_tokens",),
        "generate": ("prompt_tokens", "generate_tokens")}
"""The length options each objective reads (all read ``tokens``); the others are noted
as unused in the run's header, not refused, so that one recipe serves every objective."""

FILLED = ("input_ids", "attention_mask", "position_ids", "cache_position")
"""The inputs besides the cache that routetune fills: the tokens, a mask of ones over
``past + seq``, the positions ``past .. past + seq - 1`` (``[batch, seq]``), and
transformers' ``cache_position`` (the same positions, ``[seq]``)."""

ACCURACY = "{logits}:top1>=0.99,{logits}:kl<=0.01"
"""A decoder's accuracy constraint when none is given, on its logits only (the cache
outputs are the steps' inner state): greedy next-token agreement with the FP32 model at
99% of the positions or more (every one of up to 99 generated steps), and a mean KL
divergence of the next-token distributions of 0.01 nats or less. The bound's scale, as
measured on the trained decoder of ``benchmarks/decoder.py`` (docs/benchmarks.md, "LLM
decoders on the CPU"): int4 RTN weights 0.002, FP16 0.0015, an INT8 route that changed
2 of 16 next bytes 0.38."""


def default_accuracy(cache: CacheSignature) -> str:
    """`ACCURACY` for this decoder's logits output."""
    return ACCURACY.format(logits=cache.logits)


def _path(value: object) -> Path | None:
    return None if value is None else Path(str(value))


@dataclass(frozen=True)
class DecoderSettings:
    """What a decoder's search ranks, and the input sets it is judged and timed on.

    Args:
        objective: ``decode`` (one token against a cache of `cache_tokens`: per-token
            latency, tokens/s), ``prefill`` (a prompt of `prompt_tokens` against an
            empty cache: time to first token) or ``generate`` (a prompt of
            `prompt_tokens` and `generate_tokens` greedy tokens as one call: time to the
            last token).
        cache_tokens: Decode: the cache (tokens) before the first generated step.
        prompt_tokens: Prefill and generate: the prompt's length (tokens).
        generate_tokens: Decode: the steps the FP32 model generates greedily, one input
            set each (the positions greedy agreement is judged at); generate: the
            tokens generated after the prompt, its pass included.
        tokens: The prompt's token ids: a ``.npy`` of integers, or a text file read as
            UTF-8 bytes (a byte-level vocabulary); None: seeded random ids.
    """

    objective: str = option(
        "decode", help="What a decoder's search ranks: decode (one token against a "
        "cache of --cache-tokens: per-token latency, tokens/s), prefill (a prompt of "
        "--prompt-tokens against an empty cache: time to first token) or generate (the "
        "prompt and --generate-tokens greedy tokens, timed as one call: time to the last "
        "token).",
        recipe="decoder.objective", choices=OBJECTIVES)
    cache_tokens: int = option(
        512, help="A decoder's decode objective: the cache (tokens) the FP32 model has "
        "read before its first generated token.", recipe="decoder.cache_tokens", minimum=1)
    prompt_tokens: int = option(
        128, help="A decoder's prefill and generate objectives: the prompt's length "
        "(tokens).",
        recipe="decoder.prompt_tokens", minimum=1)
    generate_tokens: int = option(
        32, help="A decoder's decode and generate objectives: tokens the FP32 model "
        "generates greedily (decode: each one input set, judged at each; generate: after "
        "the prompt, the prompt's own pass included).",
        recipe="decoder.generate_tokens", minimum=1)
    tokens: Path | None = option(
        None, help="A decoder's prompt: a .npy of token ids, or a text file read as UTF-8 "
        "bytes (byte-level vocabularies); default: seeded random ids.",
        recipe="decoder.tokens", from_keyword=_path)

    def describe(self, cache: CacheSignature, given: str) -> str:
        """One line for the run's header: the objective, its shapes and the tokens."""
        if self.objective == "prefill":
            what = (f"prefill · time to first token of a {self.prompt_tokens}-token prompt, "
                    f"empty cache, {PREFILL_SETS} prompts")
        elif self.objective == "generate":
            what = (f"generate · a {self.prompt_tokens}-token prompt and "
                    f"{self.generate_tokens} greedy tokens of the FP32 model, timed as one "
                    "call: time to the last token")
        else:
            what = (f"decode · one token against a cache of {self.cache_tokens}-"
                    f"{self.cache_tokens + self.generate_tokens - 1} tokens, "
                    f"{self.generate_tokens} greedy steps of the FP32 model")
        return (f"{what}, batch 1 · {cache.layers} layers, {cache.heads} KV heads of "
                f"{cache.head_dim} · tokens {given}")


@dataclass(frozen=True)
class CacheSignature:
    """A decoder's inputs and outputs (module docstring).

    Args:
        input_ids: The token input's name.
        attention_mask: The mask input's name, if it has one.
        position_ids: The position input's name, if it has one (``[batch, seq]``).
        cache_position: transformers' ``cache_position`` input, if it has one (``[seq]``).
        layers: Cache layers (``past_key_values.0`` to ``.{layers-1}``).
        heads: KV heads per layer (the cache's axis 1), None where the model leaves it
            dynamic.
        head_dim: Channels per head (axis 3), None where dynamic.
        cache_dtype: The cache's numpy dtype (float32 or float16).
        logits: The logits output's name.
        vocab: The vocabulary (the logits' last axis), None where dynamic.
        dtypes: The dtypes of the inputs besides the cache.
        others: Inputs routetune cannot fill (not in `FILLED`, not the cache).
    """

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    cache_position: str | None
    layers: int
    heads: int | None
    head_dim: int | None
    cache_dtype: np.dtype
    logits: str
    vocab: int | None
    dtypes: Mapping[str, np.dtype]
    others: tuple[str, ...] = ()

    def past(self, i: int, kv: str) -> str:
        """The cache input of layer `i`, ``key`` or ``value``."""
        return f"past_key_values.{i}.{kv}"

    def present(self, i: int, kv: str) -> str:
        """The cache output of layer `i`, ``key`` or ``value``."""
        return f"present.{i}.{kv}"


def _fixed(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim >= 0 else None


def signature(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
              source: Path) -> CacheSignature | None:
    """The model's KV-cache signature; None when it takes no ``past_key_values.*``.

    Raises:
        UsageError: A decoder whose cache cannot be used: a layer's key or value input
            missing, an input without its ``present.*`` output, an input of rank other
            than 4, head counts or head sizes that differ between layers, keys and
            values, or inputs and outputs, or no ``input_ids``.
    """
    found: dict[tuple[int, str], TensorSpec] = {}
    for spec in inputs:
        m = PAST.match(spec.name)
        if m:
            found[int(m.group(1)), m.group(2)] = spec
    if not found:
        return None
    where = f"{source}: a decoder with a KV cache"
    layers = max(i for i, _ in found) + 1
    for i in range(layers):
        for kv in ("key", "value"):
            if (i, kv) not in found:
                raise UsageError(f"{where} needs past_key_values.{i}.{kv} among its inputs "
                                 f"(it has {len(found)} cache inputs for {layers} layers); "
                                 "export the model with every layer's key and value cache")
    outs = {o.name: o for o in outputs}
    heads: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for (i, kv), spec in sorted(found.items()):
        present = outs.get(f"present.{i}.{kv}")
        if present is None:
            raise UsageError(f"{where}: input {spec.name} has no output present.{i}.{kv} "
                             "to carry the cache to the next step; export the model with "
                             "its present.* outputs (use_cache=True)")
        for t in (spec, present):
            if len(t.shape) != 4:
                raise UsageError(f"{where}: {t.name} has rank {len(t.shape)} "
                                 f"({t}), not 4 [batch, kv_heads, length, head_dim]; "
                                 "export the cache in that layout")
            if _fixed(t.shape[1]) is not None:
                heads[t.name] = t.shape[1]  # type: ignore[assignment]
            if _fixed(t.shape[3]) is not None:
                sizes[t.name] = t.shape[3]  # type: ignore[assignment]
    for what, got in (("head counts (axis 1)", heads), ("head sizes (axis 3)", sizes)):
        if len(set(got.values())) > 1:
            first = next(iter(got))
            other = next(n for n, v in got.items() if v != got[first])
            raise UsageError(f"{where}: mismatched {what}: {first} has {got[first]}, "
                             f"{other} has {got[other]}; every layer's past and present "
                             "key and value must have the same; re-export the model")
    names = {s.name: s for s in inputs}
    ids = names.get("input_ids")
    if ids is None:
        raise UsageError(f"{where} has no input_ids input; name the token input "
                         "input_ids, or give the input sets with --inputs")
    logits = outs.get("logits") or next(
        (o for o in outputs if not o.name.startswith("present.")), None)
    if logits is None:
        raise UsageError(f"{where} has no logits output; give the input sets with --inputs")
    dtype = found[0, "key"].dtype
    return CacheSignature(
        input_ids="input_ids",
        attention_mask="attention_mask" if "attention_mask" in names else None,
        position_ids="position_ids" if "position_ids" in names else None,
        cache_position="cache_position" if "cache_position" in names else None,
        layers=layers, heads=next(iter(heads.values()), None),
        head_dim=next(iter(sizes.values()), None),
        cache_dtype=np.dtype(dtype) if dtype is not None else np.dtype(np.float32),
        logits=logits.name,
        vocab=_fixed(logits.shape[-1]) if logits.shape else None,
        dtypes={s.name: np.dtype(s.dtype) for s in inputs if s.dtype is not None
                and not PAST.match(s.name)},
        others=tuple(n for n in names if n not in FILLED and not PAST.match(n)),
    )


def check_sets(cache: CacheSignature, feeds: Sequence[Mapping[str, np.ndarray]],
               where: str) -> None:
    """Refuse given input sets whose cache a decoder cannot take.

    Raises:
        UsageError: A set whose cache tensors differ in batch, heads, length or head
            size from its ``past_key_values.0.key``, or whose attention mask is not
            ``past + seq`` long.
    """
    for k, feed in enumerate(feeds):
        first = feed.get(cache.past(0, "key"))
        if first is None or first.ndim != 4:
            continue  # load_npz checked names and ranks against the model
        for i in range(cache.layers):
            for kv in ("key", "value"):
                a = feed[cache.past(i, kv)]
                if a.shape != first.shape:
                    raise UsageError(
                        f"{where}: input set {k}: {cache.past(i, kv)} has shape "
                        f"{'x'.join(map(str, a.shape))}, past_key_values.0.key "
                        f"{'x'.join(map(str, first.shape))}: mismatched head counts or "
                        "cache lengths; every layer's cache must have one shape")
        ids = feed.get(cache.input_ids)
        mask = feed.get(cache.attention_mask) if cache.attention_mask else None
        if ids is not None and mask is not None and ids.ndim == 2 and mask.ndim == 2:
            want = first.shape[2] + ids.shape[1]
            if mask.shape[1] != want:
                raise UsageError(
                    f"{where}: input set {k}: attention_mask has {mask.shape[1]} columns; "
                    f"a cache of {first.shape[2]} and {ids.shape[1]} new tokens make "
                    f"{want}; give a mask of past + seq")


def read_tokens(path: Path) -> np.ndarray:
    """Token ids from a ``.npy`` of integers, or a text file's UTF-8 bytes; int64 ``(T,)``.

    Raises:
        UsageError: A missing or unreadable file, a ``.npy`` that is not integers, not
            one sequence (``(T,)`` or ``(1, T)``), empty, or holding a negative id.
    """
    try:
        if path.suffix == ".npy":
            ids = np.load(path, allow_pickle=False)
            if ids.dtype.kind not in "iu":
                raise OptionError("tokens", f" {path}: holds {ids.dtype}, not integer token "
                                  "ids; save the ids as integers")
        else:
            ids = np.frombuffer(path.read_text(encoding="utf-8").encode("utf-8"),
                                dtype=np.uint8)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise OptionError("tokens", f" {path}: cannot be read ({one_line(e, 200)}); give a "
                          ".npy of token ids or a UTF-8 text file") from e
    if ids.ndim > 1 and ids.shape[0] != 1 or ids.ndim > 2:
        raise OptionError("tokens", f" {path}: holds an array of shape "
                          f"{'x'.join(map(str, ids.shape))}; give one sequence of ids, of "
                          "shape (T,) or (1, T)")
    ids = ids.reshape(-1).astype(np.int64)
    if not ids.size:
        raise OptionError("tokens", f" {path}: holds no tokens; give a non-empty file")
    if int(ids.min()) < 0:
        raise OptionError("tokens", f" {path}: holds id {int(ids.min())}; token ids are 0 or "
                          "more: give ids of this model's tokenizer")
    return ids


def available_memory() -> int:
    """Bytes of physical memory available now.

    Linux's ``MemAvailable`` (/proc/meminfo); elsewhere the free pages (``sysconf``);
    2**62 where neither can be read.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**62


Infer = Callable[[Feed], Mapping[str, np.ndarray]]
"""Runs the FP32 reference on one input set."""


def phase_sets(cache: CacheSignature, settings: DecoderSettings, infer: Infer) -> list[Feed]:
    """The objective's input sets, made with the FP32 reference (module docstring).

    Args:
        cache: The decoder's signature.
        settings: The objective, its lengths and the prompt's tokens.
        infer: Runs the FP32 reference on one set, giving its outputs by name.

    Raises:
        UsageError: The model has an input routetune cannot fill, its heads, head
            size or vocabulary is dynamic, the tokens
            file is shorter than the prompt or holds ids beyond the vocabulary, or the
            decode sets' caches (`COPIES` of them) would not fit in the memory
            available.
    """
    if cache.others:
        raise UsageError(f"a decoder with the input{'s' * (len(cache.others) > 1)} "
                         f"{', '.join(cache.others)}: routetune fills only "
                         f"{', '.join(FILLED)} and the cache; give the input sets with "
                         "--inputs")
    if cache.heads is None or cache.head_dim is None:
        raise UsageError("a decoder whose cache has dynamic heads or head size: routetune "
                         "cannot make an empty cache for it; give the input sets with "
                         "--inputs")
    objective = settings.objective
    decode, prompt = objective == "decode", settings.prompt_tokens
    want = {"decode": settings.cache_tokens, "prefill": prompt * PREFILL_SETS,
            "generate": prompt}[objective]
    flag = "--cache-tokens" if decode else "--prompt-tokens"
    if settings.tokens is not None:
        tokens = read_tokens(settings.tokens)
        if tokens.size < want:
            raise OptionError("tokens", f" {settings.tokens}: holds {tokens.size} tokens; "
                              f"the {settings.objective} objective needs {want} ({flag}); "
                              f"give a longer file or a smaller {flag}")
        if cache.vocab is not None and int(tokens.max()) >= cache.vocab:
            raise OptionError("tokens", f" {settings.tokens}: holds id {int(tokens.max())}, "
                              f"beyond the model's vocabulary of {cache.vocab}; give ids "
                              "of this model's tokenizer")
    elif cache.vocab is None:
        raise UsageError("a decoder whose logits have a dynamic vocabulary: routetune "
                         "cannot draw token ids for it; give --tokens FILE or --inputs")
    else:
        tokens = np.random.default_rng(TOKENS_SEED).integers(0, cache.vocab, want)
    item = np.dtype(cache.cache_dtype).itemsize * 2 * cache.layers * cache.heads * cache.head_dim
    if objective != "prefill":
        n, length = settings.generate_tokens, settings.cache_tokens if decode else prompt
        total = COPIES * item * sum(length + k for k in range(n))
        free = available_memory()
        if total > free:
            held = "--cache-tokens" if decode else "--prompt-tokens"
            raise UsageError(f"--generate-tokens {n} at {held} {length}: the {objective} "
                             f"input sets' caches would take {total / 2**30:.1f} GiB "
                             f"({COPIES} copies), over the {free / 2**30:.1f} GiB of memory "
                             f"available; give fewer generated tokens or a smaller {held}")

    def feed(ids: np.ndarray, past: Sequence[np.ndarray]) -> Feed:
        seq, held = ids.shape[0], past[0].shape[2]
        out: Feed = {cache.input_ids: ids.reshape(1, seq).astype(cache.dtypes[cache.input_ids])}
        if cache.attention_mask is not None:
            out[cache.attention_mask] = np.ones((1, held + seq),
                                                dtype=cache.dtypes[cache.attention_mask])
        if cache.position_ids is not None:
            out[cache.position_ids] = np.arange(held, held + seq).astype(
                cache.dtypes[cache.position_ids])[None]
        if cache.cache_position is not None:
            out[cache.cache_position] = np.arange(held, held + seq).astype(
                cache.dtypes[cache.cache_position])
        for i in range(cache.layers):
            out[cache.past(i, "key")] = past[2 * i]
            out[cache.past(i, "value")] = past[2 * i + 1]
        return out

    empty = [np.zeros((1, cache.heads, 0, cache.head_dim), dtype=cache.cache_dtype)
             for _ in range(2 * cache.layers)]
    if objective == "prefill":
        return [feed(tokens[k * prompt:(k + 1) * prompt], empty) for k in range(PREFILL_SETS)]
    step = feed(tokens[:want], empty)
    # generate: the prompt is the first set, and its pass gives the first token
    sets: list[Feed] = [] if decode else [step]
    for _ in range(settings.generate_tokens - (not decode)):
        out = infer(step)
        past = [np.ascontiguousarray(out[cache.present(i, kv)])
                for i in range(cache.layers) for kv in ("key", "value")]
        token = np.array([int(np.argmax(out[cache.logits][0, -1]))])
        step = feed(token, past)
        sets.append(step)
    return sets


def per_token(p50_ms: float, objective: str) -> str:
    """A phase's latency in its user's words: ``1.691 ms per token (591 tokens/s)``."""
    if objective == "prefill":
        return f"{p50_ms:.3f} ms to the first token"
    if objective == "generate":
        return f"{p50_ms:.3f} ms from the prompt to the last token"
    return f"{p50_ms:.3f} ms per token ({1000 / p50_ms:,.0f} tokens/s)"


def phase_of(cache: CacheSignature, feeds: Sequence[Mapping[str, np.ndarray]]) -> str | None:
    """The phase a decoder's input sets time: ``prefill``, ``decode``, ``generate`` or None.

    ``prefill`` where every set's cache is empty, ``decode`` where every set is one
    token against a cache, ``generate`` where a prompt against an empty cache comes
    first and one-token steps against its growing cache follow (the sets `phase_sets`
    makes for that objective); None for anything else (chunks against a cache, a mix).
    """
    def one(feed: Mapping[str, np.ndarray]) -> str | None:
        past, ids = feed.get(cache.past(0, "key")), feed.get(cache.input_ids)
        if past is None or ids is None or past.ndim != 4 or ids.ndim != 2:
            return None
        if past.shape[2] == 0:
            return "prefill"
        return "decode" if ids.shape[1] == 1 else None

    phases = [one(f) for f in feeds]
    if len(phases) > 1 and phases[0] == "prefill" and set(phases[1:]) == {"decode"}:
        held = [int(f[cache.past(0, "key")].shape[2]) for f in feeds]
        first = int(feeds[0][cache.input_ids].shape[1])
        return "generate" if held[1:] == list(range(first, first + len(held) - 1)) else None
    return phases[0] if len(set(phases)) == 1 else None
