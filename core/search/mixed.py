"""Mixed search: one-at-a-time, then exhaustive over the knobs that helped.

trtexec's ``--tuningSearch=mixed`` (TensorRT 11.1, samples/trtexec/README.md): a
``fast`` pass, then the Cartesian product of only the "positive" knobs, those whose
change beat the baseline. Here a change is positive when it met the accuracy
constraint and the upper end of the 95% confidence interval of its latency, relative to
the base route measured alongside, is below 1: faster beyond noise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from routetune.composer import RouteSpace
from routetune.route import Route
from routetune.search.one_at_a_time import single_changes
from routetune.search.strategy import Strategy
from routetune.seasoning import ParamValue, SeasoningInfo
from routetune.trial import Status, Trial


def beats_base(trial: Trial) -> bool:
    """Whether a trial is accurate and faster than the base route beyond noise."""
    rel = trial.relative
    return (trial.status == Status.OK and rel is not None and trial.base_latency is not None
            and rel.ci_high < 1.0)


def positive_space(space: RouteSpace, positive: list[Route]) -> RouteSpace:
    """The space of only the positive knobs.

    A seasoning is kept when one of its single changes was positive. A parameter whose
    non-default value was positive keeps its positive values and its default; every
    other parameter stays at its default.
    """
    values: dict[str, dict[str, list[ParamValue]]] = {}
    for route in positive:
        for step in route:
            per_param = values.setdefault(step.name, {})
            for key, value in step.params:
                per_param.setdefault(key, []).append(value)
    infos: list[SeasoningInfo] = []
    for name, per_param in values.items():
        info = space.infos[name]
        params = tuple(
            dataclasses.replace(p, choices=tuple(dict.fromkeys(
                [p.default, *per_param.get(p.name, [])])))
            for p in info.params)
        infos.append(dataclasses.replace(info, params=params))
    return RouteSpace(infos, space.max_depth)


class Mixed(Strategy):
    """One-at-a-time first, then every combination of the positive changes."""

    name = "mixed"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = 0
        self._told: dict[Route, Trial] = {}

    def ask(self) -> list[Route]:
        """Phase 1: the single changes. Phase 2: the positive space's untried routes."""
        self._phase += 1
        if self._phase == 1:
            return single_changes(self.space)
        if self._phase > 2:
            return []
        positive = [r for r, t in self._told.items() if not r.is_base and beats_base(t)]
        if len(positive) < 2:
            return []
        return [r for r in positive_space(self.space, positive).routes()
                if not r.is_base and r not in self._told]

    def tell(self, route: Route, trial: Trial) -> None:
        """Record a trial."""
        self._told[route] = trial
