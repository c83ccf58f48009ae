"""``routetune build``: rebuild one route's engine and check it against what was stored.

The route comes from ``--route`` or from a recipe that pins exactly one (a winner
recipe). The rebuilt engine's outputs on the validation inputs are compared, under the
accuracy constraint, with the stored winner's outputs (``winner_outputs.npz``) when the
route is the output directory's winner, and with the FP32 reference otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from routetune.candidate.artifacts import build_engine, open_engine
from routetune.candidate.candidate import with_preflight
from routetune.candidate.records import TrialInputs
from routetune.errors import (
    BuildError,
    EngineNotRunnable,
    PostconditionError,
    SeasoningCrashed,
    SeasoningError,
    UsageError,
    describe,
)
from routetune.judging.accuracy import Verdict, check_accuracy
from routetune.logs import LOGS, captured, keep, quietly
from routetune.model.weights import copy_model
from routetune.options import OptionError
from routetune.registry import Registry
from routetune.routes.route import Route
from routetune.run.outdir import locked
from routetune.run.preparation import prepare_run, reference_backend, reference_outputs
from routetune.run.run_spec import RunSpec
from routetune.run.winner import WINNER_OUTPUTS, load_outputs


@dataclass(frozen=True)
class Rebuilt:
    """A rebuilt engine and its check.

    Args:
        route: The route, in canonical form.
        engine_file: Where the engine was written (``built.onnx`` or ``built.plan``).
        engine_bytes: Its size in bytes.
        build_ms: Build time in ms, the route's passes included.
        compared_with: What the outputs were compared with, in words.
        verdict: The accuracy verdict; None when this device cannot run the engine, or
            when the backend refused to build it.
        not_run: Why the engine was not run ("" when it was).
        failed: Why there is nothing to deploy, in one line ("" when the engine was built
            and ran): a pass declined the route, the backend refused the model (then
            there is no engine file), or the engine does not run on the inputs.
        broken: A pass wrote a model that breaks the contract (the ONNX checker, the
            signature, node names) or crashed, in one line naming the pass; "" otherwise.
        log: The log file holding what the libraries printed meanwhile
            (``artifacts/logs/build.log`` in the output directory).
        changed: Whether any of the route's passes changed the model or the settings
            (False: the engine is the base route's).
        unchanged: One line per step of the route whose pass changed nothing on this
            model (``modified: false``), with the pass's note: what it looked for.
    """

    route: Route
    engine_file: Path | None
    engine_bytes: int
    build_ms: float
    compared_with: str
    verdict: Verdict | None
    not_run: str = ""
    failed: str = ""
    broken: str = ""
    log: Path | None = None
    changed: bool = True
    unchanged: tuple[str, ...] = ()


def rebuild(opts: RunSpec, route: str | None, registry: Registry) -> Rebuilt:
    """Rebuild one route's engine in `opts`'s output directory and check its outputs.

    Args:
        opts: Model, backend, inputs, accuracy and output directory (a recipe's, or
            the flags').
        route: The route text; None to take the one route that `opts.routes` pins.
        registry: The installed plugins.

    Raises:
        UsageError: No route, several pinned routes, several backends, or any bad input
            of `prepare_run`.
    """
    if "," in opts.backend:  # a multi-backend search's folder holds one run per backend
        raise OptionError("backend", f" {opts.backend}: build rebuilds a route on one "
                          "backend; name one, with that backend's folder of the search, e.g. "
                          f"--backend {opts.backend.split(',')[-1].strip()} --output "
                          f"OUTDIR/{opts.backend.split(',')[-1].strip()}")
    if route is None:
        if len(opts.routes) != 1:
            raise UsageError(f"the recipe pins {len(opts.routes)} routes ("
                             f"{'; '.join(opts.routes) or 'none'}); give the one to build "
                             "with --route")
        route = opts.routes[0]
    run, early = quietly("prepare", lambda: prepare_run(
        dataclasses.replace(opts, routes=(route,), seasonings=()), registry))
    (resolved,) = run.pinned or (Route(),)
    reference = reference_backend(registry, run.backend)
    log = run.outdir / LOGS / "build.log"
    keep(log, early)
    with locked(run.outdir), tempfile.TemporaryDirectory(prefix="routetune-build-") as tmp, \
            captured(log, f"build {resolved}"):
        inputs = TrialInputs(run.model, run.backend.name, run.profile, tuple(run.feeds), (),
                             {}, run.outdir, run.model.data, run.spec.trial_settings(run.libraries))
        # what the engine is checked against, first: a model that does not run is the
        # user's input to fix (exit 2), whatever a route would do to it
        stored, what = _expected(run.outdir, resolved, run.settings_hash)
        if stored is None:
            stored, what = (reference_outputs(reference, run),
                            f"the FP32 reference (the {reference.name} backend)")
        candidate, _ = with_preflight(registry, inputs, run.backend, reference,
                                          list(run.base))
        t0 = time.perf_counter_ns()
        try:
            data, passes, settings = candidate.applier.apply(resolved)
        except SeasoningError as e:  # the pass declined, with its reason
            return Rebuilt(resolved, None, 0, 0.0, "", None, failed=describe(e), log=log)
        except (PostconditionError, SeasoningCrashed) as e:  # the pass broke the model
            return Rebuilt(resolved, None, 0, 0.0, "", None, broken=describe(e), log=log)
        try:
            engine = build_engine(run.backend, candidate.save_model(data), settings, Path(tmp),
                                  "", "")
        except BuildError as e:  # the backend's own refusal, in one line
            return Rebuilt(resolved, None, 0, (time.perf_counter_ns() - t0) / 1e6, "", None,
                           failed=describe(e), log=log)
        build_ms = (time.perf_counter_ns() - t0) / 1e6
        engine_file = _write_engine(run.outdir, engine)
        try:
            runner = open_engine(run.backend, engine)
        except EngineNotRunnable as e:
            return Rebuilt(resolved, engine_file, engine.size_bytes, build_ms, "", None,
                           str(e), log=log)
        try:
            with runner:
                outputs = [runner.infer(feed) for feed in run.feeds]
        except Exception as e:  # the runtime's own error types: the engine cannot run them
            return Rebuilt(resolved, engine_file, engine.size_bytes, build_ms, "", None,
                           failed=f"the engine does not run on the inputs: {describe(e)}",
                           log=log)
    verdict = check_accuracy(run.constraint, registry, outputs, stored)
    ours = passes[len(passes) - len(resolved):]
    unchanged = tuple(
        f"'{p.get('step')}' changed nothing on this model"
        + (f": {p['note']}" if p.get("note") else "") for p in ours if p.get("modified") is False)
    return Rebuilt(resolved, engine_file, engine.size_bytes, build_ms, what, verdict, log=log,
                   changed=any(p.get("modified", True) for p in ours), unchanged=unchanged)


def _expected(outdir: Path, route: Route, settings_hash: str) -> tuple[list | None, str]:
    """The stored winner outputs, if `route` won here with these inputs and settings.

    Same route text and same settings hash (model, inputs, tolerances, profile, base,
    backend options, measurement): otherwise the stored outputs belong to another run.
    """
    winner, outputs = outdir / "winner.json", outdir / WINNER_OUTPUTS
    if winner.exists() and outputs.exists():
        stored = json.loads(winner.read_text())
        if stored.get("route") == str(route) and stored.get("settings_hash") == settings_hash:
            return load_outputs(outputs), f"the stored winner's outputs ({WINNER_OUTPUTS})"
    return None, ""


def _write_engine(outdir: Path, engine) -> Path:  # noqa: ANN001 - routetune.backend.Engine
    """Copy the engine next to the trials: a plan's bytes, or the model file."""
    if isinstance(engine.handle, bytes):
        path = outdir / "built.plan"
        path.write_bytes(engine.handle)
    else:
        path = outdir / "built.onnx"  # with external data, built.onnx.data beside it
        copy_model(engine.path, path)
    (outdir / "built.json").write_text(json.dumps(dict(engine.settings), indent=2) + "\n")
    return path
