"""One-at-a-time search: the base route plus each knob changed alone.

trtexec's ``--tuningSearch=fast`` (TensorRT 11.1, samples/common/sampleTuning.h): one
baseline with every knob at its default, then one variant per knob value, linear in the
number of knobs. Here a knob is a seasoning (present at its defaults) or one value of
one of its parameters (the others at their defaults). A seasoning that requires others
comes with them, at their defaults.
"""

from __future__ import annotations

from typing import Any

from routetune.routes.composer import RouteSpace, canonical_step
from routetune.routes.route import Route, Step
from routetune.search.strategy import Strategy


def single_changes(space: RouteSpace) -> list[Route]:
    """Every route of one knob change from the base route, in the space's order.

    Returns:
        Per seasoning (by name): the seasoning at its defaults (when every default is
        among its parameter's choices), then each non-default value of each parameter
        alone; duplicates and routes that break a declared
        conflict left out.
    """
    routes: dict[Route, None] = {}
    for name, info in space.infos.items():
        # the seasoning at its defaults, unless a parameter's default is not a choice
        # (a space restricted with --space leaves only the values listed)
        at_defaults = all(p.default in p.choices for p in info.params)
        steps = [Step(name)] if at_defaults else []
        for p in info.params:
            steps += [canonical_step(info, {p.name: v}) for v in p.choices if v != p.default]
        needed = sorted(info.requires)
        if not set(needed) <= set(space.infos) or not space.consistent([name, *needed]):
            continue
        orders = space.orderings([name, *needed])
        if not orders:
            continue
        for step in steps:
            fixed = {n: Step(n) for n in needed} | {name: step}
            routes[Route(tuple(fixed[n] for n in orders[0]))] = None
    return [r for r in routes if not r.is_base]


class OneAtATime(Strategy):
    """Asks once for every single-knob change (`single_changes`)."""

    name = "one-at-a-time"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked = False

    def ask(self) -> list[Route]:
        """Every single change on the first call; nothing after."""
        if self._asked:
            return []
        self._asked = True
        return single_changes(self.space)

    def planned(self) -> int:
        """The number of single changes."""
        return len(single_changes(self.space))
