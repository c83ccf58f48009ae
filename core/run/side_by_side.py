"""The side-by-side timing of a multi-backend search (`routetune.run.backends`).

Before the searches, every backend's base route is timed beside the others' in one loop
(`base_floors`): a backend whose base route is slower than another's gets a floor, the
speed-up its routes must reach to win the run. After them, every backend's base route
and winner are built again and timed together in loops of interleaved paired blocks,
each loop in a fresh process, and the loops' speed-ups are combined
(`routetune.timing.measure.across_repeats`).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pebble

from routetune.candidate.artifacts import open_engine
from routetune.candidate.candidate import CONFIRM_BLOCKS, with_preflight
from routetune.candidate.pairing import PairedTiming
from routetune.candidate.records import Recorded, TrialInputs
from routetune.errors import one_line
from routetune.execution.scheduling import exit_text
from routetune.judging.verdict import CONFIRM_REPEATS
from routetune.plugin_manager import load_registry
from routetune.records.trial import Status, Trial
from routetune.registry import Registry
from routetune.run.preparation import Prepared, reference_backend
from routetune.signals import spawning_quietly
from routetune.timing.measure import (
    Block,
    Latency,
    MeasureSettings,
    Speedup,
    across_repeats,
    measure_blocks,
    paired_speedup,
)
from routetune.timing.race import Bar, decided

if TYPE_CHECKING:
    from routetune.run.tuning import TuneResult

_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class Contender:
    """One engine in the side-by-side timing.

    Args:
        backend: The backend's name.
        trial: Its trial in that backend's run (its winner or its base route).
        latency: Its latency in the side-by-side loop (ms); None when it could not be
            built or run again (`failed`).
        paired: Its paired speed-up over the first backend's base route in that loop.
        failed: Why it was not timed, in one line ("" when it was).
        outputs: Its outputs on each validation input set, by output name, from the
            engine that was timed (None when it was not).
    """

    backend: str
    trial: Trial
    latency: Latency | None = None
    paired: Speedup | None = None
    failed: str = ""
    outputs: list[dict[str, np.ndarray]] | None = field(default=None, repr=False,
                                                        compare=False)

    @property
    def name(self) -> str:
        """``backend: route``."""
        return f"{self.backend}: {self.trial.route}"


def side_by_side(prepared: Sequence[Prepared], runs: Sequence[TuneResult],
                 repeats: int = CONFIRM_REPEATS, in_process: bool = False
                 ) -> tuple[list[Contender], dict[str, Any]]:
    """Build each backend's base route and winner again and time them in `repeats` loops.

    The first backend's base route comes first: every paired speed-up is over it. Each
    loop runs in a fresh process (spawned; in this one with `in_process`), which builds
    the engines anew and times them in `CONFIRM_BLOCKS` blocks at least and three times
    the search's time, or, racing, until every contender has cleared ``--min-speedup``
    at the early look or left the race against it (`routetune.timing.race.decided`:
    more blocks would not change which clear). The loops' speed-ups are combined
    (`routetune.timing.measure.across_repeats`): how much faster one engine is than another
    moves from one process to the next and over seconds, beyond one loop's interval.

    Returns:
        The contenders, in order, and the machine's conditions meanwhile (the first
        busy one seen, the waits summed, ``decided_loops``: the loops that ended once
        every contender was decided).
    """
    entries: list[tuple[str, Trial, Prepared]] = []
    for run, result in zip(prepared, runs, strict=True):
        entries.append((run.backend.name, result.base, run))
        if result.winner is not result.base and result.winner.status == Status.OK:
            entries.append((run.backend.name, result.winner, run))
    m = prepared[0].spec.measure
    settings = dataclasses.replace(m, min_blocks=max(CONFIRM_BLOCKS, m.min_blocks),
                                   min_time_s=3 * m.min_time_s, max_time_s=3 * m.max_time_s)
    bar = Bar.min_speedup(prepared[0].spec.min_speedup) if m.race else None
    jobs = [(loop_inputs(run), tuple(run.base), trial) for _, trial, run in entries]
    loops: list[Loop] = []
    for k in range(repeats):
        if in_process:
            loops.append(timed_loop(jobs, settings, outputs=k == 0, bar=bar))
            continue
        loops.append(fresh_loop(jobs, settings, k == 0, bar))
        if not loops[-1].timed:
            break  # nothing could be built: no loop will do better
    first = loops[0]
    base = first.timed.index(0) if 0 in first.timed else None
    contenders = []
    for i, (name, trial, _) in enumerate(entries):
        if i not in first.timed:
            contenders.append(Contender(name, trial, failed=first.failed.get(i, "not built")))
            continue
        k = first.timed.index(i)
        latency, paired = _over_loops(loops, k, base)
        outputs = first.outputs[k] if first.outputs else None
        contenders.append(Contender(name, trial, latency, paired, outputs=outputs))
    busy = next((lp.conditions["busy"] for lp in loops if lp.conditions.get("busy")), "")
    conditions = {**first.conditions, "busy": busy, "loops": len(loops), "waited_s": sum(
        float(lp.conditions.get("waited_s", 0.0)) for lp in loops),
        "decided_loops": sum("decided" in lp.conditions for lp in loops)}
    return contenders, conditions


@dataclass(frozen=True)
class Loop:
    """One side-by-side loop (`timed_loop`).

    Args:
        timed: The indices of the jobs that were built and timed, in runner order.
        failed: Why each other job was not (index to one line).
        latencies: Each timed runner's latency (ms).
        blocks: The loop's blocks, in time order.
        conditions: The machine's conditions meanwhile.
        outputs: Each timed runner's outputs on every input set, when asked for.
    """

    timed: list[int]
    failed: dict[int, str]
    latencies: list[Latency]
    blocks: list[Block]
    conditions: dict[str, Any]
    outputs: list[list[dict[str, np.ndarray]]] | None = None


def fresh_loop(jobs: Sequence[tuple[TrialInputs, tuple[Any, ...], Trial | None]],
               settings: MeasureSettings, outputs: bool, bar: Bar | None = None) -> Loop:
    """`timed_loop` in a fresh (spawned) process, stopped on the way out, on Ctrl-C too.

    A process that dies (the out-of-memory killer's SIGKILL, a segfault in a runtime)
    gives a loop that timed nothing, each job failed with how the process ended, where
    `multiprocessing.Pool` would wait for it forever: a two-backend decode search over
    128 steps of a 26 M decoder hung so, its loop process killed at 15.8 GB.
    """
    pool = None
    try:
        with spawning_quietly():  # pebble starts its worker at the first task
            pool = pebble.ProcessPool(max_workers=1, context=_SPAWN)
            future = pool.schedule(timed_loop, args=(jobs, settings, outputs, None, bar))
        return future.result()
    except pebble.ProcessExpired as e:
        why = f"the side-by-side loop's process ended: {exit_text(e.exitcode)}"
        if e.exitcode == -signal.SIGKILL:
            why += ("; the system's out-of-memory killer sends SIGKILL: its engines and "
                    "input sets may not fit in memory (fewer or smaller input sets, or one "
                    "backend at a time)")
        return Loop([], {i: why for i in range(len(jobs))}, [], [], {})
    finally:
        if pool is not None:
            pool.stop()
            pool.join()


def timed_loop(jobs: Sequence[tuple[TrialInputs, tuple[Any, ...], Trial | None]],
               settings: MeasureSettings, outputs: bool, registry: Registry | None = None,
               bar: Bar | None = None) -> Loop:
    """Open every job's engine and time them all in one loop of paired blocks.

    Runs in a fresh process (`side_by_side`): the registry is loaded here unless given.
    A job's trial is None for its backend's base route. A job whose engine cannot be
    rebuilt is left out, with its reason. The loop is watched as a trial's measurement
    is (`routetune.candidate.pairing.PairedTiming`), on the first job's inputs. With a
    `bar`, the loop ends once every other engine is decided against the first job's
    (`routetune.timing.race.decided`); ``conditions["decided"]`` then gives that bar.
    """
    registry = registry or load_registry()
    runners: list[Any] = []
    timed: list[int] = []
    failed: dict[int, str] = {}
    try:
        for i, (inputs, base, trial) in enumerate(jobs):
            try:
                runners.append(_open(registry, inputs, base, trial))
                timed.append(i)
            except Exception as e:  # a contender that cannot be rebuilt is not timed
                failed[i] = " ".join(str(e).split())[:300]
        first = jobs[0][0]
        if not runners:
            return Loop(timed, failed, [], [], {})
        watch = PairedTiming(registry.backend(first.backend)(first.profile), first)
        quiet = logging.getLogger("routetune.timing.conditions")
        quiet.disabled = True  # a wait is recorded in `conditions`, not logged line by line
        racing = bar if timed[0] == 0 else None  # against the first job's engine

        def stop(blocks: list[Block]) -> bool:
            return racing is not None and decided(blocks, racing, base=0)

        try:
            (latencies, blocks), conditions = watch.watched(
                lambda: measure_blocks(runners, first.feeds, settings, stop))
        except Exception as e:  # a runtime's own error in a run mid-loop: none is timed
            why = f"a run failed while they were timed side by side: {one_line(e, 300)}"
            return Loop([], {i: why for i in range(len(jobs))}, [], [], {})
        finally:
            quiet.disabled = False
        out = [[r.infer(feed) for feed in first.feeds] for r in runners] if outputs else None
        if racing is not None and stop(blocks):
            conditions = {**conditions, "decided": racing.speedup}
        return Loop(timed, failed, latencies, blocks, dict(conditions), out)
    finally:
        for runner in runners:
            runner.close()


def _over_loops(loops: Sequence[Loop], k: int, base: int | None
                ) -> tuple[Latency, Speedup | None]:
    """Runner `k`'s latency and paired speed-up over `base` from several loops.

    The speed-up combines the loops' (`routetune.timing.measure.across_repeats`); the latency
    is the first loop's, for every contender: p50s from one loop compare with each
    other, where each contender's own median loop put one loop's p50 beside another's
    (9.706 ms against a base of 1.970 ms shown beside 1.50x).
    """
    if base is None:
        return loops[0].latencies[k], None
    each = [paired_speedup(lp.blocks, k, base) for lp in loops]
    return loops[0].latencies[k], across_repeats(each)


def loop_inputs(run: Prepared) -> TrialInputs:
    """What a side-by-side loop needs of a prepared run to open its engines."""
    return TrialInputs(run.model, run.backend.name, run.profile, tuple(run.feeds), (), {},
                       run.outdir, run.model.data, run.spec.trial_settings(run.libraries))


def _open(registry: Registry, inputs: TrialInputs, base: tuple[Any, ...], trial: Trial | None
          ) -> Any:
    """The trial's engine, opened: its stored candidate model (checked) and settings.

    The base route's when `trial` is None.
    """
    backend = registry.backend(inputs.backend)(inputs.profile)
    reference = reference_backend(registry, backend)
    candidate, _ = with_preflight(registry, inputs, backend, reference, list(base))
    if trial is None or trial.route == "base" or not trial.artifact:
        path = candidate.save_model(candidate.inputs.base_data)
        settings = backend.full_settings(candidate.inputs.base_settings)
        return open_engine(backend, candidate.engine(path, settings, "", ""))
    recorded = Recorded(trial.candidate_sha256 or "", trial.engine_sha256 or "")
    path = candidate.checked_model(trial.route, trial.artifact, trial.settings, recorded)
    return open_engine(backend, candidate.engine(path, trial.settings, trial.fingerprint,
                                                 recorded.engine))


@dataclass(frozen=True)
class BaseScreen:
    """What timing the backends' base routes side by side tells one backend's search.

    Args:
        floor: The bar its candidates race against at least, or None (below).
        pace_ms: Its base route's p50 (ms) in that loop, on a machine found quiet
            meanwhile; None where the loop was busy or did not time it. The search
            judges its own base route's figures against it
            (`routetune.candidate.pairing.PairedTiming.watched`): a base trial timed
            while the host has taken a vCPU away (the 2-vCPU VM of docs/benchmarks.md:
            in 5 of 12 two-backend runs on 2026-12-07 one base trial ran 1.4-2.3x slower
            than in the side-by-side loops) no longer sets the pace that the rest of
            the search is judged against.
    """

    floor: Bar | None = None
    pace_ms: float | None = None


def base_floors(prepared: Sequence[Prepared], registry: Registry
                ) -> tuple[list[BaseScreen], list[str], dict[str, Any]]:
    """Time every backend's base route beside the others' in one loop, in this process.

    A backend whose base route is slower than another's gets a floor: the lower end of
    the fastest other base route's paired speed-up over its own (95% interval), when
    that lies above 1. Its search's candidates race against it at least
    (`routetune.search.leader.Leader`): a route slower than another backend's base route
    cannot win the run. The floor can only cost a missed route, never a false win: the
    winners are still timed side by side afterwards (`side_by_side`). A loop on a busy
    machine (unless ``--busy-machine ignore``), or one where a base route could not be
    built, sets no floor.

    Args:
        prepared: Each backend's prepared run, in the order given.
        registry: The installed plugins.

    Returns:
        Each backend's floor and base route's pace (`BaseScreen`), one line per backend
        saying what was measured, and the machine's conditions meanwhile.
    """
    names = [run.backend.name for run in prepared]
    jobs = [(loop_inputs(run), tuple(run.base), None) for run in prepared]
    loop = timed_loop(jobs, prepared[0].spec.measure, False, registry)
    busy = loop.conditions.get("busy") and prepared[0].spec.busy_machine != "ignore"
    if loop.failed or busy:
        reasons = set(loop.failed.values())
        why = (f"the machine was busy ({loop.conditions['busy']})" if not loop.failed
               else f"the base routes were not timed: {reasons.pop()}"
               if len(loop.failed) == len(names) and len(reasons) == 1
               else f"{names[min(loop.failed)]}'s base route was not timed: "
               f"{next(iter(loop.failed.values()))}")
        return [BaseScreen()] * len(prepared), [f"{why}; no floor"], \
            loop.conditions
    floors: list[BaseScreen] = []
    lines = []
    for i, name in enumerate(names):
        pace = loop.latencies[loop.timed.index(i)].p50
        faster = [(paired_speedup(loop.blocks, j, i), names[j])
                  for j in range(len(names)) if j != i]
        p, other = max(faster, key=lambda f: f[0].ci_low)
        if p.ci_low <= 1.0:
            floors.append(BaseScreen(None, pace))
            lines.append(f"{name}: no other backend's base route is shown faster; no "
                         "floor")
            continue
        floors.append(BaseScreen(Bar(p.ci_low, f"the lower end of {other}'s base route, "
                                     f"{p.value:.3f}x [{p.ci_low:.3f}, {p.ci_high:.3f}] "
                                     f"over {name}'s side by side"), pace))
        lines.append(f"{name}: {other}'s base route is {p.value:.2f}x "
                     f"[{p.ci_low:.2f}, {p.ci_high:.2f}] faster side by side; its routes "
                     f"race against {p.ci_low:.2f}x at least")
    return floors, lines, loop.conditions
