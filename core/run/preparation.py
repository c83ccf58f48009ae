"""A run's preparation: every input resolved and checked before any trial runs.

`prepare_run` turns `routetune.run.tuning.RunSpec` into a `Prepared` run: the model, its
inputs and optimisation profile, the backend, the accuracy constraint, the route space
and the settings hash that keys the stored trials. Bad input stops here, as one
`UsageError`, before the output folder holds anything of this run.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from routetune.backend import Backend
from routetune.candidate.artifacts import MODELS, save_model
from routetune.errors import BackendError, UsageError, one_line
from routetune.execution import DEFAULT_TIMEOUT_S
from routetune.feeds import decoder, examples
from routetune.feeds.inputs import (
    fed_names,
    load_npz,
    parse_shapes,
    resolve_shapes,
    shared_dim_conflict,
    synthesize,
)
from routetune.feeds.profile import ShapeProfile, make_profile
from routetune.judging.accuracy import (
    DEFAULT_ACCURACY,
    Constraint,
    check_outputs,
    judged,
    parse_accuracy,
)
from routetune.judging.saved_reference import SavedReference, load_reference
from routetune.libraries import (
    EXTENSIONS,
    EXTENSIONS_DOMAINS,
    ORT_DOMAINS,
    PLUGINS,
    Library,
    resolve,
    use,
)
from routetune.model.loading import PreparedModel, prepare, sha256, with_weights_in
from routetune.model.weights import import_graph
from routetune.option_seasoning import check_option_keys
from routetune.options import OptionError
from routetune.plugin_manager import load_registry
from routetune.refinement import Refinement
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace, resolve_route
from routetune.routes.route import Route, parse_route
from routetune.routes.space import restrict_space
from routetune.run.outdir import make_outdir, remove_empty
from routetune.run.run_spec import RunSpec
from routetune.search.strategy import configure
from routetune.seasoning import SeasoningInfo


@dataclass
class Prepared:
    """A tuning run's inputs, resolved and checked before any trial runs."""

    registry: Registry
    model: PreparedModel
    backend: Backend
    feeds: list[dict[str, np.ndarray]]
    constraint: Constraint
    space: RouteSpace
    not_applicable: dict[str, str]
    outdir: Path
    settings_hash: str
    source: Mapping[str, Any]
    refinements: tuple[type[Refinement], ...] = ()
    """The refinements of the seasonings offered (`routetune.refinement`)."""
    profile: ShapeProfile | None = None
    base: Route = field(default_factory=Route)
    pinned: tuple[Route, ...] = ()
    spec: RunSpec = field(default_factory=RunSpec)
    """The run as asked for."""
    strategy_options: Any = None
    """The search strategy's options (`routetune.search.strategy.Strategy.Options`)."""
    base_passes: list[dict[str, Any]] = field(default_factory=list)
    """The backend's preflight and the pinned prefix as applied (set once the search loop
    has started)."""
    memory: str = ""
    """The route memory as the run uses it, one line: its file and what it knows here, or
    why there is none (set once the search loop has started; `routetune.run.route_memory`)."""
    time_budget_s: float | None = None
    """The search's time budget (s): ``--time-budget``, or the example's when none is
    given (`routetune.feeds.examples.Example.time_budget_s`, named in ``source``)."""
    libraries: tuple[Library, ...] = ()
    """``--custom-op-library`` and ``--plugin-library``, checked and hashed
    (`routetune.libraries.resolve`)."""
    saved_reference: SavedReference | None = None
    """``--reference-outputs``, read and checked: the reference instead of a run here."""
    phase: str | None = None
    """A decoder's phase its input sets time: ``decode`` or ``prefill``
    (`routetune.feeds.decoder.phase_of`); None for any other model or set."""
    created: tuple[Path, ...] = ()
    """The folders made for `outdir` by this run, the deepest last: a run refused
    before it records a trial removes them (`routetune.run.outdir.remove_refused`)."""

    @property
    def backend_options(self) -> Mapping[str, Any]:
        """Build options every route starts from (``spec.backend_options``)."""
        return self.spec.backend_options


def prepare_run(opts: RunSpec, registry: Registry | None = None) -> Prepared:
    """Resolve and check everything a run needs; no trial runs yet.

    A refused run removes the output folder it created, where it is still empty.

    Raises:
        UsageError: Any bad input: model, example, backend, seasoning, accuracy
            expression, inputs, shapes or output directory.
    """
    created: list[Path] = []
    try:
        return _prepare_run(opts, registry, created)
    except UsageError:
        remove_empty(created)
        raise


