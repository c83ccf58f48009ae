"""The ``routetune`` command line (typer). Bad input exits 2 with one line, no traceback."""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from routetune import memory_cli, signals
from routetune.errors import RoutetuneError, UsageError, with_flag_value
from routetune.judging.verdict import FAILED
from routetune.options import options_of
from routetune.plugin_manager import load_registry
from routetune.run.recipe import merge
from routetune.run.run_spec import RunSpec

if TYPE_CHECKING:
    from routetune.registry import Registry
    from routetune.run.preparation import Prepared
    from routetune.run.tuning import Plan

F = TypeVar("F", bound=Callable[..., Any])

# The tuner (ONNX, the recipe schema, the tables) is imported by the commands that use
# it, so that `routetune --help` and `routetune seasonings` start fast.

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
    help="Find the fastest engine for an ONNX model that still meets an accuracy constraint.",
)
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)
"""Standard output: the terminal's width, or ``$COLUMNS``; else 200 columns in a pipe."""
err = Console(stderr=True,
              width=None if sys.stderr.isatty() or "COLUMNS" in os.environ else 200)
"""Standard error (the run's header, progress, errors): as `console`, for its stream."""

EXIT_PASS_BROKE = 3
"""``routetune build``'s exit code when a pass wrote an invalid model or crashed: neither
the user's input (2) nor an engine that does not match (1)."""


def _with_options(command: str, *extra: inspect.Parameter) -> Callable[[F], F]:
    """Give a command a parameter per option of `command` in `RunSpec`, then `extra`.

    The signature is made from the option declarations (`routetune.options`), so
    the flags, their help and defaults are declared once, in `RunSpec`.
    """
    def wrap(func: F) -> F:
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation=typer.Context)]
        for info in options_of(RunSpec):
            if command not in info.meta.commands or (info.flag is None
                                                      and not info.meta.argument):
                continue
            marker = typer.Argument(help=info.meta.help) if info.meta.argument else (
                typer.Option(info.flag, help=info.meta.help))
            default = None if info.meta.from_cli else info.default
            params.append(inspect.Parameter(
                info.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                annotation=Annotated[info.meta.cli_type or info.type, marker]))
        func.__signature__ = inspect.Signature([*params, *extra])  # type: ignore[attr-defined]
        return func
    return wrap


def _option(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)


def _spec(ctx: typer.Context, values: dict[str, Any], registry: Registry) -> RunSpec:
    """The run spec from the options given on the command line and the recipe."""
    given = {}
    for info in options_of(RunSpec):
        if info.name in values and _given(ctx, info.name):
            value = values[info.name]
            given[info.name] = info.meta.from_cli(value) if info.meta.from_cli else value
    return merge(given, "cli", registry)


LONG_S = 3600.0
"""A search planned to take longer than this (seconds, a lower bound) asks first."""

LARGE_SPACE = 10_000
"""A route space of more routes than this asks first, unless a budget bounds the search."""


def _confirm_size(run: Prepared, plan: Plan, opts: RunSpec, yes: bool) -> None:
    """Ask before a search that is larger than anyone meant (``--max-depth 1000``).

    The estimate is a lower bound: each trial measures for at least ``--min-time``,
    twice (the candidate and the base route alongside, `routetune.timing.measure`).

    Raises:
        UsageError: The user said no, at the terminal.
    """
    each_s = 2 * opts.measure.min_time_s
    estimate_s = (plan.trials or 0) * each_s
    if opts.time_budget_s is not None:
        estimate_s = min(estimate_s, opts.time_budget_s)
    size = run.space.size()
    bounded = opts.max_trials is not None or opts.time_budget_s is not None
    if yes or (estimate_s <= LONG_S and (size <= LARGE_SPACE or bounded)):
        return
    hours = f"{estimate_s / 3600:.1f} h" if estimate_s >= 3600 else f"{estimate_s / 60:.0f} min"
    err.print(f"[yellow]this search may try {plan} of a {size:,}-route space: at least "
              f"{hours} at {each_s:g} s or more per trial; bound it with --max-trials N, "
              "--time-budget S or a smaller --max-depth, or go on with --yes[/]")
    if not sys.stdin.isatty():
        err.print("(standard input is not a terminal: going on)")
        return
    if not typer.confirm("go on?", default=False, err=True):
        raise UsageError(f"stopped before the search ({size:,} routes); bound it with "
                         "--max-trials N or --time-budget S, or give --yes")


