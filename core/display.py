"""Terminal tables (rich) for trials and for the installed plugins."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from routetune.feeds.decoder import per_token
from routetune.libraries import CUSTOM_OPS, EXTENSIONS
from routetune.options import options_of
from routetune.records.trial import SAME_KERNELS, Confirmation, Status, Trial
from routetune.registry import Registry
from routetune.reporting.report import ERROR_METRIC, worst_error
from routetune.reporting.report_text import ROUTE_WIDTH, short_route, speedup_figure, wrap_route
from routetune.routes.route import format_value
from routetune.search.coarser import COARSER
from routetune.seasoning import Param
from routetune.timing.race import EARLY_PAIRS, RACE_PAIRS

if TYPE_CHECKING:
    from routetune.run.backends import BackendsResult
    from routetune.run.preparation import Prepared
    from routetune.run.tuning import Plan, TuneResult

STATUS_STYLE = {
    "ok": "green", "accuracy-failed": "yellow", "build-failed": "red",
    "crashed": "red", "timed-out": "magenta", "skipped": "dim", "build-only": "cyan",
}

SHOWN_PARAMS = 12
"""Parameters listed per seasoning by ``routetune seasonings`` (TensorRT has ~200 knobs)."""


TOP = 10
"""Accurate routes the end-of-run summary shows (all: ``--verbose`` or ``routetune show``)."""


def header_lines(run: Prepared, search: str, plan: Plan) -> list[str]:
    """What ``routetune tune`` is about to do, in short lines that do not wrap at 80 columns.

    The model's name and hash, the backend and its device, what the preparation
    changed (`routetune.model.loading.PreparedModel.changes`), each custom-op library
    with its hash, a saved reference with its hash, the base pipeline's preflight
    (one line per step), the route space with the trials planned, the time budget and
    the accuracy constraint (an example's own say so).
    """
    size, offered = run.space.size(), len(run.space.infos)
    lines = [f"model    {escape(run.model.source.name)} · sha256 "
             f"{run.model.source_sha256[:16]}",
             f"backend  {escape(run.backend.name)} {escape(run.backend.version())}",
             f"device   {escape(run.backend.device())}"]
    lines += [f"prepared {escape(change)}" for change in run.model.changes]
    lines += [f"library  {escape(lib.named if lib.named == EXTENSIONS else lib.path.name)} "
              f"· sha256 {lib.sha256[:16]} · " + (
                  "custom ops registered with every ONNX Runtime session"
                  if lib.kind == CUSTOM_OPS else "TensorRT plugins, loaded before each parse")
              for lib in run.libraries]
    saved = run.saved_reference
    if saved is not None:
        lines.append(f"reference {escape(saved.path.name)} · sha256 {saved.sha256[:16]} · "
                     f"saved outputs of {len(saved.outputs)} input "
                     f"set{'s' * (len(saved.outputs) != 1)}, not run here")
    for p in run.base_passes or ():
        stats = ", ".join(f"{k} {v}" for k, v in p["stats"].items() if v)
        lines.append(f"preflight {escape(p['step'])}" + (f": {escape(stats)}" if stats else ""))
    lines.append(f"space    {size:,} route{'s' * (size != 1)} from {offered} "
                 f"seasoning{'s' * (offered != 1)} · search {escape(search)} · {plan}")
    if run.time_budget_s is not None:
        whose = run.source.get("time_budget")
        lines.append(f"budget   {run.time_budget_s:g} s of search"
                     + (f" · {escape(whose)} (--time-budget to change)" if whose else ""))
    if run.memory:
        lines.append(f"memory   {escape(run.memory)}")
    whose = run.source.get("accuracy")
    lines.append(f"accuracy {escape(run.constraint.text)}"
                 + (f" · {escape(whose)} task constraint" if whose else ""))
    made = run.source.get("decoder")
    if made:  # the objective and the sets routetune made for it
        lines += textwrap.wrap(escape(made), 80, initial_indent="decoder  ",
                               subsequent_indent=" " * 9)
    return lines


def status_line(trials: Sequence[Trial]) -> str:
    """How many trials ended in each status, with each failure's most common reason."""
    counts = Counter(str(t.status) for t in trials)
    parts = []
    for status, n in counts.most_common():
        reasons = Counter(t.reason for t in trials if str(t.status) == status and t.reason)
        common = ""
        if status != "ok" and reasons:
            reason, times = reasons.most_common(1)[0]
            label = f"most often, {times}x" if times > 1 else "e.g."
            common = f" ({label}: {reason[:90]}{'…' * (len(reason) > 90)})"
        parts.append(f"[{STATUS_STYLE.get(status, '')}]{n} {status}[/]{escape(common)}")
    return f"{len(trials)} trials: " + "; ".join(parts)


def accurate_table(trials: Sequence[Trial], winner: Trial | None, registry: Registry,
                   top: int | None = TOP, width: int = 100, order: str = "winner first",
                   headline: tuple[str, bool] = (ERROR_METRIC, False)) -> Table:
    """The winner and the fastest accurate routes, in the order given (`ranked`).

    The speed-ups are each trial's search figure (its paired blocks against the base
    route), as the title says; a winner's confirmation is reported apart.

    A `compact_table` without reasons (accurate routes have none): it fits `width`.
    `headline` is the accuracy value shown (`compact_table`).
    """
    accurate = [t for t in trials if t.status == "ok"]
    rows = [t for t in trials if t is winner or t.status == "ok"]
    shown = rows if top is None else rows[:top]
    title = (f"the {len(shown)} fastest of {len(accurate)} accurate routes, {order}"
             if len(shown) < len(rows) else
             f"{len(accurate)} accurate route{'' if len(accurate) == 1 else 's'}, {order}")
    if winner is not None and winner.status != "ok":  # a fallback that is not accurate
        title += f"; the fallback, '{winner.route}', is {winner.status}"
    title += "; speed-ups as timed in the search"  # a confirmation's figure is its own line
    return compact_table(shown, winner, title, width, reasons=winner is not None
                         and winner.status != "ok", headline=headline)


P50_HEADER = "p50 / base p50 ms"
"""The compact table's p50 column: a trial's p50 beside the base's timed with it."""


def compact_table(trials: Sequence[Trial], winner: Trial | None, title: str, width: int,
                  reasons: bool = True, headline: tuple[str, bool] = (ERROR_METRIC, False)
                  ) -> Table:
    """Trials in the given order, in `width` columns: route, speed-up, p50, error, status.

    The p50 is shown beside the base route's p50 timed alongside it (in the same paired
    blocks): the pair the speed-up comes from. Trials are timed at different moments,
    so one trial's p50 against another's may disagree with their speed-ups.

    The error column is `headline`'s value for the worst output: the first task metric
    the constraint bounds (``mask_iou@0.3``), else rel-L2
    (`routetune.judging.constraint.Constraint.headline`).

    Figures never wrap and are never cut: the route takes what they leave of `width`
    (at least 20 characters; where that leaves the route less, the p50 column goes and
    the caption says where it is), wraps at its commas (`wrap_route`) in lines of at most
    `ROUTE_WIDTH`, and a step longer than the route's column is cut; the status and its
    reason fold in at least 26 characters. The full columns are `trials_table`'s
    (``--verbose``).
    """
    headers = ["#", "route", "speed-up [95%]"] + ([] if reasons else [P50_HEADER]) \
        + [headline[0]] + (["status: reason"] if reasons else [])
    rows: list[list[str]] = []
    for i, t in enumerate(trials, 1):
        speed = speedup_figure(t.speedup, None if t.paired is None else (
            t.paired.ci_low, t.paired.ci_high)) if t.speedup else ""
        if t.noisy and not reasons:  # the status column says it where there is one
            speed += " [magenta]noisy[/]"
        error = worst_error(t, headline)
        cells = [str(i), "", speed]
        if not reasons:  # the p50 beside the base's timed with it: the pair the speed-up
            cells.append(  # comes from, which trials timed at other moments are not
                f"{t.latency.p50:.3f} / {t.base_latency.p50:.3f}" if t.latency
                and t.base_latency and t.route != "base" else
                f"{t.latency.p50:.3f}" if t.latency else "")
        cells.append("" if error is None else f"{error:.3g}")  # as report.md: 0.999, not 1
        if reasons:
            status = f"[{STATUS_STYLE.get(t.status, '')}]{t.status}[/]"
            status += " [magenta]noisy[/]" if t.noisy else ""
            cells.append(status + (f": {escape(t.reason)}" if t.reason else ""))
        rows.append(cells)

    def route_room() -> int:
        """What the figures leave of `width` for the route.

        SIMPLE_HEAD without edge padding draws an edge character each side, and a
        divider with a space either side between columns.
        """
        figures = sum(max([len(h)] + [Text.from_markup(r[c]).cell_len for r in rows])
                      for c, h in enumerate(headers) if h not in ("route", "status: reason"))
        return width - figures - (26 if reasons else 0) - 3 * (len(headers) - 1) - 2

    caption = None
    if route_room() < 20 and P50_HEADER in headers:  # a narrow terminal: the p50s go
        at = headers.index(P50_HEADER)
        headers.pop(at)
        for r in rows:
            r.pop(at)
        caption = f"{P50_HEADER}: in report.md, or in a wider terminal"
    route_width = max(20, route_room())
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False,
                  expand=False)
    for header in headers:
        if header == "status: reason":
            table.add_column(header, overflow="fold", min_width=26)
        else:
            table.add_column(header, justify="left" if header == "route" else "right",
                             no_wrap=True)
    for t, cells in zip(trials, rows, strict=True):
        route = escape(wrap_route(t.route, min(ROUTE_WIDTH, route_width), cut=route_width))
        cells[1] = f"[bold]{route}[/bold]" if t is winner else route
        table.add_row(*cells)
    return table