def _prepare_run(opts: RunSpec, registry: Registry | None, created: list[Path]) -> Prepared:
    """`prepare_run`, `created` getting the folders it made."""
    registry = registry or load_registry()
    opts.check()
    if opts.seasonings is not None and not opts.seasonings and not opts.routes:
        raise OptionError("seasonings", ": no names given; list seasonings (see `routetune "
                          "seasonings`) or leave the flag out for all")
    with_params = [n for n in opts.seasonings or () if "{" in n]
    if with_params:
        raise OptionError("seasonings", f" {with_params[0]}: takes seasoning names only; the "
                          f"search tries each seasoning's parameter choices itself; give "
                          f"'{with_params[0].split('{')[0]}'")
    shapes_, opt, low, high = (opts.spelled(n) for n in ("shapes", "opt_shapes",
                                                           "min_shapes", "max_shapes"))
    for name, given in (("shapes", opts.shapes), ("opt_shapes", opts.opt_shapes)):
        if opts.inputs is not None and given:
            raise OptionError(name, f" with {opts.spelled('inputs')}: the inputs fix the (opt) "
                              f"shapes; give one of them ({low} and {high} may go with the "
                              "inputs)")
    if opts.shapes and opts.opt_shapes:
        raise OptionError("shapes", f" with {opt}: {shapes_} sets min, opt and max at once; "
                          f"give {opt} with {low}/{high} instead")
    check_workers(opts, registry)
    libraries = (resolve(opts.custom_op_libraries, opts.spelled("custom_op_libraries"))
                 + resolve(opts.plugin_libraries, opts.spelled("plugin_libraries"), PLUGINS))
    use(libraries)  # the reference, the passes' own runs and in-process candidates
    registry.reference_backend()  # what every candidate is checked against, before any work
    backend = available_backend(registry, opts.backend)
    try:
        backend.load_plugin_libraries([lib.path for lib in libraries if lib.kind == PLUGINS])
    except BackendError as e:
        raise OptionError("plugin_libraries", f": {e}") from e
    check_option_keys(registry, backend)  # a plugin's misspelled option: now, not mid-search
    strategy_options = configure(registry.strategy(opts.search), opts.search_options,  # before
                                 opts.beam_width, opts.spelled)  # any work
    source: dict[str, Any] = {}
    shapes_flag = opts.spelled("opt_shapes" if opts.opt_shapes else "shapes")
    given_shapes = parse_shapes(opts.opt_shapes or opts.shapes, shapes_flag)
    if opts.example and opts.model is not None:
        raise UsageError(f"give either MODEL.onnx ('{opts.model}' was read as one) or "
                         f"--example NAME ('{opts.example}'), not both")
    example = examples.get_example(opts.example) if opts.example else None
    budget_s = opts.time_budget_s
    if example is not None:
        path = examples.fetch_example(example)
        source["example"] = example.name
        if budget_s is None and example.time_budget_s is not None:  # not given anywhere
            budget_s = example.time_budget_s
            source["time_budget"] = f"the {example.name} example's"
        given_shapes = {**example.shapes, **given_shapes}
    elif opts.model is not None:
        path = opts.model
        source["path"] = str(opts.model.resolve())
    else:
        raise UsageError("no model given; pass MODEL.onnx or --example NAME (e.g. ppocr-det)")
    model = prepare(path, opts.allow_external_data_outside,
                    fed_names(opts.inputs) if opts.inputs is not None else ())
    if opts.model_sha256 and opts.model_sha256 != model.source_sha256:
        raise OptionError("model_sha256", f" {opts.model_sha256}: {path} has sha256 "
                          f"{model.source_sha256}; the model changed since this hash was "
                          "recorded")
    outdir = make_outdir(opts.output, path, model.source_sha256, backend.name, created)
    model = with_weights_in(model, (outdir / MODELS).resolve())
    cache = decoder.signature(model.inputs, model.outputs, path)
    made = _decoder_options(opts, cache, path, bool(given_shapes))
    if opts.inputs is not None:
        feeds = load_npz(opts.inputs, model.inputs)
        source["inputs"] = str(opts.inputs.resolve())
        shapes = {s.name: tuple(feeds[0][s.name].shape) for s in model.inputs}
        if cache is not None:
            decoder.check_sets(cache, feeds, f"{opts.spelled('inputs')} {opts.inputs}")
    elif made and cache is not None:
        feeds = _decoder_sets(registry, backend, model, outdir, cache, opts.decoder)
        given = str(opts.decoder.tokens) if opts.decoder.tokens else (
            f"drawn at random (seed {decoder.TOKENS_SEED})")
        source["decoder"] = opts.decoder.describe(cache, given)
        unused = [opts.spelled(n) for n in ("cache_tokens", "prompt_tokens", "generate_tokens")
                  if n in opts.sources and n not in decoder.USES[opts.decoder.objective]]
        if unused:
            source["decoder"] += (f" · {' and '.join(unused)} not used by the "
                                  f"{opts.decoder.objective} objective")
        shapes = {s.name: tuple(feeds[0][s.name].shape) for s in model.inputs}
    else:
        shapes = resolve_shapes(model.inputs, given_shapes, shapes_flag)
        if example is not None:
            feeds = example.make_inputs(shapes, 0, example.count)
        else:
            feeds = synthesize(model.inputs, shapes)
        source["shapes"] = ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())
    saved = (load_reference(opts.reference_outputs, model.outputs, len(feeds))
             if opts.reference_outputs is not None else None)
    profile = make_profile(model.inputs, shapes, opts.min_shapes or opts.shapes,
                           opts.max_shapes or opts.shapes,
                           feeds if opts.inputs is not None or made else ())
    backend = type(backend)(profile)
    accuracy, whose = opts.accuracy, ""
    if (example is not None and example.accuracy and "accuracy" not in opts.sources
            and accuracy == DEFAULT_ACCURACY):  # not given: the example's task constraint
        accuracy, whose = example.accuracy, example.name
        source["accuracy"] = f"the {whose} example's"
    elif cache is not None and "accuracy" not in opts.sources and accuracy == DEFAULT_ACCURACY:
        accuracy = decoder.default_accuracy(cache)  # not given: judged on the next token
        source["accuracy"] = "a decoder's"
    try:
        constraint = parse_accuracy(accuracy, registry, [o.name for o in model.outputs])
    except UsageError as e:
        if not whose:
            raise
        raise UsageError(f"--example {whose}: its task constraint '{accuracy}' cannot be "
                         f"used ({e}); enable the plugin that registers its metric, or give "
                         "--accuracy") from e
    check_outputs(constraint, registry, {o.name: o.shape for o in model.outputs})
    infos, not_applicable = _offered(registry, backend, model, opts.seasonings)
    refinements = tuple(dict.fromkeys(
        r for r in (registry.seasoning(i.name).refinement for i in infos) if r is not None))
    if opts.seasonings:  # () with pinned routes: search nothing, try the pinned ones
        _check_named(opts.seasonings, infos, not_applicable, refinements)
    infos = restrict_space(infos, opts.space, not_applicable, registry)
    space = RouteSpace(infos, opts.max_depth)
    inputs_hash = sha256(b"".join(a.tobytes() + str(a.shape).encode()
                                  for f in feeds for a in f.values()))
    base = resolve_route(parse_route(",".join(opts.base)), registry)
    if any(registry.seasoning(n).info.stage == "build" for n in base.names):
        raise UsageError(f"base '{base}': build seasonings cannot be in the pinned prefix; "
                         "give build options as backend options")
    pinned = tuple(resolve_route(parse_route(text), registry) for text in opts.routes)
    for route in pinned:
        for step in route:
            why = registry.seasoning(step.name)().supports(backend)
            if why:
                raise UsageError(f"pinned route '{route}': {step.name} {why}, not "
                                 f"{backend.name}; drop it or change the backend")
    try:
        backend.full_settings(opts.backend_options)
    except BackendError as e:
        raise UsageError(f"backend options: {e}") from e
    # what a measurement depends on: the bounds are not in it (a stored trial is judged
    # again under another --accuracy), the tolerances and the installed metrics are
    measured = [sorted(constraint.tolerance_map([o.name for o in model.outputs]).items()),
                sorted(registry.metrics), constraint.task_params()]
    phase = decoder.phase_of(cache, feeds) if cache is not None else None
    if phase == "generate":  # a run is the prompt and every step after it, in order
        opts = replace(opts, measure=replace(opts.measure, sequence=True))
    measure = asdict(opts.measure)
    host = not backend.gpus(backend.full_settings(opts.backend_options))
    if measure["latency"] == "device" or host:  # device compute is what was timed before
        del measure["latency"]  # --latency existed, and a host engine has no copies
    if not measure["sequence"]:  # as timed before it existed
        del measure["sequence"]
    settings_hash = sha256(json.dumps(
        [inputs_hash, measured, measure, str(profile), str(base),
         sorted(opts.backend_options.items())] + ([[lib.sha256 for lib in libraries]]
                                                   if libraries else [])
        + ([["reference", saved.sha256]] if saved is not None else []),
        default=str).encode())
    if profile.shapes:
        source["profile"] = str(profile)
    return Prepared(registry, model, backend, feeds, constraint, space, not_applicable,
                    outdir, settings_hash, source, refinements, profile, base=base,
                    pinned=pinned, spec=opts,
                    strategy_options=strategy_options, time_budget_s=budget_s,
                    libraries=libraries, saved_reference=saved,
                    phase=phase, created=tuple(created))


