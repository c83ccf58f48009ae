"""Timing a candidate against the base route in one worker, in paired blocks.

The base route's engine is opened once per worker and kept; each candidate is timed in
alternating blocks with it (`routetune.timing.measure.measure_blocks`), so that the machine's
drift cancels out of the speed-up (`routetune.timing.measure.paired_speedup`). A candidate
whose paired blocks show it cannot clear its bar is timed no further
(`routetune.timing.race`). Every
timing waits for a quiet machine, or marks itself noisy, as ``--busy-machine`` says
(`routetune.timing.conditions.measure_watched`); on the host CPU, a machine that runs
the base route slower than it did earlier counts as busy too
(`routetune.timing.conditions.pace_note`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from routetune.backend import Backend, Runner
from routetune.candidate.artifacts import build_engine, open_engine, save_model
from routetune.candidate.records import Timing, TrialInputs
from routetune.routes.route import Route
from routetune.timing.conditions import (
    WINDOW_S,
    BusyPolicy,
    Steady,
    measure_watched,
    pace_note,
)
from routetune.timing.measure import (
    Block,
    MeasureSettings,
    Speedup,
    across_repeats,
    measure,
    measure_blocks,
    paired_speedup,
)
from routetune.timing.race import HOPELESS, Bar, out_of_race, race_note

logger = logging.getLogger(__name__)

T = TypeVar("T")

THROUGH = 3
"""A busy search candidate that its paired figure does not settle is measured again at
once, this many times as long, before it waits for quiet (`measure_watched`): three
times the blocks narrow a paired interval by about sqrt(3)."""

def other_settings(settings: MeasureSettings) -> MeasureSettings:
    """How the other latency is timed: the other kind, a quarter of the time, 6 blocks."""
    return replace(settings, latency=settings.other_latency,
                   min_runs=max(3, settings.min_runs // 4), min_time_s=settings.min_time_s / 4,
                   max_time_s=settings.max_time_s / 4, min_blocks=6)


def replicated(first: Speedup, again: Callable[[], list[Block]]) -> tuple[Speedup, tuple[str]]:
    """A candidate shown faster than the base route, timed again for as many blocks.

    A route the search shows faster (the lower end of its 95% interval above 1) is built
    on and may be confirmed (`routetune.judging.ranking.shown_faster`); among a search's
    dozen ties, about one in five searches shows one of them faster by chance (each at
    about 2%). So a positive stretch of blocks is replicated: a second stretch as long,
    timed right after it, and the figure is the two combined as independent repeats are
    (`routetune.timing.measure.across_repeats`: the lower of the lower ends), so that the
    route counts as shown faster only if both stretches show it, a chance of about 0.05%
    for a tie. It is the replication a screening positive gets before it is followed
    up (Ioannidis, "Why most published research findings are false", PLoS Med 2005).

    Args:
        first: The first stretch's paired speed-up (its lower end above 1).
        again: Times the second stretch; its blocks in time order.

    Returns:
        The combined speed-up and a note that gives both stretches' figures.
    """
    second = paired_speedup(again(), 0, 1)
    both = across_repeats([first, second])
    held = "both show it" if second.ci_low > 1.0 else "the second does not show it"
    return both, (f"shown faster than the base route, so timed again for as many blocks: "
                  f"{first.figure}, then {second.figure}; {held}, and the figure combines "
                  f"them ({both.figure})",)


class PairedTiming:
    """The base route's engine in this worker, and the timing of candidates beside it.

    Args:
        backend: The worker's backend.
        inputs: The search's trial inputs (feeds, measurement settings, base model,
            busy-machine policy).
    """

    def __init__(self, backend: Backend, inputs: TrialInputs) -> None:
        self.backend = backend
        self.inputs = inputs
        self._base: Runner | Literal[False] | None = None  # False: cannot be built
        self._gpu: str | None = None  # see policy
        self._pace_ms: float | None = None  # the base route's fastest p50 in this process
        self._steady = Steady()  # steady load in this worker (STEADY_AFTER_S)

    def watched(self, timed: Callable[[], T], settled: Callable[[T], bool] | None = None,
                base_ms: Callable[[T], float | None] | None = None,
                pace_ms: float | None = None, probe: Runner | None = None,
                through: Callable[[], T] | None = None,
                ) -> tuple[T, dict[str, Any]]:
        """Run `timed` under the busy-machine policy (`measure_watched`).

        Where engines run on the host CPU, the base route's pace counts too: the fastest of
        its p50 timed alone on a quiet machine the first time in this process (the base
        trial), `pace_ms`, and any later quiet measurement's base route figure below them (a
        pace taken while the host had a vCPU away gives way once the machine shows it can
        run faster). A result whose base route figure is over `PACE_SLOWER` times the pace
        has the base route's engine timed alone for `WINDOW_S` (a paired figure runs up to
        1.5x its alone one on a small model: the two engines share caches and cores); where
        that is slower too, or the paired figure itself is over `PAIRED_SLOWER` times the
        pace, the machine is slower than it was (`pace_note`) and the attempt counts as
        busy. ``wait`` then waits by timing the base route's engine alone until it is back
        to its pace. A wait that runs out, or steady load
        (`routetune.timing.conditions.STEADY_AFTER_S`), with the base route still slower
        takes its figure as the pace from then on: the machine changed for good.

        Args:
            timed: The measurement.
            settled: Whether a busy result stands without a quiet re-measurement.
            base_ms: The base route's p50 (ms) in a result, or None where it has none.
            pace_ms: The base route's p50 alone (ms) from elsewhere (the search's base
                trial, for a confirmation in a fresh process; the side-by-side loop
                before a multi-backend run's searches, for a trial).
            probe: The base route's engine to time alone; None: `base_runner`.
            through: A longer measurement, tried at once on a busy result that is not
                `settled`, before waiting (`measure_watched`).

        Returns:
            Its result, and the machine's conditions meanwhile, with ``pace_x``: the
            base route's p50 in the result over its pace, where both are known on a CPU.
        """
        policy = self.policy()
        pace = min((p for p in (self._pace_ms, pace_ms) if p), default=None)
        paced = base_ms is not None and policy.gpu is None and pace is not None
        alone: list[float] = []

        def look() -> str:
            ms = self._pace_now(probe)
            alone.extend([] if ms is None else [ms])
            return pace_note(ms, pace)

        def slower(result: T, foreign: bool) -> str:
            ms = None if base_ms is None else base_ms(result)
            if not pace_note(ms, pace):
                return ""
            if foreign:  # busy already: its own figure only, no timing alone
                return pace_note(ms, pace, paired=True, foreign=True)
            return pace_note(ms, pace, paired=True) or look()

        result, conditions = measure_watched(policy, self.status(), timed, settled,
                                             slower if paced else None,
                                             look if paced else None, through, self._steady)
        ms = base_ms(result) if base_ms is not None else None
        if paced and ms is not None and pace:
            conditions["pace_x"] = round(ms / pace, 3)
        if ms is not None and (pace is None or ms < pace) and not conditions["busy"]:
            self._pace_ms = ms  # the fastest quiet figure yet: the machine runs it so fast
        elif (paced and alone and conditions["busy"] == pace_note(alone[-1], pace)
              and (conditions["steady"] or conditions["waited_s"] >= policy.max_wait_s)):
            logger.warning("the base route stays at %.3g ms alone after %.0f s of waiting: "
                           "its pace from now on", alone[-1], conditions["waited_s"])
            self._pace_ms = alone[-1]
        return result, conditions

    def _pace_now(self, probe: Runner | None) -> float | None:
        """The base route's p50 (ms) alone over `WINDOW_S` of runs now, or None."""
        runner = probe or self.base_runner()
        if runner is None:
            return None
        short = replace(self.inputs.measure, min_runs=3, min_time_s=WINDOW_S,
                        max_time_s=WINDOW_S, min_blocks=1)
        return measure(runner, self.inputs.feeds, short, warm=True).p50

    def measure(self, runner: Runner, route: Route, bar: Bar | None = None,
                longer: int = 1) -> Timing:
        """Time a candidate in paired blocks with the base route's engine, then alone.

        `longer` times as many blocks and seconds as the search's settings say: a
        candidate measured through a busy machine (`THROUGH`).

        `runner` has run every input set once already (its accuracy pass), which counts
        towards its warm-up (`measure_blocks`).

        The paired blocks time what ``--latency`` names (`MeasureSettings.latency`).
        On a runner with host copies (a GPU engine), the other figure follows, timed
        alone for a quarter of the time (`other_settings`): it is recorded, never judged.
        A candidate out of the race (`routetune.timing.race.out_of_race`) against `bar`
        (with ``--no-race`` or no bar: `HOPELESS`) is timed no further, without the
        other figure.

        Returns:
            `Trial` fields: ``latency``, ``base_latency`` (measured in the same loop)
            and ``paired`` (the paired speed-up); for the base route itself, its
            latency twice and no speed-up; without a base engine, the latency alone.
            ``latency_kind``, and ``other_latency`` (None without host copies).
            ``notes``: why the timing ended early, when it did.
        """
        feeds, settings = self.inputs.feeds, self.inputs.measure
        if longer > 1:
            settings = replace(settings, min_time_s=settings.min_time_s * longer,
                               max_time_s=settings.max_time_s * longer,
                               max_runs=settings.max_runs * longer,
                               min_blocks=settings.min_blocks * longer)
        timed = Timing(latency_kind=settings.latency, base_latency=None, paired=None,
                      other_latency=None, notes=(), raced=None)
        base = None if route.is_base else self.base_runner()
        if route.is_base or base is None:
            timed["latency"] = measure(runner, feeds, settings, warm=True)
            timed["base_latency"] = timed["latency"] if route.is_base else None
        else:
            stopped: list[Speedup] = []
            racing = bar if bar is not None and settings.race else HOPELESS

            def give_up(blocks: list[Block]) -> bool:
                stopped.extend(s for s in [out_of_race(blocks, racing)] if s is not None)
                return bool(stopped)

            (latency, base_latency), blocks = measure_blocks([runner, base], feeds, settings,
                                                              give_up, frozenset({0}))
            timed["latency"], timed["base_latency"] = latency, base_latency
            paired = timed["paired"] = paired_speedup(blocks, 0, 1)
            if stopped:  # the race's figure: at the early look, with its t interval
                timed["paired"] = stopped[0]
                timed["notes"] = (race_note(stopped[0], racing),)
                timed["raced"] = None if math.isinf(racing.speedup) else racing.speedup
                return timed
            if paired.ci_low > 1.0:
                timed["paired"], timed["notes"] = replicated(
                    paired, lambda: measure_blocks([runner, base], feeds, settings,
                                                   warm=frozenset({0, 1}))[1])
        if runner.host_copies:
            timed["other_latency"] = measure(runner, feeds, other_settings(settings))
        return timed

    def memory_before(self, route: Route) -> int | None:
        """Device memory in use before a candidate's engine is made (bytes; None: a host).

        The base route's engine is opened first (it stays open), and engines no longer
        used are collected, so that the difference after timing is the candidate's.
        """
        if not route.is_base:
            self.base_runner()
        gc.collect()
        return self.backend.device_memory_used()

    def memory_taken(self, before: int | None) -> int | None:
        """Device memory the candidate took since `memory_before` (bytes), or None."""
        after = None if before is None else self.backend.device_memory_used()
        return None if after is None or before is None else max(0, after - before)

    def policy(self) -> BusyPolicy:
        """The busy-machine policy, with this worker's GPU where engines run on one."""
        if self._gpu is None:
            gpus = self.backend.gpus(self.backend.full_settings(self.inputs.base_settings))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            self._gpu = (visible or gpus[0]).split(",")[0] if gpus else ""
        return replace(self.inputs.busy, gpu=self._gpu or None)

    def status(self) -> Path:
        """This process's status file while it waits for a quiet machine."""
        return self.inputs.outdir / "artifacts" / f"busy-{os.getpid()}.json"

    def base_runner(self) -> Runner | None:
        """The base route's engine, opened once and kept for paired measurements."""
        if self._base is None:
            path = save_model(self.inputs.outdir, self.inputs.base_data)
            try:
                settings = self.backend.full_settings(self.inputs.base_settings)
                engine = build_engine(self.backend, path, settings,
                                      self.inputs.outdir / "artifacts", "", "")
                self._base = open_engine(self.backend, engine)
            except Exception as e:  # the base trial records the same failure
                logger.warning("base route cannot be built for paired timing: %s", e)
                self._base = False
        return self._base or None

    def close(self) -> None:
        """Close the base route's engine."""
        if self._base:
            self._base.close()
        self._base = None
