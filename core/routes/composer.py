"""The route composer: expands a set of seasonings into the routes a search may try.

A route space is every subset of the offered seasonings (up to a depth limit) × every
parameter choice × every ordering that can matter:

1. Stages run in a fixed order: graph, then precision, then build.
2. Within the graph and precision stages, declared ``after``/``before`` pairs fix the
   order; pairs with no declared order are tried both ways, since two rewrites need
   not commute. Orderings are the linear extensions of that partial order.
3. Build seasonings only set backend options, so they commute: one ordering, by name.
4. A subset that misses a ``requires`` or holds a ``conflicts`` pair is dropped.

Everything is deterministic: the same seasonings give the same routes in the same order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from routetune.errors import UsageError
from routetune.options import OptionError
from routetune.registry import Registry
from routetune.routes.route import Route, Step
from routetune.seasoning import STAGES, ParamValue, SeasoningInfo


class RouteSpace:
    """The routes that can be composed from a set of seasonings.

    Args:
        infos: The seasonings on offer (already filtered for applicability); those
            with ``searched=False`` are left out.
        max_depth: The most seasonings in one route; None for no limit.
    """

    def __init__(self, infos: Iterable[SeasoningInfo], max_depth: int | None = None) -> None:
        self.infos = {info.name: info for info in sorted(infos, key=lambda i: i.name)
                      if info.searched}
        self.max_depth = len(self.infos) if max_depth is None else max_depth
        if self.max_depth < 0:
            raise OptionError("max_depth", f" {max_depth}: must be 0 or more")

    def choices(self, name: str) -> list[Step]:
        """Every parameter combination of one seasoning, as canonical steps."""
        info = self.infos[name]
        names = [p.name for p in info.params]
        combos = itertools.product(*(p.choices for p in info.params))
        return [canonical_step(info, dict(zip(names, combo, strict=True))) for combo in combos]

    def consistent(self, names: Iterable[str]) -> bool:
        """Whether a set of seasonings meets every ``requires`` and ``conflicts``."""
        chosen = set(names)
        for name in chosen:
            info = self.infos[name]
            if not info.requires <= chosen or info.conflicts & chosen:
                return False
        return True

    def orderings(self, names: Iterable[str]) -> list[tuple[str, ...]]:
        """Every order of `names` that can matter (rules 1–3 above), deterministically."""
        chosen = sorted(set(names))
        by_stage = [[n for n in chosen if self.infos[n].stage == stage] for stage in STAGES]
        per_stage = [
            [tuple(group)] if stage == "build" else _linear_extensions(group, self._must_precede)
            for stage, group in zip(STAGES, by_stage, strict=True)
        ]
        return [sum(parts, ()) for parts in itertools.product(*per_stage)]

    def _must_precede(self, a: str, b: str) -> bool:
        return a in self.infos[b].after or b in self.infos[a].before

    def subsets(self) -> Iterator[tuple[str, ...]]:
        """Consistent subsets of the offered seasonings, smallest first, then by name."""
        for k in range(min(self.max_depth, len(self.infos)) + 1):
            for subset in itertools.combinations(self.infos, k):
                if self.consistent(subset):
                    yield subset

    def routes(self) -> Iterator[Route]:
        """Every route of the space, the base route first."""
        for subset in self.subsets():
            for order in self.orderings(subset):
                for steps in itertools.product(*(self.choices(n) for n in order)):
                    yield Route(tuple(steps))

    def size(self) -> int:
        """The number of routes `routes` yields, counted without building them."""
        total = 0
        for subset in self.subsets():
            combos = math.prod(len(self.choices(n)) for n in subset)
            total += combos * len(self.orderings(subset))
        return total

    def extensions(self, route: Route) -> list[Route]:
        """Routes that add one seasoning to `route`, keeping its existing order.

        A seasoning whose ``requires`` are missing is added together with them, at
        their default parameters. Used by beam search to grow routes one step at a time.
        """
        if len(route) >= self.max_depth:
            return []
        present = dict(zip(route.names, route.steps, strict=True))
        out: list[Route] = []
        for name in self.infos:
            if name in present:
                continue
            added = {name} | (self.infos[name].requires - set(present))
            if not added <= set(self.infos) or len(present) + len(added) > self.max_depth:
                continue
            if not self.consistent(set(present) | added):
                continue
            extras = {n: Step(n) for n in added - {name}}
            for order in self.orderings(set(present) | added):
                if [n for n in order if n in present] != list(route.names):
                    continue
                for step in self.choices(name):
                    fixed = {**present, **extras, name: step}
                    out.append(Route(tuple(fixed[n] for n in order)))
        return out


def canonical_step(info: SeasoningInfo, params: Mapping[str, ParamValue]) -> Step:
    """A step with only the parameters that differ from their defaults (its canonical form)."""
    defaults = info.defaults()
    return Step.of(info.name, {k: v for k, v in params.items() if v != defaults.get(k)})


def _linear_extensions(
    items: Sequence[str], must_precede: Callable[[str, str], bool]
) -> list[tuple[str, ...]]:
    """All orders of `items` that respect `must_precede(a, b)`, in lexicographic order."""
    if not items:
        return [()]
    out: list[tuple[str, ...]] = []
    for head in items:
        rest = [i for i in items if i != head]
        if any(must_precede(other, head) for other in rest):
            continue
        out.extend((head, *tail) for tail in _linear_extensions(rest, must_precede))
    return out


def resolve_route(route: Route, registry: Registry) -> Route:
    """Check a hand-written route against the registry and fill in default parameters.

    Args:
        route: A parsed route, perhaps with parameters left out.
        registry: The installed seasonings.

    Returns:
        The same route in canonical form: parameters at their default are left out.

    Raises:
        UsageError: An unknown seasoning or parameter, a bad value, a repeated
            seasoning, a broken ``requires``/``conflicts``, or an order that breaks the
            stage order or a declared ``after``/``before``.
    """
    steps: list[Step] = []
    for step in route:
        cls = registry.seasoning(step.name)
        steps.append(canonical_step(cls.info, cls(dict(step.params)).params))
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise UsageError(f"route '{route}': a seasoning appears twice; list each once")
    infos = {n: registry.seasoning(n).info for n in names}
    for i, a in enumerate(names):
        missing = infos[a].requires - set(names)
        if missing:
            need = ", ".join(sorted(missing))
            raise UsageError(f"route '{route}': '{a}' requires {need}; add it")
        clash = infos[a].conflicts & set(names)
        if clash:
            raise UsageError(f"route '{route}': '{a}' conflicts with {', '.join(sorted(clash))}; "
                             "keep one of them")
        for b in names[i + 1:]:
            if STAGES.index(infos[a].stage) > STAGES.index(infos[b].stage):
                raise UsageError(
                    f"route '{route}': '{a}' ({infos[a].stage}) must come after "
                    f"'{b}' ({infos[b].stage}); stages run graph, precision, build"
                )
            if a in infos[b].before or b in infos[a].after:
                raise UsageError(f"route '{route}': '{b}' must run before '{a}'; swap them")
    return Route(tuple(steps))
