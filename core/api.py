"""The Python API: ``routetune.tune(model, ...)``, the same run as ``routetune tune``."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from routetune.errors import UsageError
from routetune.options import check_keyword, options_of
from routetune.plugin_manager import load_registry
from routetune.run.recipe import merge
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import TuneResult

if TYPE_CHECKING:
    from routetune.run.backends import BackendsResult
from routetune.execution.main_guard import refuse_in_worker
from routetune.run.tuning import tune as _tune


def tune(model: str | Path | None = None, **options: Any) -> TuneResult | BackendsResult:
    """Tune an ONNX model and keep the fastest route that meets the accuracy constraint.

    The same run as ``routetune tune``: it writes the winner, the trial store and the
    reports into the output directory, resumes from stored trials, and never returns
    None (when nothing is accurate, the base route wins, flagged by its reason).

    Every option of `routetune.run.run_spec.RunSpec` is a keyword, named as its field (its
    help is the flag's in ``routetune tune --help``). An argument given (not None)
    overrides the recipe's field; one left out takes the recipe's value, or the default.

    Args:
        model: The ONNX file; or None with ``example=`` or a recipe.
        **options: ``recipe`` (a recipe file), ``example``, ``output``, ``keep``
            (``all``, ``front``, ``winner``), ``backend``
            (``onnxruntime``, ``onnxruntime-cuda``, ``tensorrt``, ``openvino`` or a plugin's),
            ``seasonings`` (names, a list or a comma-separated string), ``search``
            (``beam``, ``exhaustive``, ``one-at-a-time``, ``mixed``, ``learned`` or a
            plugin's), ``memory`` (a route memory file, or ``"off"``),
            ``search_options`` (the strategy's own options, a dict), ``beam_width``,
            ``max_depth``, ``accuracy`` (e.g. ``"cos>=0.999"``), ``inputs`` (an
            ``.npz`` file or folder of them: input name → array), ``shapes``
            (``"x:1x3x224x224"``), ``min_shapes``, ``opt_shapes``, ``max_shapes``, a
            decoder's ``objective`` (``decode``, ``prefill``), ``cache_tokens``,
            ``prompt_tokens``, ``generate_tokens`` and ``tokens`` (a ``.npy`` of ids or a
            text file), ``space``, ``routes``, ``base``, ``backend_options``, ``model_sha256``,
            ``fresh``, ``max_trials``, ``time_budget_s`` (s), ``min_runs``,
            ``min_time_s`` (s), ``latency`` (``device``, ``end-to-end``), ``race``
            (bool: stop timing a candidate that cannot win), ``build_workers``,
            ``trial_timeout_s`` (s), ``worker_memory_mb`` (MiB),
            ``in_process``, ``executor`` (``local``, ``ray``), ``ray_address``,
            ``min_speedup``, ``confirm_repeats``,
            ``busy_machine`` (``wait``, ``warn``, ``ignore``),
            ``allow_external_data_outside``, ``reference_outputs`` (a saved
            reference: an ``.npz`` file or folder, or Polygraphy's ``.json``),
            ``custom_op_libraries`` (paths, or ``"onnxruntime-extensions"``: registered
            with every ONNX Runtime session), ``plugin_libraries`` (TensorRT plugin
            libraries: loaded before every parse and deserialization).

    Returns:
        The `TuneResult`: ``winner``, ``trials`` (winner first), ``to_dataframe()``,
        ``report(path)``. With several backends (``backend="onnxruntime,openvino"``), a
        `routetune.run.backends.BackendsResult`: each backend's `TuneResult` (``runs``),
        the engines timed side by side (``contenders``) and the ``winner``.

    Raises:
        UsageError: Bad input (an unknown option, model, backend, seasoning, accuracy
            expression, inputs or shapes), with the CLI's one-line messages, naming
            the keyword (``routetune.tune(max_trials=...)``) or the recipe field.
        StorageError: The trial store cannot be opened or written.
    """
    refuse_in_worker()  # a script without the __main__ guard, run again by a worker
    declared = {o.name: o for o in options_of(RunSpec)}
    unknown = sorted(set(options) - set(declared))
    if unknown:
        close = difflib.get_close_matches(unknown[0], declared, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UsageError(f"routetune.tune: unknown option '{unknown[0]}'; {hint}known: "
                         + ", ".join(sorted(declared)))
    given = {name: check_keyword(declared[name], value)
             for name, value in {"model": model, **options}.items() if value is not None}
    registry = load_registry()
    spec = merge(given, "api", registry)
    if "," in spec.backend:  # several backends: `routetune.run.backends`
        from routetune.run.backends import tune_backends

        return tune_backends(spec, registry)
    return _tune(spec, registry)
