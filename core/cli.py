"""The ``routetune`` command line (typer). Bad input exits 2 with one line, no traceback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from routetune import signals
from routetune.accuracy import DEFAULT_ACCURACY
from routetune.errors import RoutetuneError, UsageError
from routetune.measure import MeasureSettings
from routetune.plugin_manager import load_registry
from routetune.search.local_pool import DEFAULT_TIMEOUT_S
from routetune.space import parse_space
from routetune.verdict import DEFAULT_MIN_SPEEDUP, FAILED

if TYPE_CHECKING:
    from routetune.preparation import Prepared

# The tuner (ONNX, the recipe schema, the tables) is imported by the commands that use
# it, so that `routetune --help` and `routetune seasonings` start fast.

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
    help="Find the fastest engine for an ONNX model that still meets an accuracy constraint.",
)
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)

EXIT_PASS_BROKE = 3
"""``routetune build``'s exit code when a pass wrote an invalid model or crashed: neither
the user's input (2) nor an engine that does not match (1)."""


@app.command("tune")
def tune_command(
    ctx: typer.Context,
    model: Annotated[Path | None, typer.Argument(help="ONNX model file.")] = None,
    recipe: Annotated[Path | None, typer.Option(help="A recipe (TOML, `routetune schema`); flags given as well override its fields.")] = None,
    example: Annotated[str | None, typer.Option(help="Bundled example model, e.g. ppocr-det.")] = None,
    output: Annotated[Path | None, typer.Option(help="Output directory (default: routetune-out/STEM-SHA8-BACKEND, one per model and backend).")] = None,
    backend: Annotated[str, typer.Option(help="Backend that builds and runs engines.")] = "onnxruntime",
    seasonings: Annotated[str | None, typer.Option(help="Restrict the space to these seasonings, comma-separated (default: all applicable).")] = None,
    search: Annotated[str, typer.Option(help="Search strategy: beam, exhaustive, one-at-a-time or mixed.")] = "beam",
    beam_width: Annotated[int, typer.Option(help="Routes kept per depth by beam search.")] = 3,
    max_depth: Annotated[int, typer.Option(help="Seasonings per route at most.")] = 3,
    accuracy: Annotated[str, typer.Option(help="Accuracy constraint, e.g. 'cos>=0.999' or 'out0:linf<=0.01'.")] = DEFAULT_ACCURACY,
    inputs: Annotated[Path | None, typer.Option(help="Validation inputs: an .npz file or a directory of them.")] = None,
    shapes: Annotated[str | None, typer.Option(help="Shapes of dynamic inputs, trtexec style: x:1x3x320x320 (min, opt and max at once).")] = None,
    min_shapes: Annotated[str | None, typer.Option(help="Optimisation profile min shapes (default: opt).")] = None,
    opt_shapes: Annotated[str | None, typer.Option(help="Optimisation profile opt shapes; accuracy and latency are taken here (default: --shapes).")] = None,
    max_shapes: Annotated[str | None, typer.Option(help="Optimisation profile max shapes (default: opt).")] = None,
    space: Annotated[list[str] | None, typer.Option(help="Values to search for one parameter: SEASONING:PARAM=V1|V2 (repeatable).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh/--resume", help="Ignore stored trials (the old store is moved aside), or reuse them.")] = False,
    max_trials: Annotated[int | None, typer.Option(help="Stop after this many trials.")] = None,
    time_budget: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    min_runs: Annotated[int, typer.Option(help="Timed runs per candidate, at least.")] = MeasureSettings.min_runs,
    min_time: Annotated[float, typer.Option(help="Seconds of timed runs per candidate, at least.")] = MeasureSettings.min_time_s,
    build_workers: Annotated[int, typer.Option(help="Builds run at once, each in a worker process.")] = 1,
    trial_timeout: Annotated[float, typer.Option(help="Seconds each trial phase (build; run, check and time) may take before its worker is killed (status timed-out).")] = DEFAULT_TIMEOUT_S,
    worker_memory: Annotated[int | None, typer.Option(help="Address-space limit per worker process in MiB (RLIMIT_AS); a trial over it is crashed. Not for GPU backends.")] = None,
    in_process: Annotated[bool, typer.Option("--in-process", help="Run trials in this process, one at a time, without isolation or timeouts (for debugging plugins).")] = False,
    min_speedup: Annotated[float, typer.Option(help="A route wins only if the lower end of its confirmed speed-up's 95% interval is above this.")] = DEFAULT_MIN_SPEEDUP,
    busy_machine: Annotated[str, typer.Option(help="While other processes load the machine: wait (for quiet, then measure), warn (measure, mark noisy) or ignore (noisy trials may win).")] = "wait",
    allow_external_data_outside: Annotated[bool, typer.Option("--allow-external-data-outside", help="Read a model whose external data files lie outside its folder (refused otherwise: see SECURITY.md).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each trial.")] = False,
) -> None:
    """Search the route space and keep the fastest route that meets the accuracy constraint."""
    from routetune.display import conditions_lines, trials_table
    from routetune.options import blame_recipe, tune_options
    from routetune.tuning import tune

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    registry = load_registry()
    flags = {
        "model": model, "example": example, "output": output, "backend": backend,
        "seasonings": tuple(s.strip() for s in seasonings.split(",") if s.strip())
        if seasonings is not None else None,
        "search": search, "beam_width": beam_width, "max_depth": max_depth,
        "accuracy": accuracy, "inputs": inputs, "shapes": shapes, "min_shapes": min_shapes,
        "opt_shapes": opt_shapes, "max_shapes": max_shapes, "space": parse_space(space or ()),
        "fresh": fresh, "max_trials": max_trials, "time_budget_s": time_budget,
        "min_runs": min_runs, "min_time": min_time, "build_workers": build_workers,
        "trial_timeout_s": trial_timeout, "worker_memory_mb": worker_memory,
        "in_process": in_process, "min_speedup": min_speedup, "busy_machine": busy_machine,
        "allow_external_data_outside": allow_external_data_outside,
    }
    opts = tune_options(flags, recipe, registry,
                        given=lambda name: _given(ctx, name))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=False)
    task = progress.add_task("tuning", total=None)

    started = False

    def on_start(run: Prepared, planned: int | None) -> None:
        nonlocal started
        err.print(f"model {run.model.source} (sha256 {run.model.source_sha256[:16]}), "
                  f"backend {run.backend.name} {run.backend.version()} on {run.backend.device()}")
        if run.base_passes:
            steps = ", ".join(
                f"{p['step']} ({', '.join(f'{k} {v}' for k, v in p['stats'].items() if v)})"
                if any(p["stats"].values()) else p["step"] for p in run.base_passes)
            err.print(f"preflight of {run.backend.name}: {escape(steps)}")
        size, offered = run.space.size(), len(run.space.infos)
        total = None if planned is None else planned + 1  # the base route first
        err.print(f"route space: {size} route{'s' * (size != 1)} from {offered} "
                  f"seasoning{'s' * (offered != 1)}; search {opts.search}, "
                  + (f"up to {total} trials" if total else "number of trials not known"))
        progress.update(task, total=total)
        progress.start()
        started = True

    def on_status(text: str) -> None:
        progress.update(task, description=text[:100])

    def on_trial(trial, cached: bool) -> None:  # noqa: ANN001
        total = progress.tasks[0].total
        if total is not None and progress.tasks[0].completed + 1 > total:
            progress.update(task, total=total + 1)  # repair trials come on top of the plan
        noisy = " (noisy: machine busy)" if trial.noisy else ""
        progress.update(task, advance=1, description=f"{'stored ' if cached else ''}{trial.route}"[:60] + noisy)

    try:
        result = tune(opts, registry, on_start, on_trial, on_status)
    except UsageError as e:
        raise blame_recipe(e, recipe, lambda name: _given(ctx, name)) if recipe else e from e
    finally:
        if started:
            progress.stop()
    console.print(trials_table(list(result.trials), result.winner, registry,
                               title=f"{len(result.trials)} trials, winner first"))
    w = result.winner
    if result.stopped:
        console.print(f"[yellow]stopped early: {result.stopped}; the best so far stands[/]")
    console.print(f"winner: [bold]{escape(w.route)}[/bold] ({escape(result.winner_reason)})")
    for line in conditions_lines(result):
        console.print(line)
    records = result.files["run"].parent
    console.print(f"wrote {', '.join(p.name for p in result.files.values())} to {records}")
    if records != result.outdir:
        console.print(f"({result.outdir} holds another run's records, left as they were; the "
                      "trial store is shared)")
    if result.stopped and result.stopped.startswith("interrupted"):
        raise typer.Exit(signals.exit_code())  # 130 or 143, after the results are written
    if result.winner.status in FAILED:
        raise typer.Exit(1)  # nothing usable came out: scripts must notice


