"""`TuneOptions` from command-line flags and a recipe: flags given override the recipe."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from routetune.errors import UsageError
from routetune.measure import MeasureSettings
from routetune.recipe import load_recipe, recipe_options
from routetune.registry import Registry
from routetune.tuning import TuneOptions

FLAG_NAMES = {"time_budget_s": "time_budget", "trial_timeout_s": "trial_timeout",
              "worker_memory_mb": "worker_memory"}
"""TuneOptions fields whose command-line parameter has another name."""


def tune_options(flags: Mapping[str, Any], recipe: Path | None, registry: Registry,
                 given: Callable[[str], bool]) -> TuneOptions:
    """Merge a recipe and the command line into `TuneOptions`.

    Every field comes from the recipe where it sets one, unless the flag was given on
    the command line (`given`); without a recipe, from the flags. ``--space`` terms are
    merged into the recipe's parameter spaces, per parameter. ``--min-runs`` and
    ``--min-time`` override the recipe's ``[measure]`` one by one.

    Args:
        flags: `TuneOptions` field name to the flag's value (``min_runs`` and
            ``min_time`` for the measurement settings).
        recipe: The ``--recipe`` file, or None.
        registry: The installed plugins, to validate the recipe against.
        given: Whether the command-line parameter of that name was given.

    Raises:
        UsageError: The recipe does not validate (one line, field by field).
    """
    measure = MeasureSettings(min_runs=flags["min_runs"], min_time_s=flags["min_time"])
    values = {k: v for k, v in flags.items() if k not in ("min_runs", "min_time")}
    values["measure"] = measure
    if recipe is None:
        return TuneOptions(**values)
    from_recipe = recipe_options(load_recipe(recipe, registry), recipe)
    names = {f.name for f in fields(TuneOptions)}
    merged = {k: v for k, v in from_recipe.items() if k in names}
    for name, value in values.items():
        if name == "measure":
            continue
        if name == "space":
            merged["space"] = _merge_space(merged.get("space", {}), value)
        elif given(FLAG_NAMES.get(name, name)) or name not in merged:
            merged[name] = value
    if given("seasonings") and merged.get("seasonings") is not None:
        keep = set(merged["seasonings"])  # the recipe's spaces of seasonings left out go
        merged["space"] = {k: v for k, v in merged.get("space", {}).items() if k in keep}
    base = merged.get("measure", measure)
    merged["measure"] = MeasureSettings(
        min_runs=measure.min_runs if given("min_runs") else base.min_runs,
        min_time_s=measure.min_time_s if given("min_time") else base.min_time_s)
    if given("model") or given("example"):  # a model from the command line replaces both
        merged["model"], merged["example"] = values["model"], values["example"]
        merged["model_sha256"] = None
    return TuneOptions(**merged)


def _merge_space(recipe: Mapping[str, Mapping[str, tuple]], cli: Mapping[str, Mapping[str, tuple]]
                 ) -> dict[str, dict[str, tuple]]:
    out = {k: dict(v) for k, v in recipe.items()}
    for name, params in cli.items():
        out.setdefault(name, {}).update(params)
    return out


RECIPE_FIELDS = {
    "--inputs": "[inputs] path", "--shapes": "[inputs] shapes",
    "--min-shapes": "[inputs] min_shapes", "--opt-shapes": "[inputs] opt_shapes",
    "--max-shapes": "[inputs] max_shapes", "--accuracy": "[accuracy]",
    "--max-trials": "[search] max_trials", "--time-budget": "[search] time_budget_s",
    "--beam-width": "[search] beam_width", "--max-depth": "[search] max_depth",
    "--search": "[search] strategy", "--backend": "[backend] name",
    "--seasonings": "[[seasonings]]", "--output": "output",
    "--min-speedup": "[measure] min_speedup", "--busy-machine": "[measure] busy_machine",
}
"""Each flag's recipe field, for messages about values that came from a recipe."""


def blame_recipe(error: UsageError, recipe: Path, given: Callable[[str], bool]) -> UsageError:
    """`error` reworded to name the recipe field when its flag was not on the command line.

    A message such as ``--inputs data.npz: no such file`` then reads
    ``r.toml [inputs] path data.npz: no such file``.
    """
    text = str(error)
    for flag, field in RECIPE_FIELDS.items():
        if text.startswith(flag) and not given(flag.removeprefix("--").replace("-", "_")):
            return UsageError(f"{recipe} {field}{text.removeprefix(flag)}")
    return error
