"""The Python API: ``routetune.tune(model, ...)``, the same run as ``routetune tune``."""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

from routetune.accuracy import DEFAULT_ACCURACY
from routetune.errors import UsageError
from routetune.measure import MeasureSettings
from routetune.options import FLAG_NAMES, tune_options
from routetune.plugin_manager import load_registry
from routetune.tuning import TuneOptions, TuneResult
from routetune.tuning import tune as _tune

TYPES: dict[str, tuple[type, ...]] = {
    "beam_width": (int,), "max_depth": (int,), "max_trials": (int,), "min_runs": (int,),
    "time_budget_s": (int, float), "min_time": (int, float),
    "example": (str,), "shapes": (str,), "min_shapes": (str,), "opt_shapes": (str,),
    "max_shapes": (str,), "output": (str, Path), "model_sha256": (str,),
    "routes": (tuple, list, str), "base": (tuple, list, str), "space": (dict,),
    "backend_options": (dict,), "fresh": (bool,), "build_workers": (int,),
    "trial_timeout_s": (int, float), "worker_memory_mb": (int,), "in_process": (bool,),
    "min_speedup": (int, float), "busy_machine": (str,), "allow_external_data_outside": (bool,),
}
"""The types `tune`'s keyword options take (anything else is refused up front)."""


def tune(
    model: str | Path | None = None,
    *,
    backend: str | None = None,
    inputs: str | Path | None = None,
    accuracy: str | None = None,
    search: str | None = None,
    seasonings: str | list[str] | tuple[str, ...] | None = None,
    recipe: str | Path | None = None,
    **options: Any,
) -> TuneResult:
    """Tune an ONNX model and keep the fastest route that meets the accuracy constraint.

    The same run as ``routetune tune``: it writes the winner, the trial store and the
    reports into the output directory, resumes from stored trials, and never returns
    None (when nothing is accurate, the base route wins, flagged by its reason).

    An argument given (not None) overrides the recipe's field; one left out takes the
    recipe's value, or the default.

    Args:
        model: The ONNX file; or None with ``example=`` or a recipe.
        backend: ``onnxruntime`` (the default), ``onnxruntime-cuda``, ``tensorrt`` or a
            plugin's.
        inputs: Validation inputs: an ``.npz`` file (input name → array of the
            model's dtype and a shape it accepts) or a folder of them; None to
            synthesise them from ``shapes=``.
        accuracy: The constraint against the FP32 reference, e.g. ``"cos>=0.999"``;
            default `routetune.accuracy.DEFAULT_ACCURACY`.
        search: ``beam`` (the default), ``exhaustive``, ``one-at-a-time``, ``mixed`` or
            a plugin's.
        seasonings: Seasoning names (a list or a comma-separated string); None for
            every applicable one.
        recipe: A recipe file; the arguments given here override its fields.
        **options: Any other `TuneOptions` field: ``example``, ``output``, ``shapes``
            (``"x:1x3x224x224"``), ``min_shapes``, ``opt_shapes``, ``max_shapes``,
            ``beam_width``, ``max_depth``, ``max_trials``, ``time_budget_s`` (seconds),
            ``space``, ``routes``, ``base``, ``backend_options``, ``fresh``,
            ``build_workers``, ``trial_timeout_s``, ``worker_memory_mb``, ``in_process``,
            ``min_speedup``, ``busy_machine`` (``wait``, ``warn``, ``ignore``),
            ``allow_external_data_outside``, and ``min_runs`` / ``min_time`` (s) for
            the measurement.

    Returns:
        The `TuneResult`: ``winner``, ``trials`` (winner first), ``to_dataframe()``,
        ``report(path)``.

    Raises:
        UsageError: Bad input (an unknown option, model, backend, seasoning, accuracy
            expression, inputs or shapes), with the same one-line messages as the CLI.
        StorageError: The trial store cannot be opened or written.
    """
    known = {f.name for f in fields(TuneOptions)} - {"measure"} | {"min_runs", "min_time"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"routetune.tune: unknown option '{unknown[0]}'; known: "
                         + ", ".join(sorted(known)))
    for name, value in options.items():
        want = TYPES.get(name, (object,))
        ok = isinstance(value, want) and (bool in want or not isinstance(value, bool))
        if want and value is not None and not ok:
            names = " or ".join(t.__name__ for t in want)
            raise UsageError(f"routetune.tune: {name}={value!r} must be {names}")
    for name, value, want in (("model", model, (str, Path)), ("inputs", inputs, (str, Path)),
                              ("backend", backend, (str,)), ("accuracy", accuracy, (str,)),
                              ("search", search, (str,)), ("recipe", recipe, (str, Path)),
                              ("seasonings", seasonings, (str, list, tuple))):
        if value is not None and not isinstance(value, want):
            names = " or ".join(t.__name__ for t in want)
            raise UsageError(f"routetune.tune: {name}={value!r} must be {names}")
    if isinstance(seasonings, str):
        seasonings = [s.strip() for s in seasonings.split(",") if s.strip()]
    for key in ("routes", "base"):  # one route text is a route, not letters
        if isinstance(options.get(key), str):
            options[key] = (options[key],)
    named = {"model": (model, None), "backend": (backend, "onnxruntime"),
             "inputs": (inputs, None), "accuracy": (accuracy, DEFAULT_ACCURACY),
             "search": (search, "beam"), "seasonings": (seasonings, None)}
    explicit = set(options) | {k for k, (value, _) in named.items() if value is not None}
    flags: dict[str, Any] = {f.name: _default(f) for f in fields(TuneOptions)
                             if f.name != "measure"}
    flags.update(min_runs=MeasureSettings.min_runs, min_time=MeasureSettings.min_time_s)
    flags.update({k: default if value is None else value
                  for k, (value, default) in named.items()}, **options)
    flags["seasonings"] = tuple(seasonings) if seasonings is not None else None
    for key in ("model", "output", "inputs"):
        if isinstance(flags.get(key), str):
            flags[key] = Path(flags[key])
    registry = load_registry()
    opts = tune_options(flags, Path(recipe) if recipe is not None else None, registry,
                        given=lambda name: {v: k for k, v in FLAG_NAMES.items()}.get(name, name)
                        in explicit)
    return _tune(opts, registry)


def _default(f: Field[Any]) -> Any:
    """A dataclass field's default value (from its default factory, if it has one)."""
    if f.default is not MISSING:
        return f.default
    assert f.default_factory is not MISSING, f.name
    return f.default_factory()
