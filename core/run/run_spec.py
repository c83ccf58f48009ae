"""`RunSpec`: what a run was asked to do, each option declared once, frozen and picklable.

The command line, a recipe and the Python API each give values;
`routetune.run.recipe.merge` combines them (what was given overrides the recipe, the
recipe overrides the defaults) into one `RunSpec`, which flows unchanged from the entry
point to the worker processes (`routetune.candidate.records.TrialInputs.spec`). The option
table is the dataclass itself (`routetune.options`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from routetune.candidate.records import TrialSettings
from routetune.errors import UsageError
from routetune.execution import DEFAULT_TIMEOUT_S
from routetune.feeds.decoder import DecoderSettings
from routetune.judging.accuracy import DEFAULT_ACCURACY
from routetune.judging.verdict import CONFIRM_REPEATS, DEFAULT_MIN_SPEEDUP
from routetune.libraries import Library
from routetune.options import (
    OptionError,
    OptionInfo,
    Source,
    option,
    options_of,
    problem,
    values_of,
)
from routetune.routes.route import parse_value
from routetune.timing.conditions import MODES
from routetune.timing.measure import MeasureSettings

if TYPE_CHECKING:
    pass

BOTH = ("tune", "build")

KEEP = ("all", "front", "winner")
"""``--keep`` choices (`routetune.run.pruning`)."""


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    """Seasoning names from ``"a,b"`` or a list."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(s.strip() for s in items if s.strip())


def _route_texts(value: str | Iterable[str]) -> tuple[str, ...]:
    """Route texts: one string is one route, not letters."""
    return (value,) if isinstance(value, str) else tuple(value)


def _path(value: str | Path) -> Path:
    return Path(value) if isinstance(value, str) else value


def _space(terms: list[str] | None) -> dict[str, dict[str, tuple[Any, ...]]]:
    from routetune.routes.space import parse_space

    return parse_space(terms or ())


