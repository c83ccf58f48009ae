"""A search over several backends (``--backend onnxruntime,openvino``).

Each backend gets a whole search of its own (`routetune.run.tuning.tune`), in a folder of
its own, against the same FP32 reference (the reference backend is the same for all),
with its own base route and its own confirmed winner. Then the backends' winners and
base routes are built again and timed **side by side**, in loops of interleaved paired
blocks (`routetune.run.side_by_side`: ``--confirm-repeats`` loops, one after another,
each in a fresh process), against the first backend's base route: the figure every
speed-up of such a run is stated against.

The winner is the contender with the highest paired speed-up whose interval clears
``--min-speedup`` (`routetune.timing.measure.Speedup.clears`) measured while the machine was
quiet; otherwise the first backend's base route stands. Contenders whose intervals overlap
the winner's are named as a tie. Nothing here knows a backend by name: any number of
backends, from any plugin, compete in the same way.

Files: ``OUTDIR/<backend>/`` holds each backend's run (its trial store, reports and
winner); ``OUTDIR/backends.json`` the side-by-side figures and the verdict;
``OUTDIR/report.md`` the trials grouped by backend; ``OUTDIR/winner.*`` the overall
winner's files (a copy of its backend's, or its base route's written afresh).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routetune.errors import UsageError
from routetune.logs import quietly
from routetune.options import OptionError
from routetune.registry import Registry
from routetune.run.outdir import locked, make_outdir, remove_refused
from routetune.run.preparation import Prepared, available_backend, prepare_run
from routetune.run.run_spec import RunSpec
from routetune.run.side_by_side import BaseScreen, Contender, base_floors, side_by_side
from routetune.run.tuning import Plan, TuneResult, tune
from routetune.run.winner import WINNER_OUTPUTS, save_outputs, write_winner
from routetune.timing.race import CLEAR_PAIRS

SUMMARY = "backends.json"
"""The side-by-side figures and the verdict of a multi-backend run."""


def backend_names(value: str) -> list[str]:
    """The backends of a ``--backend`` value: ``a,b`` is two; one name is one.

    Raises:
        UsageError: An empty name or a name given twice.
    """
    names = [n.strip() for n in value.split(",")]
    if any(not n for n in names):
        raise OptionError("backend", f" '{value}': an empty backend name; give names "
                          "separated by commas, e.g. onnxruntime,openvino")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise OptionError("backend", f" '{value}': '{twice[0]}' is given twice; name each "
                          "backend once")
    return names


@dataclass(frozen=True)
class BackendsResult:
    """What a multi-backend run found.

    Args:
        runs: Each backend's run, in the order given.
        contenders: The engines timed side by side; the first is the first backend's
            base route, every speed-up's denominator.
        winner: The contender that won.
        reason: Why, in one line.
        outdir: The output directory (each backend's run is in a folder of it).
        files: What was written here, by role.
        conditions: The machine's conditions during the side-by-side timing.
        screen: What the base routes' timing before the searches found, one line per
            backend (`routetune.run.side_by_side.base_floors`); empty when not timed.
    """

    runs: tuple[TuneResult, ...]
    contenders: tuple[Contender, ...]
    winner: Contender
    reason: str
    outdir: Path
    files: dict[str, Path] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    screen: tuple[str, ...] = ()

    @property
    def decided_note(self) -> str:
        """How many side-by-side loops ended early, and why, in one line ("" for none)."""
        early = int(self.conditions.get("decided_loops", 0))
        if not early:
            return ""
        loops = int(self.conditions.get("loops", 1))
        return (f"{early} of {loops} loops ended once every contender was decided: cleared "
                f"--min-speedup in its first {CLEAR_PAIRS} paired blocks, or left the race")

    @property
    def winner_speedup(self) -> float:
        """The winner's side-by-side speed-up over the first backend's base route."""
        return self.winner.paired.value if self.winner.paired else 1.0


Callback = Callable[..., None]



def tune_backends(opts: RunSpec, registry: Registry, on_start: Callback = lambda *a: None,
                  on_trial: Callback = lambda *a: None,
                  on_status: Callback = lambda *a: None) -> BackendsResult:
    """Search each backend of ``opts.backend`` in turn, then time their winners side by side.

    Args:
        opts: The run; ``backend`` names two or more backends, comma-separated. Build
            options (``backend_options``) go to the backend whose options they are.
        registry: The installed plugins.
        on_start: As `routetune.run.tuning.tune`'s, once per backend.
        on_trial: As `routetune.run.tuning.tune`'s.
        on_status: As `routetune.run.tuning.tune`'s.

    Raises:
        UsageError: Bad input (as `routetune.run.tuning.tune`), or a bad backend list.
        StorageError: A trial store cannot be opened or written.
    """
    names = backend_names(opts.backend)
    known = {n: set(available_backend(registry, n).options()) for n in names}  # before any
    top = Path(opts.output) if opts.output else None                          # search
    created: list[Path] = []
    if top is not None:
        make_outdir(top, Path("."), created=created)
    runs: list[TuneResult] = []
    prepared: list[Prepared] = []

    def started(run: Prepared, plan: Plan) -> None:
        prepared.append(run)
        on_start(run, plan)

    subs = [dataclasses.replace(opts, backend=name, output=top / name if top else None,
                                backend_options={k: v for k, v in opts.backend_options.items()
                                                 if k in known[name]})
            for name in names]
    try:
        ready = [_prepared(sub, registry) for sub in subs]  # every backend, before any search
        screens, screen = _floors([run for run, _ in ready], on_status)
        for sub, base, run in zip(subs, screens, ready, strict=True):
            runs.append(tune(sub, registry, started, on_trial, on_status, base.floor, run,
                             base.pace_ms))
    except UsageError:
        if top is not None:  # a refused run leaves no folder it made, unless it recorded
            remove_refused(top, created)
        raise
    if top is None:  # beside the backends' default folders: <model>-<sha>-<a>+<b>
        first = runs[0].outdir
        top = first.parent / (first.name.removesuffix(names[0]) + "+".join(names))
        make_outdir(top, Path("."))
    with locked(top):
        on_status(f"timing the {len(names)} backends' winners and base routes side by side")
        contenders, conditions = side_by_side(prepared, runs, opts.confirm_repeats,
                                              opts.in_process)
        winner, reason = pick(contenders, opts.min_speedup, conditions, opts.busy_machine)
        result = BackendsResult(tuple(runs), tuple(contenders), winner, reason, top,
                                conditions=conditions, screen=screen)
        result.files.update(write(result, prepared, opts))
    return result


def _prepared(sub: RunSpec, registry: Registry) -> tuple[Prepared, bytes]:
    """One backend's run, prepared (`prepare_run`), and what the libraries printed."""
    with sub.worded():
        return quietly("prepare", functools.partial(prepare_run, sub, registry))


def _floors(runs: Sequence[Prepared], on_status: Callback
            ) -> tuple[list[BaseScreen], tuple[str, ...]]:
    """Each backend's floor and base route's pace, and what they rest on (not timed with --no-race).

    Its base route timed beside the others' before the searches
    (`routetune.run.side_by_side.base_floors`).
    """
    if not runs[0].spec.measure.race:
        return [BaseScreen()] * len(runs), ()
    on_status(f"timing the {len(runs)} backends' base routes side by side")
    floors, lines, _ = base_floors(runs, runs[0].registry)
    for line in lines:
        on_status(line)
    return floors, tuple(lines)


def pick(contenders: Sequence[Contender], min_speedup: float, conditions: dict[str, Any],
         busy_machine: str = "wait") -> tuple[Contender, str]:
    """The winner: the fastest contender whose side-by-side interval clears `min_speedup`.

    Returns:
        The winner and a one-line reason. The first backend's base route stands when
        no contender clears, or when the machine was busy (unless `busy_machine` is
        ``ignore``).
    """
    base = contenders[0]
    busy = conditions.get("busy", "")
    if busy and busy_machine != "ignore":
        return base, (f"the machine was busy during the side-by-side timing ({busy}): no "
                      f"backend is claimed faster; {base.name} stands")
    clear = [c for c in contenders[1:] if c.paired is not None
             and c.paired.clears(min_speedup) is None]
    if not clear:
        return base, (f"no other contender was faster than {base.name} by more than "
                      f"{min_speedup:.2f}x with 95% confidence, side by side")
    best = max(clear, key=lambda c: c.paired.value)  # type: ignore[union-attr]
    p = best.paired
    assert p is not None
    ties = [c.name for c in clear if c is not best and c.paired is not None
            and c.paired.ci_high >= p.ci_low]
    tie = (f"; within its interval: {', '.join(ties)} (a tie: either would do)"
           if ties else "")
    return best, (f"{p.figure} over {base.name}, "
                  f"side by side{tie}")


def write(result: BackendsResult, prepared: Sequence[Prepared], opts: RunSpec
          ) -> dict[str, Path]:
    """Write ``backends.json``, ``report.md`` and the winner's files.

    The winner's files are a copy of its backend's when it is that backend's own
    winner. A backend's base route can win side by side although its own search
    crowned another route; its files are then written here afresh.
    """
    top, winner = result.outdir, result.winner
    k = next(i for i, r in enumerate(result.runs) if r.base.backend == winner.backend)
    source = result.runs[k]
    files: dict[str, Path] = {}
    for stale in [*top.glob("winner.*"), top / WINNER_OUTPUTS]:
        stale.unlink(missing_ok=True)  # an earlier run's winner in this folder
    if winner.trial is source.winner:
        records = source.files["run"].parent
        for path in sorted(records.glob("winner.*")) + [records / WINNER_OUTPUTS]:
            if path.is_file():
                shutil.copyfile(path, top / path.name)
                files[path.name] = top / path.name
    else:
        own = dataclasses.replace(source, winner=winner.trial, winner_reason=result.reason,
                                  confirmations=())
        written = write_winner(prepared[k], own, opts, top)
        files.update({path.name: path for path in written.values()})
        if winner.outputs is not None:
            save_outputs(top / WINNER_OUTPUTS, winner.outputs, prepared[k].constraint)
            files[WINNER_OUTPUTS] = top / WINNER_OUTPUTS
    summary = {
        "winner": {"backend": winner.backend, "route": winner.trial.route,
                   "speedup": result.winner_speedup, "reason": result.reason,
                   "folder": str(source.outdir)},
        "contenders": [_record(c) for c in result.contenders],
        "conditions": result.conditions,
        "screen": list(result.screen),
        "backends": [{"backend": r.base.backend, "folder": str(r.outdir),
                      "winner": r.winner.route, "speedup_over_own_base": r.winner_speedup}
                     for r in result.runs],
    }
    files[SUMMARY] = top / SUMMARY
    files[SUMMARY].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    files["report.md"] = top / "report.md"
    files["report.md"].write_text(report_md(result))
    return files


def _record(c: Contender) -> dict[str, Any]:
    return {"backend": c.backend, "route": c.trial.route, "failed": c.failed,
            "p50_ms": c.latency.p50 if c.latency else None,  # the first loop's
            "speedup": c.paired.value if c.paired else None,
            "pairs": c.paired.pairs if c.paired else None,  # over the loops
            "ci": [c.paired.ci_low, c.paired.ci_high] if c.paired else None}


def report_md(result: BackendsResult) -> str:
    """The side-by-side table, then each backend's accurate trials, grouped by backend."""
    base = result.contenders[0]
    loops = int(result.conditions.get("loops", 1))
    lines = [f"# {len(result.runs)} backends, side by side", "",
             f"Winner: **{result.winner.name}**: {result.reason}.", "",
             f"Every speed-up is over {base.name}, timed in the same loops of paired "
             f"blocks ({loops}, in fresh processes; the speed-up combines them, the p50s "
             "are the first loop's)" + (f"; {result.decided_note}" if result.decided_note
                                        else "") + ".", "",
             *([("Before the searches, the base routes side by side (one loop, in "
                 "process): " + "; ".join(result.screen) + "."), ""] if result.screen else []),
             "| backend | route | p50 (ms), loop 1 | speed-up [95% interval] |",
             "|---|---|---|---|"]
    for c in result.contenders:
        figure = (c.paired.figure
                  if c.paired else f"not timed: {c.failed}")
        p50 = f"{c.latency.p50:.3f}" if c.latency else "-"
        lines.append(f"| {c.backend} | `{c.trial.route}` | {p50} | {figure} |")
    for run in result.runs:
        name = run.base.backend
        link = os.path.relpath(run.outdir / "report.md", result.outdir)
        lines += ["", f"## {name}", "",
                  f"Its own search: winner `{run.winner.route}`, "
                  f"{run.winner_speedup:.2f}x over its own base route. "
                  f"Every trial: [{link}]({link}).",
                  "", "| route | status | p50 (ms) | speed-up over its base |", "|---|---|---|---|"]
        for t in run.trials:
            if t.latency is None:
                continue
            speedup = f"{t.speedup:.2f}x" if t.speedup else "-"
            lines.append(f"| `{t.route}` | {t.status} | {t.latency.p50:.3f} | {speedup} |")
    return "\n".join(lines) + "\n"