DECODER_OPTIONS = ("objective", "cache_tokens", "prompt_tokens", "generate_tokens", "tokens")


def _decoder_options(opts: RunSpec, cache: decoder.CacheSignature | None, path: Path,
                     shaped: bool) -> bool:
    """Whether routetune makes a decoder's input sets (`routetune.feeds.decoder`).

    Yes for a model with a KV cache given neither ``--inputs`` nor ``--shapes``.

    Raises:
        OptionError: A decoder option given for a model without a KV cache, or with
            ``--inputs`` or ``--shapes``, which fix the input sets themselves.
    """
    given = [n for n in DECODER_OPTIONS if n in opts.sources]
    if given and cache is None:
        raise OptionError(given[0], f": {path} takes no past_key_values.* inputs, so it is "
                          "not a decoder with a KV cache; leave the option out")
    fixed = "inputs" if opts.inputs is not None else "shapes" if shaped else ""
    if given and fixed:
        raise OptionError(given[0], f" with {opts.spelled(fixed)}: those fix the decoder's "
                          "input sets; give one of them")
    return cache is not None and not fixed


def _decoder_sets(registry: Registry, backend: Backend, model: PreparedModel, outdir: Path,
                  cache: decoder.CacheSignature, settings: decoder.DecoderSettings,
                  ) -> list[dict[str, np.ndarray]]:
    """The decoder objective's input sets, made with the FP32 reference.

    The reference backend of `reference_outputs`, optimisations off.

    Raises:
        UsageError: The reference cannot run the model on them, or the settings cannot
            make them (`routetune.feeds.decoder.phase_sets`).
    """
    source = save_model(outdir, model.data) if model.weights is not None else model.source
    try:
        with reference_backend(registry, backend).reference(source) as runner:
            return decoder.phase_sets(cache, settings, runner.infer)
    except UsageError:
        raise
    except Exception as e:  # the runtime's own error types
        raise UsageError(f"{model.source}: the FP32 reference cannot run the decoder's "
                         f"{settings.objective} input sets: {one_line(e, 300)}; give the "
                         "input sets with --inputs") from e