@app.command("tune")
@_with_options(
    "tune",
    _option("verbose", False, Annotated[bool, typer.Option(
        "--verbose", "-v", help="Log each trial, and print every trial at the end.")]),
    _option("yes", False, Annotated[bool, typer.Option(
        "--yes", "-y", help="Do not ask before a search planned to take over an hour, or "
        "of a route space over 10,000 routes.")]))
def tune_command(ctx: typer.Context, verbose: bool = False, yes: bool = False,
                 **values: Any) -> None:
    """Search the route space and keep the fastest route that meets the accuracy constraint."""
    from routetune.display import (
        accurate_table,
        conditions_lines,
        header_lines,
        phase_line,
        status_line,
        stopped_line,
        trials_table,
        winner_line,
    )
    from routetune.judging.constraint import HEADLINE
    from routetune.reporting.report_text import short_route
    from routetune.run.outdir import folder_bytes
    from routetune.run.tuning import tune

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    registry = load_registry()
    opts = _spec(ctx, values, registry)
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.fields[of]}"),
                        TimeElapsedColumn(), console=err, transient=False)
    task = progress.add_task("tuning", total=None, of="?")
    stored, reused = [0], [0]  # trials recorded; of them, read from the trial store
    signals.counting(lambda: stored[0])  # for the line of a second Ctrl-C

    started = False
    headline = HEADLINE
    phase: str | None = None  # a decoder's: its verdict in per-token figures

    def on_start(run: Prepared, plan: Plan) -> None:
        nonlocal started, headline, phase
        headline = run.constraint.headline(registry)
        phase = run.phase
        for line in header_lines(run, opts.search, plan):
            err.print(line)
        _confirm_size(run, plan, opts, yes)
        progress.reset(task, total=plan.trials, of=plan.count())  # once per backend
        progress.start()
        started = True

    def on_status(text: str) -> None:
        progress.update(task, description=text[:100])

    def on_trial(trial, cached: bool) -> None:  # noqa: ANN001
        stored[0] += 1
        reused[0] += cached
        total = progress.tasks[0].total
        if total is not None and progress.tasks[0].completed + 1 > total:
            progress.update(task, total=total + 1,  # repair trials come on top of the plan
                            of=f"about {total + 1}")
        noisy = " (noisy: machine busy)" if trial.noisy else ""
        progress.update(task, advance=1, description=(
            f"{'stored ' if cached else ''}{short_route(trial.route, 50)}{noisy}"))

    several = "," in opts.backend
    try:
        if several:
            from routetune.run.backends import tune_backends

            both = tune_backends(opts, registry, on_start, on_trial, on_status)
        else:
            result = tune(opts, registry, on_start, on_trial, on_status)
    finally:
        if started:
            progress.stop()
    if several:
        from routetune.display import backends_lines

        for line in backends_lines(both):
            console.print(line)
        if both.winner.trial.status in FAILED:
            raise typer.Exit(1)
        return
    if verbose:
        console.print(trials_table(list(result.trials), result.winner, registry,
                                   title=f"{len(result.trials)} trials, winner first"))
    else:
        console.print(accurate_table(result.trials, result.winner, registry,
                                     width=console.width, headline=headline))
    console.print(status_line(result.trials))
    if reused[0]:
        console.print(f"resumed: {reused[0]} of these trials came from the trial store "
                      "(trials.sqlite), not run again; --fresh runs every trial again")
    if result.stopped:
        console.print(f"[yellow]{stopped_line(result)}[/]")
    console.print(winner_line(result))
    if phase is not None:
        console.print(phase_line(result, phase))
    if opts.reference_outputs is not None:
        console.print(f"reference: every route was judged against the outputs in "
                      f"{escape(str(opts.reference_outputs))} ({opts.spelled('reference_outputs')}),"
                      " not against a run of the model here")
    for line in conditions_lines(result):
        console.print(line)
    records = result.files["run"].parent
    console.print(f"wrote {', '.join(p.name for p in result.files.values())} to {records}")
    pruned = result.pruned
    if pruned is not None and pruned.files:
        console.print(f"--keep {opts.keep}: kept the candidate models of {len(pruned.kept)} "
                      f"route{'s' * (len(pruned.kept) != 1)}, removed {pruned.files} files "
                      f"({pruned.bytes / 1e6:.1f} MB); a removed one is made again from its "
                      "route when needed")
    console.print(f"{result.outdir} holds {folder_bytes(result.outdir) / 1e6:.1f} MB")
    if not verbose:
        console.print(f"every trial: routetune show {records} --all, or {records}/report.html")
    if records != result.outdir:
        console.print(f"({result.outdir} holds another run's records, left as they were; the "
                      "trial store is shared)")
    if result.stopped and result.stopped.startswith("interrupted"):
        signals.answered()
        raise typer.Exit(signals.exit_code())  # 130 or 143, after the results are written
    if result.winner.status in FAILED:
        raise typer.Exit(1)  # nothing usable came out: scripts must notice