def accuracy_text(trial: Trial, registry: Registry) -> str:
    """The worst value of each headline metric across outputs (``l0 0 cos 0.99999``)."""
    if not trial.accuracy:
        return ""
    parts = []
    for name in ("l0", "cos", "rel_l2", "linf"):
        values = [m[name] for m in trial.accuracy.values() if name in m]
        if not values:
            continue
        higher = name in registry.metrics and registry.metrics[name].item.higher_is_better
        worst = min(values) if higher else max(values)
        parts.append(f"{name} {worst:.6g}")
    return " ".join(parts)


def trials_table(
    trials: Sequence[Trial], winner: Trial | None, registry: Registry,
    title: str = "",
) -> Table:
    """A table of trials in the given order: route, status and reason, latency, accuracy.

    Latency columns are in ms: p50 and p90 of all timed runs, and ``±`` the half-width
    of the 95% interval of the median of the block medians. "base p50" is the base
    route's p50 measured in alternating blocks with the trial. Speed-up is the paired
    estimate (`routetune.timing.measure.paired_speedup`) with its 95% interval over blocks: the
    machine's speed drifts, so p50s of different trials are not compared directly. A
    trial timed while the machine was busy is marked "noisy" in its status.
    """
    table = Table(title=title, show_lines=False, expand=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("route", "left"), ("status", "left"), ("p50 ms", "right"),
        ("p90 ms", "right"), ("±", "right"), ("base p50 ms", "right"), ("speed-up", "right"),
        ("accuracy", "left"), ("reason", "left"))
    for col, justify in columns:
        if col == "route":  # wrapped at its commas by wrap_route, never inside a step
            table.add_column(col, justify=justify, no_wrap=True)
        else:
            table.add_column(col, justify=justify, overflow="fold")
    for i, t in enumerate(trials, 1):
        lat = t.latency
        speed = speedup_figure(t.speedup, None if t.paired is None else (
            t.paired.ci_low, t.paired.ci_high)) if t.speedup else ""
        route = escape(wrap_route(t.route))
        route = f"[bold]{route}[/bold]" if t is winner else route
        status = f"[{STATUS_STYLE.get(t.status, '')}]{t.status}[/]"
        if t.noisy:
            status += " [magenta]noisy[/]"
        table.add_row(
            str(i), route, status,
            f"{lat.p50:.3f}" if lat else "", f"{lat.p90:.3f}" if lat else "",
            f"{lat.spread:.3f}" if lat else "",
            f"{t.base_latency.p50:.3f}" if t.base_latency else "", speed,
            accuracy_text(t, registry), escape(verdict_text(t, registry)),
        )
    return table


