"""The route memory's prior: what it expects of each step on a model like this one.

`prior_of` reduces the lessons of other models (`routetune.records.lessons`) to one
normal estimate per step, weighted by how alike the models are; the learned search
(`routetune.search.learned`) starts from it. A prior orders and prunes a search; it is
never a measurement.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from routetune.model.signature import ModelSignature
from routetune.records.lessons import Lesson, Outcome


@dataclass(frozen=True)
class StepPrior:
    """What the memory expects of one step on a model like this one.

    Args:
        mean: The expected natural log of its speed-up over its parent (0: no effect).
        sd: Its standard deviation (log), from the spread across similar models and
            parents, and one pseudo-observation of no effect with sd `PRIOR_SD`.
        weight: The similarity-weighted number of models behind it.
        fail: The similarity-weighted share of its lessons that failed or were
            inaccurate, shrunk towards 0.1 by one pseudo-model.
    """

    mean: float
    sd: float
    weight: float
    fail: float


PRIOR_SD = 0.3
"""Standard deviation (natural log of a speed-up) of a step the memory knows nothing of:
about 0.74x to 1.35x within one sd. The prior every step's estimate is shrunk towards."""


@dataclass(frozen=True)
class Prior:
    """The memory's expectations for one model, backend and device, by step text.

    Args:
        steps: Step text to what the memory expects of it; a step it knows nothing of
            is missing.
        lessons: Lessons read that bear on this backend.
        models: Other models (signatures) they came from.
        skipped: Rows skipped as malformed (an untrusted file).
    """

    steps: Mapping[str, StepPrior] = field(default_factory=dict)
    lessons: int = 0
    models: int = 0
    skipped: int = 0
    elsewhere: int = 0
    """Of `models`, those measured only on another device (weighed half)."""

    def step(self, step: Any) -> tuple[float, float, float, bool]:
        """Mean and sd of a step's log speed-up, its chance to fail, and whether known.

        A step the memory has no lesson for, but whose seasoning it knows with other
        parameters, takes half their mean effect with a wider sd; one it knows nothing
        of, no effect with sd `PRIOR_SD` and a chance to fail of 0.1.

        Args:
            step: A route's step (`routetune.routes.route.Step`): its text keys the
                lessons, its ``name`` the seasoning.
        """
        known = self.steps.get(str(step))
        if known is not None:
            return known.mean, known.sd, known.fail, True
        kin = [p for text, p in self.steps.items() if text.partition("{")[0] == step.name]
        if kin:
            mean = sum(p.mean for p in kin) / len(kin) / 2
            return mean, math.hypot(PRIOR_SD, mean), sum(p.fail for p in kin) / len(kin), True
        return 0.0, PRIOR_SD, 0.1, False

    def describe(self) -> str:
        """One line for the start of a run: what the memory knows here."""
        if not self.steps:
            return "nothing yet for this backend"
        n = len(self.steps)
        known = f"{n} step{'s' * (n != 1)} from {self.lessons:,} lesson" \
                f"{'s' * (self.lessons != 1)} on {self.models} model{'s' * (self.models != 1)}"
        notes = ([f"{self.elsewhere} of them on another device, weighed half"]
                 if self.elsewhere else []) + (
            [f"{self.skipped:,} malformed rows skipped"] if self.skipped else [])
        return known + (f" ({'; '.join(notes)})" if notes else "")


def model_summary(found: list[Lesson]) -> tuple[float, float, float]:
    """Mean log speed-up, its variance, and share failed, of one step's lessons on one model.

    The share counts lessons that failed or missed the accuracy constraint. A step never
    timed on the model (every lesson a failure) has no effect, with variance
    ``PRIOR_SD ** 2``.

    Args:
        found: The lessons of one step on one model and device (at least one).
    """
    logs = [math.log(x.speedup) for x in found
            if x.speedup is not None and x.outcome != Outcome.FAILED]
    fail = sum(x.outcome in (Outcome.FAILED, Outcome.INACCURATE) for x in found) / len(found)
    if not logs:
        return 0.0, PRIOR_SD ** 2, fail
    mean = sum(logs) / len(logs)
    return mean, sum((v - mean) ** 2 for v in logs) / len(logs), fail


def prior_of(lessons: Iterable[Lesson], signature: ModelSignature, device: str,
             skipped: int = 0) -> Prior:
    """What `lessons` (of one backend) say of each step on a model like `signature`.

    Each other model weighs by its similarity to this
    one (`ModelSignature.similarity`, squared), halved for another device. Per model,
    a step's lessons are averaged (log speed-up); across models, the average is
    weighted by model and shrunk towards no effect by one pseudo-model of sd
    `PRIOR_SD` (empirical Bayes; Gelman et al., *Bayesian Data Analysis*, 3rd ed.,
    §5.4, normal hierarchical model). Lessons of this very model (equal signature
    and device) weigh fully: a run again on the same model learns from itself.
    """
    per_model: dict[tuple[str, str], dict[str, list[Lesson]]] = defaultdict(
        lambda: defaultdict(list))
    weights: dict[tuple[str, str], float] = {}
    count = 0
    for lesson in lessons:
        key = (lesson.signature.key, lesson.device)
        if key not in weights:
            weights[key] = (lesson.signature.similarity(signature) ** 2
                            * (1.0 if lesson.device == device else 0.5))
        if weights[key] > 0:
            count += 1
            per_model[key][lesson.step].append(lesson)
    steps: dict[str, StepPrior] = {}
    names = {step for by_step in per_model.values() for step in by_step}
    for step in names:
        means, spreads, fails, ws = [], [], [], []
        for key, by_step in per_model.items():
            found = by_step.get(step)
            if not found:
                continue
            mean, spread, fail = model_summary(found)
            means.append(mean)
            spreads.append(spread)
            fails.append(fail)
            ws.append(weights[key])
        total = sum(ws)
        mean = sum(w * m for w, m in zip(ws, means, strict=True)) / (total + 1.0)
        var = (PRIOR_SD ** 2 + sum(w * ((m - mean) ** 2 + s) for w, m, s in
                                   zip(ws, means, spreads, strict=True))) / (total + 1.0)
        fail = (0.1 + sum(w * f for w, f in zip(ws, fails, strict=True))) / (total + 1.0)
        steps[step] = StepPrior(mean, max(math.sqrt(var), 0.02), total, fail)
    return Prior(steps, count, len({k for k, _ in per_model}), skipped,
                 len({k for k, d in per_model if d != device}
                     - {k for k, d in per_model if d == device}))


