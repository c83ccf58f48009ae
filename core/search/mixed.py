"""Mixed search: one-at-a-time, then exhaustive over the knobs that helped, then an ascent.

trtexec's ``--tuningSearch=mixed`` (TensorRT 11.1, samples/trtexec/README.md): a
``fast`` pass, then the Cartesian product of only the "positive" knobs, those whose
change beat the baseline. Here a change is positive when it met the accuracy
constraint and the upper end of the 95% confidence interval of its latency, relative to
the base route measured alongside, is below 1: faster beyond noise.

Then, unless ``ascent=false`` (trtexec's mixed exactly): a greedy ascent (hill climbing,
one seasoning at a time) from the fastest route so far that beats the base route beyond
noise. Every one-step extension of it is tried (`RouteSpace.extensions`), knobs that did
not help alone included, and again from a faster route while one is found, up to the
depth limit. When no route beats the base route, there is nothing to climb from, and
the search ends after the single changes. A knob that helps
only with others is found this way: on ResNet-50 on an H200, ``fuse_conv_bias`` is
slower than the base route alone in FP32 and decides the best route with FP16 and NHWC
(docs/benchmarks.md, "Search efficiency on the H200").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from routetune.judging.ranking import rank_key, shown_faster
from routetune.options import option
from routetune.records.trial import Status
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route
from routetune.search.one_at_a_time import single_changes
from routetune.search.strategy import Result, Strategy
from routetune.seasoning import ParamValue, SeasoningInfo


def beats_base(result: Result) -> bool:
    """Whether a route is accurate and faster than the base route beyond noise.

    Only on a measurement that may decide a winner (`Result.trusted`).
    """
    return result.status == Status.OK and result.trusted and shown_faster(result)


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


@dataclass(frozen=True)
class MixedOptions:
    """The mixed search's options."""

    ascent: bool = option(True, help="After the positive combinations, extend the fastest "
                          "accurate route one seasoning at a time while that finds a faster "
                          "one (false: trtexec's mixed exactly).")


class Mixed(Strategy):
    """One-at-a-time first, then every combination of the positive changes, then an ascent."""

    name = "mixed"
    Options = MixedOptions
    options: MixedOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = 0
        self._told: dict[Route, Result] = {}
        self._climbed: set[Route] = set()  # routes the ascent has extended

    def ask(self) -> list[Route]:
        """The next routes; an empty list when the search is done.

        Phase 1: the single changes; 2: the positive space's untried routes; then the
        ascent's extensions of the fastest accurate route, while that route changes.
        """
        self._phase += 1
        if self._phase == 1:
            return single_changes(self.space)
        if self._phase == 2:
            positive = [r for r, t in self._told.items() if not r.is_base and beats_base(t)]
            if len(positive) >= 2:
                routes = [r for r in positive_space(self.space, positive).routes()
                          if not r.is_base and r not in self._told]
                if routes:
                    return routes
        return self._ascend() if self.options.ascent else []

    def _ascend(self) -> list[Route]:
        """The untried one-step extensions of the fastest route not yet extended.

        Only a route that beats the base route beyond noise (`beats_base`) and is in the
        race (`routetune.timing.race`) is climbed from.
        """
        accurate = [r for r, t in self._told.items()
                    if beats_base(t) and not t.out_of_race]
        if not accurate:
            return []
        best = min(accurate, key=lambda r: rank_key(self._told[r]))
        if best in self._climbed:
            return []
        self._climbed.add(best)
        return [r for r in self.space.extensions(best) if r not in self._told]

    def tell(self, route: Route, result: Result) -> None:
        """Record a result."""
        self._told[route] = result