def verdict_text(trial: Trial, registry: Registry) -> str:
    """The trial's reason, then what each precision step decided.

    For each precision step: its non-zero statistics (``fp16: low_nodes 252,
    fp32_nodes 35, kept_data_max 20``), and for ``precision-repair`` the nodes it kept
    in FP32, so that a reader sees why a precision route passed or failed.
    """
    parts = [trial.reason] if trial.reason else []
    for record in trial.passes:
        step = str(record.get("step", ""))
        name = step.split("{")[0]
        if name not in registry.seasonings or (
                registry.seasoning(name).info.stage != "precision"):
            continue
        stats = ", ".join(f"{k} {v}" for k, v in record.get("stats", {}).items() if v)
        text = f"{name}: {stats or 'no change'}"
        note = str(record.get("note", ""))
        if note.startswith("kept in FP32:"):
            text += f"; {note.split('; ')[0]}"
        parts.append(text)
    return " | ".join(parts)


SEASONING_COLUMNS = {"name": 0, "stage": 100, "parameters (choices; default)": 160,
                     "constraints": 160, "backends": 100, "plugin": 160, "summary": 0}
"""The seasonings table's columns, each with the terminal width (columns) that shows it."""


def seasonings_table(registry: Registry, width: int = 200) -> Table:
    """Every installed seasoning: name, stage, parameters, constraints, backends, plugin.

    Where a seasoning can never apply on an available backend (a precision the backend
    has no kernels for), the summary says so. A name is never broken; in fewer than 160
    columns the parameters, constraints and plugin go (``routetune seasonings NAME``
    shows them), in fewer than 100 the stage and backends too (`SEASONING_COLUMNS`).
    """
    backends = [e.item() for e in registry.backends.values()]
    backends = [b for b in backends if b.available() is None]
    shown = [col for col, least in SEASONING_COLUMNS.items() if width >= least]
    caption = "routetune seasonings NAME: one seasoning, each parameter explained"
    if len(shown) < len(SEASONING_COLUMNS):
        caption += f"; {max(SEASONING_COLUMNS.values())} columns show every column"
    table = Table(title="seasonings", caption=caption)
    for col in shown:
        table.add_column(col, no_wrap=col in ("name", "stage"), overflow="fold")
    for name, entry in sorted(registry.seasonings.items()):
        info = entry.item.info
        params = "; ".join(_param_text(p) for p in info.params[:SHOWN_PARAMS])
        if len(info.params) > SHOWN_PARAMS:
            params += f"; … {len(info.params) - SHOWN_PARAMS} more"
        cons = " ".join(
            f"{label} {', '.join(sorted(v))}" for label, v in (
                ("requires", info.requires), ("conflicts", info.conflicts),
                ("after", info.after), ("before", info.before)) if v
        )
        summary = info.summary
        for backend in backends:
            why = entry.item().supports(backend)
            if why and (not info.backends or backend.name in info.backends):
                summary += f" [yellow](not on {backend.name}: {escape(why)})[/]"
        plugin = f"{entry.plugin} ({registry.plugins.get(entry.plugin, '?')})"
        cells = {"name": name, "stage": info.stage, "parameters (choices; default)":
                 escape(params), "constraints": cons,
                 "backends": ", ".join(sorted(info.backends)) or "all", "plugin": plugin,
                 "summary": summary}
        table.add_row(*(cells[col] for col in shown))
    return table


