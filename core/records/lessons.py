"""Lessons: what one search's trials teach about each step, for the route memory.

A `Lesson` is one step's measured effect over its parent route (the route without that
step) on one model, backend and device, or the step's failure there; `lessons_of`
derives them from a search's trials. `routetune.records.memory` keeps them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from routetune.model.signature import ModelSignature
from routetune.records.trial import SAME_KERNELS, Status, Trial
from routetune.routes.route import Route

MAX_TEXT = 2000
"""Characters at most in a route, step or reason (a longer reason is cut)."""


class Outcome(str, Enum):
    """What adding a step to its parent route did."""

    TIMED = "timed"
    """Built, accurate and timed: `Lesson.speedup` is its effect."""
    INACCURATE = "inaccurate"
    """Built and timed, but it missed the accuracy constraint (`Lesson.margin` < 0)."""
    FAILED = "failed"
    """It made the build fail, crash or time out (`Lesson.reason`)."""
    NO_OP = "no-op"
    """It changed nothing the engine runs: the same engine, or the same kernels on other
    weight values (`routetune.backend.Engine.kernels`), as its parent."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Lesson:
    """One step's effect over its parent route, on one model, backend and device.

    Args:
        signature: The model's (`routetune.model.signature.ModelSignature`).
        backend: The backend's name.
        backend_version: Its version.
        device: The device description (``cpu: AMD EPYC (2 cores)``).
        parent: The parent route's text (``base`` for a single step).
        step: The step's text (``int8-qdq{per_channel=false}``).
        outcome: What it did (`Outcome`).
        speedup: The route's speed-up over its parent (x, > 1: faster): the ratio of
            their paired speed-ups over the base route; None unless timed.
        low: The lower end of its 95% interval (x).
        high: The upper end (x).
        margin: The route's accuracy margin (`routetune.judging.constraint.Constraint.margin`):
            > 0 met with that slack, < 0 missed; None when not measured.
        reason: Why it failed, or "".
        created_at: Unix time it was learned.
    """

    signature: ModelSignature
    backend: str
    backend_version: str
    device: str
    parent: str
    step: str
    outcome: Outcome
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    margin: float | None = None
    reason: str = ""
    created_at: float = 0.0

    @property
    def key(self) -> str:
        """sha256 of what the lesson says (hex), its creation time left out."""
        parts = [self.signature.key, self.backend, self.backend_version, self.device,
                 self.parent, self.step, str(self.outcome),
                 *(None if v is None else round(v, 6)
                   for v in (self.speedup, self.low, self.high, self.margin)), self.reason]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def lessons_of(trials: Sequence[Trial], signature: ModelSignature, backend_version: str,
               margin: Callable[[Trial], float | None]) -> list[Lesson]:
    """What one search's trials teach: each step's effect over its parent route.

    For every route and every step in it whose parent (the route without that step)
    has a trial in `trials`: the route's speed-up over the parent when both were timed
    accurately; inaccurate when the route missed the constraint and its parent met it;
    failed when the route failed to build, crashed or timed out and its parent did not;
    no-op when it was recorded as its parent's engine. A trial measured on a busy
    machine (`Trial.noisy`) teaches too: its speed-up is paired with the base route's,
    which the same load slowed, and its interval is as wide as the noise made it.

    Args:
        trials: One search's trials (one model, backend and device), the base route's
            among them.
        signature: The model's.
        backend_version: The backend's version.
        margin: A trial's accuracy margin under the run's constraint.
    """
    by_route = {t.route: t for t in trials}
    lessons = []
    for trial in trials:
        route = trial.steps
        if route.is_base or not route.names:
            continue
        for i, step in enumerate(route):
            parent_route = Route(route.steps[:i] + route.steps[i + 1:])
            parent = by_route.get(str(parent_route))
            if parent is None:
                continue
            lesson = _taught(trial, parent)
            if lesson is not None:
                kind, speedup, low, high, why = lesson
                lessons.append(Lesson(signature, trial.backend, backend_version,
                                      trial.device, str(parent_route), str(step), kind,
                                      speedup, low, high, margin(trial), why))
    return lessons


def _taught(trial: Trial, parent: Trial
            ) -> tuple[Outcome, float | None, float | None, float | None, str] | None:
    """What `trial` says of the step that makes it from `parent`; None: nothing."""
    if trial.status == Status.SKIPPED:
        same = trial.reason.startswith("same engine as") and (
            trial.candidate_sha256 == parent.candidate_sha256)
        parent_name = "the base route" if parent.steps.is_base else f"route '{parent.route}'"
        kernels = trial.reason.startswith(f"{SAME_KERNELS} {parent_name}:")
        return (Outcome.NO_OP, None, None, None, "") if same or kernels else None
    if trial.status.failed:
        return None if parent.status.failed else (Outcome.FAILED, None, None, None,
                                                  trial.reason[:MAX_TEXT])
    mine, theirs = trial.relative, parent.relative
    if not trial.status.measured or mine is None or (
            theirs is None and not parent.steps.is_base):
        return None
    if parent.steps.is_base:
        theirs_p50, theirs_low, theirs_high = 1.0, 1.0, 1.0
    else:
        assert theirs is not None
        theirs_p50, theirs_low, theirs_high = theirs.p50, theirs.ci_low, theirs.ci_high
    speedup = theirs_p50 / mine.p50
    # the log interval half-widths add in quadrature (two independent estimates)
    half = math.hypot(math.log(mine.ci_high / mine.ci_low),
                      math.log(theirs_high / theirs_low)) / 2
    if trial.status == Status.ACCURACY_FAILED:
        met = parent.status == Status.OK
        return (Outcome.INACCURATE, speedup, speedup * math.exp(-half),
                speedup * math.exp(half), trial.reason[:MAX_TEXT]) if met else None
    return (Outcome.TIMED, speedup, speedup * math.exp(-half), speedup * math.exp(half), "")