def _pairs(terms: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` terms as a mapping; values as in route text (``2``, ``true``)."""
    out: dict[str, Any] = {}
    for term in terms or ():
        key, eq, text = term.partition("=")
        if not key.strip() or not eq or not text.strip():
            raise UsageError(f"--search-option '{term}': write KEY=VALUE, e.g. beam_width=4")
        out[key.strip()] = parse_value(text.strip(), f"--search-option '{term}'")
    return out


@dataclass(frozen=True)
class RunSpec:
    """Everything ``routetune tune`` takes, with the CLI's defaults (each field's help).

    Fields declared with `option` are options: the flag, recipe field and API keyword
    of each are in its declaration. The three fields after them record where the
    values came from, so that an error names the option as the user wrote it.
    """

    model: Path | None = option(
        None, help="ONNX model file.", argument=True, recipe="model.path", commands=BOTH,
        from_keyword=_path)
    recipe: Path | None = option(
        None, help="A recipe (TOML, `routetune schema`); options given as well override "
        "its fields.", commands=BOTH, from_keyword=_path)
    example: str | None = option(
        None, help="Bundled example model, e.g. ppocr-det.", recipe="model.example",
        commands=BOTH)
    output: Path | None = option(
        None, help="Output directory (default: routetune-out/STEM-SHA8-BACKEND, one per "
        "model and backend).", recipe="output", commands=BOTH, from_keyword=_path)
    keep: str = option(
        "front", help="Candidate models kept in OUTDIR/artifacts/models at the end: all, "
        "front (the winner's, the base route's and the accurate Pareto front's) or winner; "
        "a dropped one is made again from its route when needed.", recipe="keep",
        choices=KEEP)
    backend: str = option(
        "onnxruntime", help="Backend that builds and runs engines; several, comma-separated, "
        "are each searched and their winners timed side by side.", recipe="backend.name",
        commands=BOTH)
    seasonings: tuple[str, ...] | None = option(
        None, help="Restrict the space to these seasonings, comma-separated (default: all "
        "applicable).", recipe="seasonings", cli_type=str | None, from_cli=_names,
        from_keyword=_names)
    search: str = option(
        "beam", help="Search strategy: beam, exhaustive, one-at-a-time, mixed, learned "
        "(ordered by the route memory) or a plugin's.", recipe="search.strategy")
    search_options: Mapping[str, Any] = option(
        default_factory=dict, help="The search strategy's own options, by name (see "
        "`routetune seasonings`); on the command line KEY=VALUE, repeatable.",
        flag="--search-option",
        recipe="search.options", cli_type=list[str] | None, from_cli=_pairs)
    beam_width: int | None = option(
        None, help="Routes kept per depth by beam search (its beam_width option).",
        recipe="search.beam_width", minimum=1)
    max_depth: int | None = option(
        3, help="Seasonings per route at most.", recipe="search.max_depth", minimum=0,
        cli_type=int)
    accuracy: str = option(
        DEFAULT_ACCURACY, help="Accuracy constraint, e.g. 'cos>=0.999', "
        "'out0:linf<=0.01' or a task metric's 'mask_iou@0.3>=0.99' (an example's default "
        "is its own task constraint).", recipe="accuracy.expr", commands=BOTH)
    inputs: Path | None = option(
        None, help="Validation inputs: an .npz file or a directory of them.",
        recipe="inputs.path", commands=BOTH, from_keyword=_path)
    reference_outputs: Path | None = option(
        None, help="The FP32 reference from a file instead of a run here: an .npz of "
        "outputs per input set (a file, or a folder in --inputs' order), or Polygraphy's "
        "saved outputs (polygraphy run --save-outputs FILE.json).",
        recipe="accuracy.reference_outputs", commands=BOTH, from_keyword=_path)
    shapes: str | None = option(
        None, help="Shapes of dynamic inputs, trtexec style: x:1x3x320x320 (min, opt and "
        "max at once).", recipe="inputs.shapes", commands=BOTH)
    min_shapes: str | None = option(
        None, help="Optimisation profile min shapes (default: opt).",
        recipe="inputs.min_shapes")
    opt_shapes: str | None = option(
        None, help="Optimisation profile opt shapes; accuracy and latency are taken here "
        "(default: the shapes).", recipe="inputs.opt_shapes")
    max_shapes: str | None = option(
        None, help="Optimisation profile max shapes (default: opt).",
        recipe="inputs.max_shapes")
    space: Mapping[str, Mapping[str, tuple[Any, ...]]] = option(
        default_factory=dict, help="Values to search for one parameter: "
        "SEASONING:PARAM=V1|V2 (repeatable).", recipe="seasonings.params",
        cli_type=list[str] | None, from_cli=_space)
    routes: tuple[str, ...] = option(
        (), help="Route texts always tried, after the base route (pinned routes).",
        flag=None, recipe="routes", from_keyword=_route_texts)
    base: tuple[str, ...] = option(
        (), help="Route steps (graph and precision) applied to every route, the base "
        "route included (the pinned prefix).", flag=None, recipe="base",
        from_keyword=_route_texts)
    backend_options: Mapping[str, Any] = option(
        default_factory=dict, help="Build options every route starts from (backend "
        "option keys).", flag=None, recipe="backend.options")
    custom_op_libraries: tuple[str, ...] = option(
        (), help="A shared library of custom operators to register with every ONNX "
        "Runtime session (SessionOptions.register_custom_ops_library), repeatable; "
        "onnxruntime-extensions names that package's library. A library is code: only "
        "the ones named here are loaded.", flag="--custom-op-library",
        recipe="libraries.custom_ops", cli_type=list[str] | None,
        from_cli=lambda v: tuple(v or ()), from_keyword=_route_texts, commands=BOTH)
    plugin_libraries: tuple[str, ...] = option(
        (), help="A TensorRT plugin library to load into TensorRT's plugin registry "
        "before every parse and every engine's deserialization (trtexec's "
        "--dynamicPlugins), repeatable; tensorrt backend only. A library is code: only "
        "the ones named here are loaded.", flag="--plugin-library",
        recipe="libraries.plugins", cli_type=list[str] | None,
        from_cli=lambda v: tuple(v or ()), from_keyword=_route_texts, commands=BOTH)
    model_sha256: str | None = option(
        None, help="The sha256 the model file must have.", flag=None,
        recipe="model.sha256")
    fresh: bool = option(
        False, help="Ignore stored trials (the old store is moved aside), or reuse them.",
        flag="--fresh/--resume")
    memory: str | None = option(
        None, help="The route memory: a SQLite file of what earlier searches learned, "
        "which the learned search starts from and every run adds to (default: "
        "$ROUTETUNE_MEMORY, else memory.sqlite in routetune's cache, $ROUTETUNE_CACHE or "
        "~/.cache/routetune); off: none.", recipe="search.memory")
    max_trials: int | None = option(
        None, help="Stop after this many trials (the base route included).",
        recipe="search.max_trials", minimum=1)
    time_budget_s: float | None = option(
        None, help="Seconds of search: after them no trial starts and no built candidate "
        "starts measuring (a measurement running finishes); the winner's confirmation "
        "follows. An --example run: 300 s unless given.", recipe="search.time_budget_s",
        above=0)
    measure: MeasureSettings = option(
        default_factory=MeasureSettings, help="How long to time each candidate.",
        group=True)
    decoder: DecoderSettings = option(
        default_factory=DecoderSettings, help="A decoder's objective and the input sets "
        "routetune makes for it.", group=True)
    build_workers: int = option(
        1, help="Builds run at once, each in a worker process.")
    trial_timeout_s: float = option(
        DEFAULT_TIMEOUT_S, help="Seconds each trial phase (build; run, check and time) may "
        "take before its worker is killed (status timed-out).", above=0)
    worker_memory_mb: int | None = option(
        None, help="Address-space limit per worker process in MiB (RLIMIT_AS); a trial "
        "over it is crashed. Not for GPU backends.")
    in_process: bool = option(
        False, help="Run trials in this process, one at a time, without isolation or "
        "timeouts (for debugging plugins).", flag="--in-process")
    executor: str = option(
        "local", help="Where trials run: local (worker processes on this machine), ray "
        "(the nodes of a Ray cluster, see --ray-address; needs the ray extra) or a "
        "plugin's (`routetune seasonings` lists them).",
        recipe="executor.name")
    ray_address: str | None = option(
        None, help="The Ray cluster of --executor ray: its head's HOST:PORT, or auto (the "
        "cluster `ray start` started on this machine); default: start Ray here for the run.",
        recipe="executor.ray_address")
    min_speedup: float = option(
        DEFAULT_MIN_SPEEDUP, help="A route wins only if the lower end of its confirmed "
        "speed-up's 95% interval is above this.", recipe="measure.min_speedup", minimum=1.0)
    confirm_repeats: int = option(
        CONFIRM_REPEATS, help="Fresh processes a winner is confirmed in, one after "
        "another; it wins only if it clears --min-speedup in each.",
        recipe="measure.confirm_repeats", minimum=1)
    busy_machine: str = option(
        "wait", help="While other processes load the machine: wait (for quiet, then "
        "measure), warn (measure, mark noisy) or ignore (noisy trials may win).",
        recipe="measure.busy_machine", choices=MODES)
    allow_external_data_outside: bool = option(
        False, help="Read a model whose external data files lie outside its folder "
        "(refused otherwise: see SECURITY.md). Never from a recipe.",
        flag="--allow-external-data-outside", commands=BOTH)
    sources: Mapping[str, Source] = field(default_factory=dict)
    """Option name → where its value was written; options not in it took the default."""
    entry: Source = "api"
    """The front end: ``cli`` or ``api`` (how an option not given is spelled)."""

    def info(self, name: str) -> OptionInfo:
        """The declaration of option `name`."""
        return next(o for o in options_of(RunSpec) if o.name == name)

    def spelled(self, name: str) -> str:
        """Option `name` as the user wrote it: flag, recipe field or keyword."""
        return self.info(name).spelled(self.sources.get(name, self.entry), self.recipe)

    def reword(self, error: UsageError) -> UsageError:
        """`error` naming its option as the user wrote it (an `OptionError`), else as is."""
        if isinstance(error, OptionError):
            reworded = UsageError(self.spelled(error.option) + error.rest)
            reworded.__cause__ = error.__cause__
            return reworded
        return error

    @contextmanager
    def worded(self) -> Iterator[None]:
        """Reword the `OptionError` raised inside after where its option was written."""
        try:
            yield
        except UsageError as e:
            reworded = self.reword(e)
            if reworded is e:
                raise
            raise reworded from e

    @property
    def executor_name(self) -> str:
        """Where trials run: ``in-process`` with ``--in-process``, else ``--executor``."""
        return "in-process" if self.in_process else self.executor

    def trial_settings(self, libraries: tuple[Library, ...] = ()) -> TrialSettings:
        """What a candidate's work takes of these options (`TrialInputs.settings`).

        `libraries`: the custom-op libraries as checked (`routetune.libraries.resolve`).
        """
        return TrialSettings(self.measure, self.backend_options, self.busy_machine,
                             self.min_speedup, libraries)

    def check(self) -> None:
        """Check every option's value against its declared bounds and choices.

        Raises:
            OptionError: The first option out of bounds, e.g. ``--max-trials 0: must be
                1 or more``.
        """
        values = values_of(self)
        for info in options_of(RunSpec):
            value = values[info.name]
            why = problem(info, value)
            if why:  # 1.0 as the user wrote it: 1
                shown = f"{value:g}" if isinstance(value, float) else value
                raise OptionError(info.name, f" {shown}: {why}")


def defaults() -> dict[str, Any]:
    """Every option's default, by name."""
    return {o.name: o.default for o in options_of(RunSpec)}