def _param_text(param: Param) -> str:
    """``name=a|b (default a)``, or ``name=v`` where the search tries only the default."""
    if param.choices == (param.default,):
        return f"{param.name}={param.default}"
    return f"{param.name}={'|'.join(map(str, param.choices))} (default {param.default})"


def seasoning_detail(registry: Registry, name: str) -> Group:
    """One seasoning: what it does, where it applies, its order, and each parameter.

    Raises:
        UsageError: No seasoning of that name (the closest one is named).
    """
    cls = registry.seasoning(name)
    info, entry = cls.info, registry.seasonings[name]
    lines = [f"[bold]{escape(name)}[/]: {escape(info.summary)}",
             f"stage {info.stage} · backends {','.join(sorted(info.backends)) or 'all'} · "
             f"plugin {entry.plugin} ({registry.plugins.get(entry.plugin, '?')})"]
    lines += [f"{label} {', '.join(sorted(v))}" for label, v in (
        ("requires", info.requires), ("conflicts with", info.conflicts),
        ("runs after", info.after), ("runs before", info.before)) if v]
    parts: list[Any] = [Text.from_markup("\n".join(lines))]
    if info.params:
        table = Table(title=f"{name}'s parameters (route text: {name}{{param=value,...}})")
        table.add_column("parameter", no_wrap=True)
        for col in ("the search tries", "default", "a route may also pin", "what it does"):
            table.add_column(col, overflow="fold")
        for param in info.params:
            table.add_row(param.name, escape(" | ".join(map(str, param.choices))),
                          escape(str(param.default)),
                          escape(" | ".join(str(v) for v in param.allowed
                                            if v not in param.choices) or "–")
                          if param.allowed else f"any {type(param.default).__name__}",
                          escape(param.help + ("" if param.finest is None else
                                               f"; finest: {format_value(param.finest)} "
                                               "(tried first; where it fails, the coarser "
                                               "choices are not built)")))
        parts.append(table)
    else:
        parts.append(Text("no parameters"))
    return Group(*parts)