def reference_outputs(backend: Backend, run: Prepared) -> list[dict[str, np.ndarray]]:
    """The FP32 reference outputs of the original model, one mapping per input set.

    A model with external data runs from its copy in the run's store (the same graph
    and bytes, `with_weights_in`): its own locations may lead out of its folder, which
    ONNX Runtime refuses, when ``--allow-external-data-outside`` let them in.

    The reference must give something to judge a route against (`check_judgeable`).
    A decoder's KV-cache outputs that no bound reads are not kept
    (`routetune.judging.accuracy.judged`), so no candidate's are measured or held.
    With ``--reference-outputs`` it is the file's outputs (`Prepared.saved_reference`),
    and nothing is run.

    Raises:
        UsageError: The reference runtime cannot load or run the model on these inputs,
            or its outputs are empty or not finite.
    """
    if run.saved_reference is not None:
        outputs = [dict(o) for o in run.saved_reference.outputs]
        check_judgeable(outputs, run)
        return outputs
    source = run.model.source
    if run.model.weights is not None:
        source = save_model(run.outdir, run.model.data)
    try:
        with backend.reference(source) as runner:
            outputs = [judged(runner.infer(feed), run.constraint) for feed in run.feeds]
    except Exception as e:  # the runtime's own error types
        given = {name: a.shape for name, a in run.feeds[0].items()} if run.feeds else {}
        conflict = shared_dim_conflict(run.model.inputs, given)
        fix = (f"{conflict}: give them one size in "
               f"{'--shapes' if run.spec.inputs is None else '--inputs'}" if conflict else
               _unknown_op_fix(str(e), run.spec) or
               "the original model must run in ONNX Runtime on the CPU")
        raise UsageError(
            f"{run.model.source}: the FP32 reference ({backend.name}, optimisations off) "
            f"cannot run the model on these inputs: {one_line(e, 300)}; {fix}"
        ) from e
    check_judgeable(outputs, run)
    return outputs


