"""A contract kit for plugin packages: run it in your own tests against your plugin.

Each ``check_*`` function drives one registered item through the code the search itself
runs (no stand-ins) and raises `ContractError`, one line naming the item and the broken
rule, at the first rule it breaks::

    from routetune.testing import check_seasoning, registry_with
    import routetune_mulone

    def test_contract(tmp_path):
        registry = registry_with(routetune_mulone, "mulone")
        check_seasoning(registry, "remove-mul-by-one", "model.onnx", tmp_path)

The rules are CONTRIBUTING.md's. The built-in seasonings, backends, strategies and
metrics are held to them by ``tests/test_testing.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routetune.errors import RoutetuneError, UsageError
from routetune.judging.metrics import TaskMetric
from routetune.options import check_keyword, options_of, problem
from routetune.records.prior import Prior
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route, Step

ONE_LINE = 1000
"""Characters an error message may have at most (a longer one is not one line to read;
a list of the known names, such as a backend's options, fits)."""


class ContractError(AssertionError):
    """A plugin item broke a rule of the plugin contract; the message names both."""


def registry_with(plugin: object, name: str) -> Registry:
    """The installed plugins plus `plugin`, registered as its entry point would be.

    Args:
        plugin: The plugin module (or object) with ``@routetune.hookimpl`` functions.
        name: Its entry-point name (what ``ROUTETUNE_DISABLE_PLUGINS`` takes).

    Raises:
        PluginError: The plugin implements a hook routetune does not have, raises while
            registering, or registers a name another plugin has (one line, naming it).
    """
    from routetune.plugin_manager import load_registry

    return load_registry(extra={name: plugin})


def _one_line(what: str, message: str) -> None:
    if "\n" in message or len(message) > ONE_LINE or not message.strip():
        raise ContractError(f"{what}: its error is not one line of at most {ONE_LINE} "
                            f"characters: {message[:200]!r}")


def check_seasoning(registry: Registry, name: str, model: Path | str, workdir: Path,
                    params: Mapping[str, Any] | None = None, backend: str = "onnxruntime",
                    refused: Path | str | None = None) -> dict[str, Any]:
    """Check a seasoning on `model` the way the search applies it.

    Rules: it is registered under its ``info.name``; an instance pickles (it holds only
    its parameters, so that routetune may copy it: a precision step is kept to be redone
    by ``precision-repair``); the backend filter holds whatever `applicable` says (a backend outside
    ``info.backends`` is never offered it); it is applicable to `model`; applied twice
    in fresh candidates it gives the same bytes (deterministic), and the model passes
    the search's postconditions (`routetune.model.postconditions.check_candidate`: the full ONNX
    checker, signature kept, sorted, unique node names, no redundant Cast). With
    `refused`, a model the seasoning must refuse: it declines with one line.

    Args:
        registry: From `registry_with`.
        name: The seasoning's name.
        model: An ONNX file it applies to (float32 inputs are fed seeded random data).
        workdir: An empty folder for the candidates' files.
        params: Parameter values (default: the seasoning's defaults).
        backend: The backend to apply it for.
        refused: An ONNX file it must refuse (not applicable, or ``ValueError``).

    Returns:
        The pass record of the application (``modified``, ``stats``, ``note``, ``ms``).

    Raises:
        ContractError: A rule is broken.
    """
    cls = registry.seasoning(name)
    what = f"seasoning '{name}'"
    if cls.info.name != name:
        raise ContractError(f"{what}: registered under another name than info.name "
                            f"'{cls.info.name}'")
    seasoning = cls(dict(params or {}))
    try:
        pickle.dumps(seasoning)
        again = copy.deepcopy(seasoning)  # rebuilt through the same reduce protocol
    except Exception as e:
        raise ContractError(f"{what}: an instance does not pickle ({e}); a seasoning "
                            "holds only its parameters (CONTRIBUTING): keep nothing else on "
                            "self") from e
    if dict(again.params) != dict(seasoning.params):
        raise ContractError(f"{what}: its parameters change when copied")
    for other in registry.backends:
        if cls.info.backends and other not in cls.info.backends:
            instance = registry.backend(other)()
            if seasoning.why_not(None, instance) is None:
                raise ContractError(f"{what}: offered on backend '{other}', outside its "
                                    f"info.backends")
    route = Route((Step(name, tuple(sorted((params or {}).items()))),))
    records, data = [], []
    for attempt in (1, 2):
        candidate = _candidate(registry, Path(model), workdir / f"apply{attempt}", backend)
        try:
            model_bytes, passes, _ = candidate.applier.apply(route)
        except RoutetuneError as e:
            raise ContractError(f"{what}: does not apply to {model}: {e}") from e
        except Exception as e:
            raise ContractError(f"{what}: crashed on {model}: {type(e).__name__}: {e}") from e
        records.append(passes[-1])
        data.append(model_bytes)
    if data[0] != data[1]:
        raise ContractError(f"{what}: applied twice to {model}, it gave different models "
                            "(not deterministic)")
    if refused is not None:
        candidate = _candidate(registry, Path(refused), workdir / "refused", backend)
        try:
            candidate.applier.apply(route)
        except RoutetuneError as e:
            _one_line(what, str(e))
        except Exception as e:
            raise ContractError(f"{what}: crashed on {refused} instead of refusing it: "
                                f"{type(e).__name__}: {e}") from e
        else:
            raise ContractError(f"{what}: applied to {refused}, which it should refuse")
    return records[0]


def _candidate(registry: Registry, model: Path, workdir: Path, backend_name: str):  # noqa: ANN202
    """A `routetune.candidate.candidate.Candidate` as the search makes one, for `model`."""
    from routetune.candidate.candidate import with_preflight
    from routetune.candidate.records import TrialInputs
    from routetune.feeds.inputs import synthesize
    from routetune.model.loading import prepare
    from routetune.run.preparation import reference_backend

    prepared = prepare(model)
    shapes = {s.name: tuple(d if isinstance(d, int) else 1 for d in s.shape)
              for s in prepared.inputs}
    feeds = synthesize(prepared.inputs, shapes, count=2)
    backend = registry.backend(backend_name)()
    reference = reference_backend(registry, backend)
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = TrialInputs(prepared, backend.name, None, tuple(feeds), (), {}, workdir,
                         prepared.data)
    candidate, _ = with_preflight(registry, inputs, backend, reference)
    return candidate


def check_backend(registry: Registry, name: str, model: Path | str, workdir: Path) -> None:
    """Check a backend: build, open and run `model`, and refuse a bad option in one line.

    Rules: its version and device are non-empty text; its default settings are complete
    (`Backend.full_settings` of nothing); an unknown option is refused with one line;
    the engine it builds runs on seeded inputs and gives every output of the model,
    with the model's output shapes where they are fixed; a runner gives a callable to
    time (`Runner.prepare`).

    Raises:
        ContractError: A rule is broken.
    """
    from routetune.candidate.artifacts import open_engine
    from routetune.errors import BackendError

    what = f"backend '{name}'"
    candidate = _candidate(registry, Path(model), workdir, name)
    backend = candidate.backend
    if backend.available():
        raise ContractError(f"{what}: not available here ({backend.available()})")
    for label in ("version", "device"):
        value = getattr(backend, label)()
        if not isinstance(value, str) or not value:
            raise ContractError(f"{what}: {label}() gave {value!r}, not text")
    settings = backend.full_settings({})
    try:
        backend.full_settings({f"{name}.no_such_option": 1})
    except BackendError as e:
        _one_line(what, str(e))
    else:
        raise ContractError(f"{what}: accepted an unknown option '{name}.no_such_option'")
    path = candidate.save_model(candidate.inputs.base_data)
    engine = candidate.engine(path, settings, "", "")
    with open_engine(backend, engine) as runner:
        for feed in candidate.inputs.feeds:
            outputs = runner.infer(feed)
            for spec in candidate.inputs.model.outputs:
                if spec.name not in outputs:
                    raise ContractError(f"{what}: output '{spec.name}' missing")
                shape = np.shape(outputs[spec.name])
                fixed = all(isinstance(d, int) for d in spec.shape)
                if fixed and spec.dtype is not None and shape != tuple(spec.shape):
                    raise ContractError(f"{what}: output '{spec.name}' has shape {shape}, "
                                        f"the model says {tuple(spec.shape)}")
        if not callable(runner.prepare(candidate.inputs.feeds[0])):
            raise ContractError(f"{what}: Runner.prepare did not return a callable")


def check_strategy(registry: Registry, name: str, space: RouteSpace,
                   max_asks: int = 10_000, options: Mapping[str, Any] | None = None,
                   prior: Prior | None = None) -> list[Route]:
    """Check a search strategy: it ends, asks only routes of the space, and repeats itself.

    Its `Options` must be a frozen dataclass of `option` fields whose defaults keep
    their own types and bounds. It is driven twice from scratch with the same synthetic
    trials (every route accurate, each step 10% faster); both drives must ask the same
    routes in the same order (determinism), every route must be in `space`, and it must
    stop asking within `max_asks` batches.

    Args:
        registry: The plugins, the strategy's among them (`registry_with`).
        name: The strategy's name.
        space: The routes it may ask for, e.g. ``RouteSpace([registry.seasoning(
            "ort-threads").info], 1)`` (`routetune.routes.composer.RouteSpace`).
        max_asks: Batches it must have stopped asking by.
        options: Option values to drive it with (checked like ``--search-option``);
            its defaults when None.
        prior: A route memory's prior to give it before the first ask
            (`routetune.search.strategy.Strategy.learn`); none when None.

    Returns:
        The routes it asked for, in order.

    Raises:
        ContractError: A rule is broken.
    """
    from routetune.records.trial import Status, Trial
    from routetune.timing.measure import Latency

    what = f"strategy '{name}'"
    declared: Any = registry.strategy(name).Options
    params = getattr(declared, "__dataclass_params__", None)  # set by @dataclass
    if params is None or not params.frozen:
        raise ContractError(f"{what}: Options must be a frozen dataclass of option() fields")
    loose = {f.name for f in dataclasses.fields(declared)} - {
        o.name for o in options_of(declared)}
    if loose:
        raise ContractError(f"{what}: Options field(s) {', '.join(sorted(loose))} are not "
                            "declared with routetune.options.option (no help, no "
                            "checks, no recipe or --search-option spelling)")
    try:
        declared()
    except TypeError as e:
        raise ContractError(f"{what}: every option needs a default ({e})") from e
    for info in options_of(declared):
        why = problem(info, info.default)
        try:
            check_keyword(info, info.default)
        except UsageError as e:
            why = str(e).partition(": ")[2]
        if why:
            raise ContractError(f"{what}: the default of option '{info.name}' "
                                f"({info.default!r}) {why}")
    from routetune.search.strategy import Result, configure

    chosen = configure(registry.strategy(name), dict(options or {}))
    allowed = set(space.routes())
    base_ms = 10.0

    def trial(route: Route) -> Result:
        ms = base_ms * 0.9 ** len(route)
        lat = Latency(10, ms, ms, ms, ms, ms * 0.99, ms * 1.01)
        base = Latency(10, base_ms, base_ms, base_ms, base_ms, base_ms * 0.99,
                       base_ms * 1.01)
        return Result.of(Trial(str(route), "m", str(route), "b", "d", "s", Status.OK,
                               latency=lat, base_latency=base))

    drives: list[list[Route]] = []
    for _ in range(2):
        strategy = registry.strategy(name)(space, chosen)
        if prior is not None:
            strategy.learn(prior)
        strategy.tell(Route(), trial(Route()))
        asked: list[Route] = []
        for _ in range(max_asks):
            batch = strategy.ask()
            if not batch:
                break
            for route in batch:
                if route not in allowed:
                    raise ContractError(f"{what}: asked for '{route}', not in the space")
                asked.append(route)
                strategy.tell(route, trial(route))
        else:
            raise ContractError(f"{what}: still asking after {max_asks} batches")
        drives.append(asked)
    if drives[0] != drives[1]:
        raise ContractError(f"{what}: two drives with the same trials asked different "
                            "routes (not deterministic)")
    return drives[0]


def check_metric(registry: Registry, name: str, seed: int = 0,
                 sizes: Sequence[int] = (1, 7, 1000)) -> None:
    """Check an accuracy metric on seeded arrays.

    Rules: identical outputs give its best value (within 1e-9, for rounding); every
    value lies in
    ``[lowest, highest]``; the same arrays give the same value; a NaN where the
    reference has one is no error; it can be parsed in an ``--accuracy`` bound. A task
    metric (`routetune.judging.metrics.TaskMetric`) also: identical input sets give its
    best value, and a NaN where the reference is finite makes its sample worst.

    Raises:
        ContractError: A rule is broken.
    """
    from routetune.judging.accuracy import parse_accuracy

    metric = registry.metric(name)
    what = f"metric '{name}'"
    rng = np.random.default_rng(seed)
    for n in sizes:
        ref = rng.standard_normal(n)
        out = ref + rng.standard_normal(n) * 0.01
        same = metric(ref, ref.copy(), 1e-3, 1e-3)
        if not math.isclose(same, metric.best, rel_tol=1e-9, abs_tol=1e-12):
            raise ContractError(f"{what}: identical arrays of {n} give {same}, not its best "
                                f"{metric.best}")
        value = metric(out, ref, 1e-3, 1e-3)
        if not metric.lowest <= value <= metric.highest:
            raise ContractError(f"{what}: {value} outside [{metric.lowest}, {metric.highest}]")
        if metric(out, ref, 1e-3, 1e-3) != value:
            raise ContractError(f"{what}: the same arrays gave two values")
    nan = np.array([np.nan, 1.0, 2.0])
    if not math.isclose(metric(nan, nan.copy(), 1e-3, 1e-3), metric.best, rel_tol=1e-9,
                        abs_tol=1e-12):
        raise ContractError(f"{what}: a NaN where the reference has one counts as an error")
    op = ">=" if metric.higher_is_better else "<="
    bound = metric.best - 0.5 * (metric.best - metric.worst) if np.isfinite(metric.worst) \
        else 1.0
    try:
        parse_accuracy(f"{name}{op}{bound:g}", registry, ["y"])
    except UsageError as e:
        raise ContractError(f"{what}: '{name}{op}{bound:g}' does not parse: {e}") from e
    if isinstance(metric, TaskMetric):
        _check_task_metric(metric, what, rng)


def _check_task_metric(metric: TaskMetric, what: str, rng: np.random.Generator) -> None:
    """The task-metric rules of `check_metric`, over several input sets.

    Identical sets give its best value; a sample with a NaN where the reference is
    finite scores worst; its default parameter is in its key.
    """
    refs = [rng.random((4, 6, 5)) for _ in range(3)]
    if not math.isclose(metric.measure(refs, [r.copy() for r in refs]), metric.best,
                        rel_tol=1e-9, abs_tol=1e-12):
        raise ContractError(f"{what}: identical input sets do not give its best {metric.best}")
    outs = [r.copy() for r in refs]
    outs[1][0, 0, 0] = np.nan
    scores = metric.sample_scores(outs[1], refs[1])
    if not len(scores) or metric.worst not in scores:
        raise ContractError(f"{what}: a NaN where the reference is finite spoils no sample")
    if metric.param is not None and metric.key() != f"{metric.name}@{metric.param.default:g}":
        raise ContractError(f"{what}: its default key is {metric.key()!r}")