def components_table(registry: Registry) -> Table:
    """The installed backends, search strategies, metrics and executors, with their plugins."""
    table = Table(title="backends, search strategies, accuracy metrics, executors")
    for col in ("kind", "name", "plugin", "note"):
        table.add_column(col, overflow="fold")
    for name, entry in sorted(registry.backends.items()):
        backend = entry.item()
        reason = backend.available()
        note = escape(f"unavailable: {reason}" if reason else f"version {backend.version()}")
        table.add_row("backend", name, entry.plugin, note)
    for name, strategy in sorted(registry.strategies.items()):
        options = "; ".join(f"option {o.name}={o.default!r}: {o.meta.help}"
                            for o in options_of(strategy.item.Options))
        doc = (strategy.item.__doc__ or "").splitlines()[0]
        table.add_row("search", name, strategy.plugin, escape(f"{doc} {options}".strip()))
    for name, metric in sorted(registry.metrics.items()):
        item, note = metric.item, metric.item.help
        param = getattr(item, "param", None)
        if param is not None:  # a task metric's @ value
            name += f"@{param.name}"
            note += f"; @{param.name}: {param.help}, default {param.default:g}"
        table.add_row("metric", name, metric.plugin, escape(note))
    for name, executor in sorted(registry.executors.items()):
        table.add_row("executor", name, executor.plugin, escape(executor.item.summary))
    return table


def stopped_line(result: TuneResult) -> str:
    """Why the search stopped early, how much of it ran, and what it never tried.

    The verdict rests on the trials that ran; an offered seasoning in no trial's route
    (`TuneResult.untried`) is named, since nothing was learned about it.
    """
    ran = sum(t.status != Status.SKIPPED for t in result.trials)
    of = f" of {result.planned:,} planned" if result.planned is not None else ""
    line = (f"stopped early: {escape(result.stopped or '')}; the best so far stands, "
            f"resting on the {ran} trial{'s' * (ran != 1)} that ran{of}")
    if result.untried:
        line += f"; never tried: {escape(', '.join(result.untried))}"
    return line


