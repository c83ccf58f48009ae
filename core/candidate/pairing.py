"""Timing a candidate against the base route in one worker, in paired blocks.

The base route's engine is opened once per worker and kept; each candidate is timed in
alternating blocks with it (`routetune.timing.measure.measure_blocks`), so that the machine's
drift cancels out of the speed-up (`routetune.timing.measure.paired_speedup`). A candidate
that is clearly far slower than the base route is timed no further (`hopeless`). Every
timing waits for a quiet machine, or marks itself noisy, as ``--busy-machine`` says
(`routetune.timing.conditions.measure_watched`).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from routetune.backend import Backend, Runner
from routetune.candidate.artifacts import build_engine, open_engine, save_model
from routetune.candidate.records import Timing, TrialInputs
from routetune.routes.route import Route
from routetune.timing.conditions import BusyPolicy, measure_watched
from routetune.timing.measure import (
    Block,
    MeasureSettings,
    Speedup,
    measure,
    measure_blocks,
    paired_speedup,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

HOPELESS_SPEEDUP = 0.5
"""A candidate whose paired speed-up stays below this in every one of `HOPELESS_PAIRS`
paired blocks or more (the whole 95% interval below it) is timed no further: it is at
least twice as slow as the base route, so it cannot win, and its figure is already
clear. On PP-OCR's recognizer on an H200, a cuDNN algorithm choice 35x slower than the
base route took 28 s to measure, and 16–17 s with this stop (docs/benchmarks.md, "A
hopeless candidate stops early")."""

HOPELESS_PAIRS = 6
"""Paired blocks before `hopeless` may judge: the fewest for which `median_ci` gives an
interval (with 6, the whole range of the 6 ratios)."""


def hopeless(blocks: list[Block]) -> Speedup | None:
    """The paired speed-up of runner 0 over runner 1 if it is hopeless, else None.

    Hopeless: at least `HOPELESS_PAIRS` candidate blocks, and the upper end of the
    speed-up's 95% interval (`routetune.timing.measure.paired_speedup`) below
    `HOPELESS_SPEEDUP`.
    """
    if sum(b.runner == 0 for b in blocks) < HOPELESS_PAIRS:
        return None
    speedup = paired_speedup(blocks, 0, 1)
    return speedup if speedup.ci_high < HOPELESS_SPEEDUP else None


def other_settings(settings: MeasureSettings) -> MeasureSettings:
    """How the other latency is timed: the other kind, a quarter of the time, 6 blocks."""
    return replace(settings, latency=settings.other_latency,
                   min_runs=max(3, settings.min_runs // 4), min_time_s=settings.min_time_s / 4,
                   max_time_s=settings.max_time_s / 4, min_blocks=6)


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

    def watched(self, timed: Callable[[], T]) -> tuple[T, dict[str, Any]]:
        """Run `timed` under the busy-machine policy (`measure_watched`).

        Returns:
            Its result, and the machine's conditions meanwhile.
        """
        return measure_watched(self.policy(), self.status(), timed)

    def measure(self, runner: Runner, route: Route) -> Timing:
        """Time a candidate in paired blocks with the base route's engine, then alone.

        The paired blocks time what ``--latency`` names (`MeasureSettings.latency`).
        On a runner with host copies (a GPU engine), the other figure follows, timed
        alone for a quarter of the time (`other_settings`): it is recorded, never judged.
        A `hopeless` candidate's timing ends at that point, without the other figure.

        Returns:
            `Trial` fields: ``latency``, ``base_latency`` (measured in the same loop)
            and ``paired`` (the paired speed-up); for the base route itself, its
            latency twice and no speed-up; without a base engine, the latency alone.
            ``latency_kind``, and ``other_latency`` (None without host copies).
            ``notes``: why the timing ended early, when it did.
        """
        feeds, settings = self.inputs.feeds, self.inputs.measure
        timed = Timing(latency_kind=settings.latency, base_latency=None, paired=None,
                      other_latency=None, notes=())
        base = None if route.is_base else self.base_runner()
        if route.is_base or base is None:
            timed["latency"] = measure(runner, feeds, settings)
            timed["base_latency"] = timed["latency"] if route.is_base else None
        else:
            stopped: list[Speedup] = []

            def give_up(blocks: list[Block]) -> bool:
                stopped.extend(s for s in [hopeless(blocks)] if s is not None)
                return bool(stopped)

            (latency, base_latency), blocks = measure_blocks([runner, base], feeds, settings,
                                                              give_up)
            timed["latency"], timed["base_latency"] = latency, base_latency
            timed["paired"] = paired_speedup(blocks, 0, 1)
            if stopped:
                p = stopped[0]
                timed["notes"] = (
                    f"timing stopped after {p.pairs} paired blocks: {p.value:.3f}x "
                    f"[{p.ci_low:.3f}, {p.ci_high:.3f}] over the base route, below "
                    f"{HOPELESS_SPEEDUP}x in every block; it cannot win",)
                return timed
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