UNREGISTERED = re.compile(r"([\w.]+):(\w+)\(-?\d+\) is not a registered function/op")
"""ONNX Runtime's error for an operator of a domain it has no kernel for (the domain and
the operator), as onnxruntime/core/graph/graph.cc words it."""

NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node")
"""ONNX Runtime's error for an operator it knows the schema of but has no CPU kernel for
(``EfficientNMS_TRT``, whose schema it keeps for its TensorRT provider), as
onnxruntime/core/framework/session_state.cc words it."""


def _unknown_op_fix(error: str, spec: RunSpec) -> str:
    """The fix for a reference that lacks a custom operator's library, or ""."""
    saved = f"or give the reference from a file, {spec.spelled('reference_outputs')} FILE"
    found = UNREGISTERED.search(error)
    if found is None or found.group(1) in ORT_DOMAINS:
        missing = NO_KERNEL.search(error)
        return (f"{missing.group(1)} has no kernel in ONNX Runtime's CPU provider (an op "
                f"of a TensorRT plugin, say): {saved}" if missing else "")
    flag = spec.spelled("custom_op_libraries")
    which = (f"{flag} {EXTENSIONS} (pip install onnxruntime-extensions)"
             if found.group(1) in EXTENSIONS_DOMAINS else f"{flag} PATH")
    given = f" (the {len(spec.custom_op_libraries)} given lack it)" if (
        spec.custom_op_libraries) else ""
    return (f"{found.group(1)}:{found.group(2)} is a custom operator{given}: give the "
            f"library that implements it, {which}, {saved}")


def check_judgeable(outputs: Sequence[Mapping[str, np.ndarray]], run: Prepared) -> None:
    """Refuse a reference that no route could be judged against.

    An output that is empty on every input set (a batch of 0: every route's error is 0
    on nothing), or one whose values are all NaN on some input set (validation inputs
    that are all NaN: a route's error against NaN says nothing), is degenerate input,
    not data. An output empty on some sets only (a detector that finds nothing in one
    image), with some NaN, or infinite by definition (ReduceMin of an empty set) is
    judged as it is, as are outputs that are sequences or maps.

    Raises:
        UsageError: Naming the output, the input set and the fix.
    """
    flag = run.spec.spelled("inputs")
    zeros = [f"{name}:{'x'.join(map(str, a.shape))}" for name, a in
             (run.feeds[0].items() if run.feeds else ()) if 0 in a.shape]

    def fix(wanted: str) -> str:
        if run.spec.inputs is not None:
            return f"give validation inputs on which it is {wanted} ({flag} {run.spec.inputs})"
        return (f"give sizes of 1 or more ({', '.join(zeros)} "
                f"{'has' if len(zeros) == 1 else 'have'} a 0)" if zeros else
                f"give real validation inputs with {flag}")

    where = f"{run.model.source}: the FP32 reference"
    for spec in run.model.outputs:  # tensors only: a sequence or a map is judged as it is
        arrays = [o[spec.name] for o in outputs if isinstance(o.get(spec.name), np.ndarray)]
        if arrays and all(a.size == 0 for a in arrays):
            raise UsageError(f"{where}'s output '{spec.name}' is empty (shape "
                             f"{'x'.join(map(str, arrays[0].shape))}) on every input set, "
                             f"so no route's accuracy can be judged; {fix('not empty')}")
        for i, a in enumerate(arrays):
            floating = a.dtype.kind in "fc" or a.dtype.name.startswith(("bfloat", "float8",
                                                                          "float4"))
            if a.size and floating and np.isnan(a.astype(np.complex128)).all():
                raise UsageError(f"{where}'s output '{spec.name}' is all NaN on input set "
                                 f"{i}, so no route's accuracy can be judged; "
                                 f"{fix('not NaN')}")


MIN_WORKER_MEMORY_MB = 512
"""The smallest ``--worker-memory``: a worker maps about 400 MiB of libraries."""