def winner_line(result: TuneResult) -> str:
    """The winner and why, short: the confirmations' figures follow (`conditions_lines`)."""
    route = f"[bold]{escape(result.winner.route)}[/bold]"
    if not result.confirmations:  # nothing re-measured: the verdict's own words
        return f"winner: {route} ({escape(result.winner_reason)})"
    rule = f"--min-speedup {result.min_speedup:g}"
    confirmed = result.confirmed
    if confirmed is not None:
        p, k = confirmed.paired, len(confirmed.repeats)
        where = f"in each of {k} fresh processes" if k > 1 else "in a fresh process"
        return (f"winner: {route} ({p.figure} over "
                f"the base route, confirmed {where}: above {rule} beyond its 95% interval)")
    n = len(result.confirmations)
    return (f"winner: {route} (the base route stands: no faster route held a speed-up above "
            f"{rule} beyond its 95% interval when re-measured in fresh processes; "
            f"{n} tried)")


def loop_of(c: Confirmation) -> str:
    """Which loop a confirmation's p50s come from: its one, or the median of its repeats."""
    if len(c.repeats) > 1:
        return f"the median by speed-up of its {len(c.repeats)} fresh-process loops"
    return "its confirmation loop"


def phase_line(result: TuneResult, phase: str) -> str:
    """A decoder's verdict in its user's words: per-token latency and tokens/s.

    Decode: ms per token and tokens/s; prefill: time to the first token. From the
    measurement the verdict rests on: the confirmation's loop, else the base route's
    search trial.
    """
    c = result.confirmed
    if c is not None:
        return (f"{phase}: the winner {per_token(c.latency.p50, phase)}, the base route "
                f"{per_token(c.base_latency.p50, phase)}, batch 1 (p50, {loop_of(c)})")
    if result.confirmations:  # the base stands: its figure from a fresh process
        last = result.confirmations[-1]
        return (f"{phase}: the base route {per_token(last.base_latency.p50, phase)}, batch 1 "
                f"(p50, beside {escape(last.route)} in its confirmation's loop)")
    base = result.base.latency
    if base is None:
        return f"{phase}: the base route was not timed"
    return (f"{phase}: the base route {per_token(base.p50, phase)}, batch 1 (p50, its "
            "search trial)")


def conditions_lines(result: TuneResult) -> list[str]:
    """What the verdict rests on: the confirmations, and how busy the machine was."""
    lines = []
    for c in result.confirmations:
        p = c.paired
        why_not = p.clears(result.min_speedup) or (
            f"the machine was busy: {c.conditions['busy']}"
            if c.conditions.get("busy") and result.busy_machine != "ignore" else None)
        held = ("held: the winner" if result.confirmed is c
                else f"did not hold: {why_not}" if why_not
                else "held, not faster than the winner")
        lines.append(
            f"  {escape(c.route)}: {p.figure} "
            f"({escape(held)}), "
            f"p50 {c.latency.p50:.3f} vs {c.base_latency.p50:.3f} ms ({loop_of(c)}), "
            f"{p.pairs} block pairs"
            + (f" over {len(c.repeats)} processes" if len(c.repeats) > 1 else "")
            + f", base drift ±{p.drift:.1%}")
    measured = [t for t in result.trials if t.latency is not None]
    noisy = result.noisy
    text = (f"machine: {len(noisy)} of {len(measured)} measured trials noisy "
            f"(--busy-machine {result.busy_machine})")
    if result.waited_s >= 0.5:
        share = (f" ({result.waited_s / result.elapsed_s:.0%} of the {result.elapsed_s:.0f} s "
                 "of search and confirmation)" if result.elapsed_s > 0 else "")
        text += f"; waited {result.waited_s:.0f} s in all for a quiet machine{share}"
    if noisy:
        text += "; busy: " + escape(noisy[0].noisy)
        colour = "yellow"
    else:
        colour = "dim"
    lines.append(f"[{colour}]{text}[/]")
    confirmed = {c.route for c in result.confirmations}
    passed_over = [t for t in noisy if t.status == "ok" and t.paired is not None
                   and (t.speedup or 0) > result.min_speedup and t.route not in confirmed
                   and result.busy_machine != "ignore" and t is not result.winner]
    if passed_over:  # what a quiet machine might have confirmed: named, not hidden
        lines.append("[yellow]not confirmed, timed while the machine was busy: " + ", ".join(
            f"{escape(t.route)} ({t.paired.value:.2f}x [{t.paired.ci_low:.2f}, "
            f"{t.paired.ci_high:.2f}])" for t in passed_over[:3] if t.paired)
            + (f" and {len(passed_over) - 3} more" if len(passed_over) > 3 else "")
            + "; tune again on a quiet machine to judge them[/]")
    raced = racing_line(result)
    if raced:
        lines.append(f"[dim]{raced}[/]")
    return lines


