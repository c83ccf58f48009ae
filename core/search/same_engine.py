"""Which routes are one engine: steps whose pass changed nothing on this model.

A step whose pass record says ``modified: false`` (`routetune.seasoning.PassResult`)
left the model and the settings as it found them, so the route with it and the route
without it build one engine. `SameEngine` learns such steps from the pass records of
the trials built so far, and gives each route its shortest equal: the route without
the steps known to change nothing where they stand. The search loop measures that
engine once, under the shortest route's name, and records the longer routes as the
same engine (`routetune.search.loop`).

Whether a step changes the model depends on what ran before it (``fold-constants``
after ``fp16`` may fold what it could not before), so a step is known to change
nothing only after the same effective steps: the key is the shortest equal route of
the steps before it, in the order they are applied (graph and precision steps first,
then build steps; `routetune.candidate.application.RouteApplier.apply`).

A step can also change the model and still leave the engine's kernels as they were
(OpenVINO folds batch norms into convolutions itself): a backend that can say so gives
each engine its kernels (`routetune.backend.Engine.kernels`), and a route whose kernels
are those of a measured route within it that met the accuracy constraint runs as fast
as that one, with more steps; it is recorded with `same_kernels_reason`, not timed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from routetune.records.trial import SAME_KERNELS
from routetune.routes.route import Route, Step


class SameEngine:
    """Steps known to change nothing where they stand, learned from pass records.

    Args:
        stage: A seasoning's stage by name (``graph``, ``precision``, ``build``).
        base_passes: How many pass records a trial's list starts with (the backend's
            preflight and the pinned prefix) before its route's own.
    """

    def __init__(self, stage: Callable[[str], str], base_passes: int) -> None:
        self._stage = stage
        self._base_passes = base_passes
        self._unchanged: dict[tuple[Route, Step], bool] = {}  # True: changed nothing

    def applied(self, route: Route) -> list[Step]:
        """The route's steps in the order they are applied: model steps, then build steps."""
        model = [s for s in route if self._stage(s.name) != "build"]
        return model + [s for s in route if self._stage(s.name) == "build"]

    def learn(self, route: Route, passes: Sequence[Mapping[str, Any]]) -> None:
        """Learn from a built route's pass records.

        `passes` holds the base records first, then one per step in the order applied
        (fewer when a step failed).
        """
        ours = list(passes[self._base_passes:])
        effective: list[Step] = []
        for step, record in zip(self.applied(route), ours, strict=False):
            unchanged = record.get("modified") is False
            self._unchanged.setdefault((Route(tuple(effective)), step), unchanged)
            if not unchanged:
                effective.append(step)

    def shortest(self, route: Route) -> tuple[Route, tuple[Step, ...]]:
        """The route without the steps known to change nothing where they stand.

        Returns:
            That route, and the steps left out (none when none is known: the route is
            its own shortest equal).
        """
        effective: list[Step] = []
        dropped: list[Step] = []
        for step in self.applied(route):
            if self._unchanged.get((Route(tuple(effective)), step)):
                dropped.append(step)
            else:
                effective.append(step)
        if not dropped:
            return route, ()
        return Route(tuple(s for s in route if s not in dropped)), tuple(dropped)

    def passes_of(self, route: Route, passes: Sequence[Mapping[str, Any]],
                  dropped: Sequence[Step]) -> tuple[Mapping[str, Any], ...]:
        """A built route's pass records without those of `dropped` steps.

        They are the records of its shortest equal route.
        """
        ours = list(passes[self._base_passes:])
        kept = [r for step, r in zip(self.applied(route), ours, strict=False)
                if step not in dropped]
        return (*passes[:self._base_passes], *kept)


def same_engine_reason(shortest: Route, dropped: Sequence[Step]) -> str:
    """The reason recorded for a route that is another's engine (one line)."""
    steps = ", ".join(f"'{s}'" for s in dropped)
    verb = "changes" if len(dropped) == 1 else "change"
    name = "the base route" if shortest.is_base else f"route '{shortest}'"
    return (f"same engine as {name}: {steps} {verb} nothing on this model there "
            "(no build or timing of its own)")


def same_kernels_reason(backend: str, within: Route) -> str:
    """The reason recorded for a route whose engine runs `within`'s kernels (one line).

    The same for every such route of `within`, so that a summary counts them as one
    reason; the route's own steps are in its name.
    """
    name = "the base route" if within.is_base else f"route '{within}'"
    return (f"{SAME_KERNELS} {name}: {backend} compiles this route's model to the same "
            "layers, kernels, precisions and properties, its weight values aside, so it "
            "runs as fast and can at best tie it (not timed or checked for accuracy)")