def check_workers(opts: RunSpec, registry: Registry) -> None:
    """Refuse worker settings that cannot work.

    Raises:
        UsageError: No build worker or more than CPU cores, a timeout that is not a
            positive finite number, too little memory, worker settings with
            ``--in-process`` or an executor that takes none, an unknown executor, or a
            cluster address for an executor that runs on none.
    """
    cores = os.cpu_count() or 1
    if not 1 <= opts.build_workers <= cores:
        raise OptionError("build_workers", f" {opts.build_workers}: give 1 to {cores} (this "
                          f"machine's CPU cores; each build worker is a process)")
    memory = opts.worker_memory_mb
    if memory is not None and memory < MIN_WORKER_MEMORY_MB:
        raise OptionError("worker_memory_mb", f" {memory}: give at least {MIN_WORKER_MEMORY_MB} "
                          "(MiB); a worker maps about 400 MiB of libraries before any trial")
    changed = [opts.spelled(name) for name, used in (
        ("build_workers", opts.build_workers != 1),
        ("trial_timeout_s", opts.trial_timeout_s != DEFAULT_TIMEOUT_S),
        ("worker_memory_mb", memory is not None)) if used]
    if opts.in_process and changed:
        raise OptionError("in_process", f" with {', '.join(changed)}: trials in this process "
                          "have no workers, timeouts or memory limits; drop one or the other")
    if opts.in_process and opts.executor != "local":
        raise OptionError("in_process", f" with {opts.spelled('executor')} {opts.executor}: "
                          "trials run in this process or by that executor; drop one or the "
                          "other")
    executor = registry.executor(opts.executor_name)
    if executor.refuses_worker_options and (opts.build_workers != 1 or memory is not None):
        raise OptionError("executor", f" {executor.name} with {opts.spelled('build_workers')} "
                          f"or {opts.spelled('worker_memory_mb')}: "
                          f"{executor.refuses_worker_options}")
    if not executor.cluster and opts.ray_address is not None:
        raise OptionError("ray_address", f" {opts.ray_address}: only with "
                          f"{opts.spelled('executor')} ray (or another executor that runs "
                          "on a cluster); add it, or drop the address")


def reference_backend(registry: Registry, backend: Backend) -> Backend:
    """The backend that computes the FP32 reference outputs.

    `backend` itself if it holds the role (`routetune.registry.Registry.add_backend`),
    else a new instance of the one that does.

    Raises:
        UsageError: No backend holds the role, or it is not available here.
    """
    cls = registry.reference_backend()
    if type(backend) is cls:
        return backend
    return available_backend(registry, cls.name)


def available_backend(registry: Registry, name: str) -> Backend:
    """A new instance of backend `name`.

    Raises:
        UsageError: No such backend, or it is not available here (the reason).
    """
    backend = registry.backend(name)()
    reason = backend.available()
    if reason:
        raise OptionError("backend", f" {name}: not available here ({reason})")
    return backend


def _check_named(names: Sequence[str], infos: Sequence[SeasoningInfo],
                 not_applicable: Mapping[str, str],
                 refinements: Sequence[type[Refinement]]) -> None:
    """Refuse a ``--seasonings`` list from which no route can be built.

    Raises:
        UsageError: None of the named seasonings applies here, or a refinement has
            nothing to refine (``precision-repair`` without a precision seasoning).
    """
    searched = [i for i in infos if i.searched]
    for refinement in refinements:
        why = refinement.why_idle(infos)
        if why:
            raise OptionError("seasonings", f" {','.join(names)}: {why}")
    if not searched:
        why = "; ".join(f"{n}: {r}" for n, r in not_applicable.items())
        why = f" ({why})" if why else ""
        raise OptionError("seasonings", f" {','.join(names)}: none applies here{why}; "
                          "see `routetune seasonings`")


def _offered(
    registry: Registry, backend: Backend, model: PreparedModel, names: tuple[str, ...] | None
) -> tuple[list[SeasoningInfo], dict[str, str]]:

    graph = import_graph(model.proto, model.weights)
    # Unasked, a seasoning made for other backends is left out, not listed as skipped.
    chosen = names if names is not None else tuple(
        n for n in sorted(registry.seasonings) if registry.offered_for(n, backend.name))
    infos: list[SeasoningInfo] = []
    skipped: dict[str, str] = {}
    for name in chosen:
        cls = registry.seasoning(name)
        if name in backend.preflight:
            if names is not None:
                raise OptionError("seasonings", f": '{name}' is part of the {backend.name} "
                                  "backend's preflight, applied before every build; "
                                  "leave it out")
            continue
        try:
            reason = cls().why_not(graph, backend)
        except Exception as e:  # a plugin's check must not stop the run
            reason = f"applicable() raised {type(e).__name__}: {e}"
        if reason:
            skipped[name] = reason
        else:
            infos.append(cls.info)
    return infos, skipped