def racing_line(result: TuneResult) -> str:
    """What racing, the same-engine rule and the coarser rule spared this run's trials.

    Empty if nothing. The rules: `routetune.timing.race`, `routetune.search.same_engine`
    (and `Engine.sha256`, `Engine.kernels`), `routetune.search.coarser`.
    """
    ours = [t for t in result.trials if t.fingerprint in result.fresh]
    out = sum(t.raced is not None for t in ours)
    figure = sum(any(n.startswith("timed for") for n in t.notes) for t in ours)
    same = sum(t.reason.startswith("same engine as") for t in ours)
    kernels = sum(t.reason.startswith(SAME_KERNELS) for t in ours)
    coarser = sum(t.reason.startswith(COARSER) for t in ours)
    parts = [f"{out} out of the race (timed {EARLY_PAIRS} or {RACE_PAIRS + 1} paired "
             "blocks, not built on)"
             if out else "",
             f"{figure} that failed accuracy timed for a figure only" if figure else "",
             f"{same} the same engine as another route (not timed)" if same else "",
             f"{kernels} the same kernels as a shorter route that met the constraint "
             "(not timed)" if kernels else "",
             f"{coarser} quantizing more coarsely than one that failed accuracy (not built)"
             if coarser else ""]
    text = "; ".join(p for p in parts if p)
    return f"racing: {text}" if text else ""


def backends_lines(result: BackendsResult) -> list[Any]:
    """A multi-backend run for the terminal.

    What the base routes' screen set, each backend's winner, the side-by-side table, the
    verdict and where the files are.
    """
    lines: list[Any] = [f"before the searches, base routes side by side (one loop): "
                        f"{escape(line)}" for line in result.screen]
    for run in result.runs:
        confirmed = (f"{run.winner_speedup:.2f}x over its own base route, confirmed"
                     if run.confirmed else "its base route stands")
        lines.append(f"{run.base.backend}: {len(run.trials)} trials; winner "
                     f"'{short_route(run.winner.route, 60)}', {confirmed} ({run.outdir})")
    base = result.contenders[0]
    loops = int(result.conditions.get("loops", 1))
    title = (f"side by side, {loops} loop{'s' * (loops != 1)} of paired blocks: speed-up "
             f"over {escape(base.name)}" + (", over the loops" if loops > 1 else ""))
    table = Table(title=title)
    for column in ("backend", "route", "p50 ms (loop 1)" if loops > 1 else "p50 ms",
                   "speed-up [95%]"):
        table.add_column(column)
    for c in result.contenders:
        figure = (c.paired.figure
                  if c.paired else f"not timed: {escape(c.failed)}")
        mark = " (winner)" if c is result.winner else ""
        table.add_row(c.backend, escape(short_route(c.trial.route, 50)) + mark,
                      f"{c.latency.p50:.3f}" if c.latency else "-", figure)
    lines.append(table)
    if result.decided_note:
        lines.append(f"[dim]{escape(result.decided_note)}[/]")
    lines.append(f"winner: {escape(result.winner.name)}: {escape(result.reason)}")
    lines.append(f"wrote {', '.join(result.files)} to {result.outdir}")
    return lines