app.add_typer(memory_cli.app, name="memory")


@app.command("report")
def report_command(
    outdir: Annotated[Path, typer.Argument(help="Output directory of a `routetune tune` run.")],
) -> None:
    """Write report.html, report.md and report.json from a run's trial store."""
    from routetune.reporting.files import write_reports

    paths = write_reports(outdir)
    console.print(f"wrote {', '.join(p.name for p in paths.values())} to {outdir}")


SORTS = ("rank", "speedup", "p50", "route", "status")
"""``routetune show --sort`` keys; rank: the winner, then accurate routes by speed."""


@app.command("show")
def show_command(
    outdir: Annotated[Path, typer.Argument(help="Output directory of a `routetune tune` run (or its runs/<time> folder).")],
    all_trials: Annotated[bool, typer.Option("--all", help="Every trial, not only the accurate routes.")] = False,
    status: Annotated[str | None, typer.Option(help="Only trials of this status (ok, accuracy-failed, build-failed, crashed, timed-out, skipped, build-only).")] = None,
    sort: Annotated[str, typer.Option(help=f"Order: {', '.join(SORTS)}.")] = "rank",
) -> None:
    """Print a run's trials from its store, judged under the run's accuracy constraint."""
    from routetune.display import accurate_table, compact_table, status_line
    from routetune.judging.ranking import ranked
    from routetune.records.trial import Status
    from routetune.reporting.report import store_dir, stored_trials
    from routetune.reporting.report_text import headline_of

    if sort not in SORTS:
        raise UsageError(f"--sort {sort}: give one of {', '.join(SORTS)}")
    if status is not None and status not in {s.value for s in Status}:
        raise UsageError(f"--status {status}: give one of "
                         f"{', '.join(s.value for s in Status)}")
    registry = load_registry()
    run, trials, route = stored_trials(store_dir(outdir), outdir)
    headline = headline_of(run)
    winner = next((t for t in trials if t.route == route), None)
    order = ranked(trials, winner)
    keys = {"speedup": lambda t: -(t.speedup or 0.0),
            "p50": lambda t: t.latency.p50 if t.latency else float("inf"),
            "route": lambda t: t.route, "status": lambda t: str(t.status)}
    if sort in keys:
        order.sort(key=keys[sort])
    shown = [t for t in order if status is None or t.status == status]
    by = "winner first" if sort == "rank" else f"by {sort}"
    if all_trials or status is not None:
        title = (f"{len(shown)} of {len(trials)} trials" + (f", {status}" if status else "")
                 + f", {by}")
        console.print(compact_table(shown, winner, title, console.width, headline=headline))
    else:
        console.print(accurate_table(order, winner, registry, top=None, width=console.width,
                                     order=by, headline=headline))
    console.print(status_line(trials))