@app.command("report")
def report_command(
    outdir: Annotated[Path, typer.Argument(help="Output directory of a `routetune tune` run.")],
) -> None:
    """Write report.html, report.md and report.json from a run's trial store."""
    from routetune.report import write_reports

    paths = write_reports(outdir)
    console.print(f"wrote {', '.join(p.name for p in paths.values())} to {outdir}")


@app.command("seasonings")
def seasonings_command() -> None:
    """List the installed seasonings, backends, search strategies and metrics."""
    registry = load_registry()
    from routetune.display import components_table, seasonings_table

    console.print(seasonings_table(registry))
    console.print(components_table(registry))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether a flag was given on the command line (or by environment), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


@app.command("build")
def build_command(
    ctx: typer.Context,
    model: Annotated[Path | None, typer.Argument(help="ONNX model file (or from --recipe).")] = None,
    recipe: Annotated[Path | None, typer.Option(help="A recipe that pins one route, e.g. OUTDIR/winner.toml.")] = None,
    route: Annotated[str | None, typer.Option(help="The route to build, e.g. 'fp16,ort-threads{intra_op=2}'.")] = None,
    example: Annotated[str | None, typer.Option(help="Bundled example model.")] = None,
    output: Annotated[Path | None, typer.Option(help="Output directory (where the search wrote its trials).")] = None,
    backend: Annotated[str, typer.Option(help="Backend.")] = "onnxruntime",
    accuracy: Annotated[str, typer.Option(help="Accuracy constraint.")] = DEFAULT_ACCURACY,
    inputs: Annotated[Path | None, typer.Option(help="Validation inputs (.npz file or folder).")] = None,
    shapes: Annotated[str | None, typer.Option(help="Shapes of dynamic inputs.")] = None,
    allow_external_data_outside: Annotated[bool, typer.Option("--allow-external-data-outside", help="Read a model whose external data files lie outside its folder (refused otherwise: see SECURITY.md).")] = False,
) -> None:
    """Rebuild one route's engine and check its outputs against the stored ones.

    Exits 1 when a pass declines the route, the backend refuses it, the engine does not
    run, or the outputs do not match within the accuracy constraint; 3 when a pass
    wrote an invalid model or crashed (the pass is named); 2 on bad input.
    """
    from routetune.options import tune_options

    registry = load_registry()
    flags = {"model": model, "example": example, "output": output, "backend": backend,
             "accuracy": accuracy, "inputs": inputs, "shapes": shapes,
             "min_runs": MeasureSettings.min_runs, "min_time": MeasureSettings.min_time_s,
             "allow_external_data_outside": allow_external_data_outside}
    opts = tune_options(flags, recipe, registry, given=lambda name: _given(ctx, name))
    if route is None and recipe is None:
        raise UsageError("give --route TEXT or --recipe FILE (a recipe that pins one route)")
    from routetune.rebuild import rebuild

    done = rebuild(opts, route, registry)
    if done.broken:  # a pass's fault, not the user's: exit 3, one line naming it
        console.print(f"[red]not built: {escape(str(done.route))}: {escape(done.broken)} "
                      f"(log: {escape(str(done.log))})[/]", soft_wrap=True)
        raise typer.Exit(EXIT_PASS_BROKE)
    if done.failed:  # nothing to deploy: exit 1, one line
        console.print(f"[red]not built: {escape(str(done.route))}: {escape(done.failed)} "
                      f"(log: {escape(str(done.log))})[/]", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"built {escape(str(done.route))}: {done.engine_file} "
                  f"({done.engine_bytes} bytes, {done.build_ms / 1000:.2f} s)")
    if done.verdict is None:
        console.print(f"not run on this device, so not checked: {escape(done.not_run)}")
        return
    if done.verdict.passed:
        console.print(f"outputs match {done.compared_with} within the constraint")
        return
    console.print(f"[red]outputs do not match {escape(done.compared_with)}: "
                  f"{escape(done.verdict.reason)}[/]")
    raise typer.Exit(1)


@app.command("schema")
def schema_command() -> None:
    """Print the recipe format's JSON Schema (for editors that validate TOML)."""
    import json

    from routetune.recipe import json_schema

    print(json.dumps(json_schema(), indent=2))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``routetune`` script. Exits 2 on bad input, with one line.

    Bad flags (a missing argument, ``--max-depth abc``) come from the command-line
    framework; they are printed as one line too, with a pointer to ``--help``.
    """
    command = typer.main.get_command(app)
    signals.handle_sigterm()
    try:
        code = command.main(args=argv, prog_name="routetune", standalone_mode=False)
    except RoutetuneError as e:
        print(f"routetune: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print(f"routetune: interrupted ({signals.interrupted()}); every trial stored so far "
              "is kept (run the same command again to resume)", file=sys.stderr)
        sys.exit(signals.exit_code())
    except Exception as e:  # the framework's usage errors: ClickException and subclasses
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        message = " ".join(e.format_message().split())
        if message:  # empty after no-arguments help, which was printed already
            hint = " (see routetune --help)" if e.exit_code == 2 else ""
            print(f"routetune: error: {message}{hint}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