@app.command("seasonings")
def seasonings_command(name: Annotated[str | None, typer.Argument(
        help="One seasoning to explain: its order, backends and each parameter.")] = None,
        ) -> None:
    """List the installed seasonings, backends, search strategies and metrics."""
    registry = load_registry()
    from routetune.display import components_table, seasoning_detail, seasonings_table

    if name is not None:
        console.print(seasoning_detail(registry, name))
        return
    console.print(seasonings_table(registry, console.width))
    console.print(components_table(registry))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether a flag was given on the command line (or by environment), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


@app.command("build")
@_with_options("build", _option("route", None, Annotated[str | None, typer.Option(
    help="The route to build, e.g. 'fp16,ort-threads{intra_op=2}'.")]))
def build_command(ctx: typer.Context, route: str | None = None, **values: Any) -> None:
    """Rebuild one route's engine and check its outputs against the stored ones.

    Exits 1 when a pass declines the route, the backend refuses it, the engine does not
    run, or the outputs do not match within the accuracy constraint; 3 when a pass
    wrote an invalid model or crashed (the pass is named); 2 on bad input.
    """
    registry = load_registry()
    opts = _spec(ctx, values, registry)
    recipe = opts.recipe
    if route is None and recipe is None:
        raise UsageError("give --route TEXT or --recipe FILE (a recipe that pins one route)")
    from routetune.run.rebuild import rebuild

    with opts.worded():
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
    for line in done.unchanged:  # a fusion that fused nothing says so, and why
        console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    if not done.changed:
        console.print("[yellow]no step changed the model or the settings: this engine is "
                      "the base route's[/]")
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

    from routetune.run.recipe import json_schema

    print(json.dumps(json_schema(), indent=2))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``routetune`` script. Exits 2 on bad input, with one line.

    Bad flags (a missing argument, ``--max-depth abc``) come from the command-line
    framework; they are printed as one line too, with a pointer to ``--help``. Whatever
    is raised after a Ctrl-C or SIGTERM arrived is that stop (a library may turn the
    `KeyboardInterrupt` into its own error: onnxruntime's extension into an ImportError,
    matplotlib's class set-up into a RuntimeError): exit 130 or 143, one line.
    """
    command = typer.main.get_command(app)
    signals.install()
    try:
        code = command.main(args=argv, prog_name="routetune", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):  # typer returns 130 for the latter, but not always
        code = 130
    except Exception as e:
        if not signals.interrupted_by():
            _exit_with_one_line(e, sys.argv[1:] if argv is None else argv)
        code = signals.exit_code()  # the stop's doing, whatever a library made of it
    stopped = signals.unanswered()
    if stopped:  # a Ctrl-C or SIGTERM before the command could write what it had
        print(stopped, file=sys.stderr)
    if signals.interrupted_by():
        signals.exit_now()  # a press repeated during Python's shutdown would kill it silently
    sys.exit(code if isinstance(code, int) else 0)


def _exit_with_one_line(e: Exception, argv: list[str]) -> NoReturn:
    """Print a user error as one line and exit: 2, or the framework's code.

    A `RoutetuneError` (its problems one per line below it), a full disk wherever a
    file was being written (`routetune.records.store.full_disk`), or the framework's
    usage error (`ClickException` and its kin); anything else is a bug, raised again.
    """
    from routetune.records.store import disk_full, full_disk

    if disk_full(e):
        where = getattr(e, "filename", None)
        e = full_disk(Path(where) if where else Path.cwd() / "?", e)
    if isinstance(e, RoutetuneError):
        first, *problems = (e.lines() if isinstance(e, UsageError)
                            else [" ".join(str(e).split())])
        print(f"routetune: error: {first}", *(f"  {p}" for p in problems), sep="\n",
              file=sys.stderr)
        sys.exit(2)
    if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
        raise e
    message = with_flag_value(" ".join(e.format_message().split()), e, argv)
    if message:  # empty after no-arguments help, which was printed already
        hint = " (see routetune --help)" if e.exit_code == 2 else ""
        print(f"routetune: error: {message}{hint}", file=sys.stderr)
    sys.exit(e.exit_code)
