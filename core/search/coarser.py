"""Which routes quantize more coarsely than one that failed the accuracy constraint.

A quantizer's parameter may name its finest choice (`routetune.seasoning.Param.finest`):
per-channel weight scales are at least as fine as one scale per tensor, and an
asymmetric activation range ``[min, max]`` at least as fine as a symmetric
``[-max|x|, max|x|]``, on every tensor. A route that differs from one that failed the
constraint only in such parameters, each at another choice where the failed route had
the finest, rounds every tensor at least as coarsely, and is not built: on PP-OCR's
detector, OpenVINO's `int8-qdq` failed at every one of its four choices of
``per_channel`` and ``symmetric_activations``, and `nncf-int8` at both presets
(docs/benchmarks.md, 2026-12-07). The order holds tensor by tensor; a coarser grid whose
errors happen to cancel downstream is what this gives up.

The search loop keeps the failed routes (`Coarser.failed`) and asks `Coarser.finer` of
each route before building it (`routetune.search.loop`); the beam asks the finest
choices first among routes the memory cannot tell apart (`routetune.search.beam`).
"""

from __future__ import annotations

from collections.abc import Callable

from routetune.routes.route import Route, Step, format_value
from routetune.seasoning import Param, ParamValue


class Coarser:
    """This search's routes that failed the accuracy constraint, and what they rule out.

    Args:
        params: A seasoning's parameters by its name (`SeasoningInfo.params`).
    """

    def __init__(self, params: Callable[[str], tuple[Param, ...]]) -> None:
        self._params = params
        self._failed: list[Route] = []

    def failed(self, route: Route) -> None:
        """Keep a route that failed the accuracy constraint."""
        if route not in self._failed:
            self._failed.append(route)

    def finer(self, route: Route) -> tuple[Route, str] | None:
        """A failed route that `route` quantizes more coarsely than, and how; else None.

        Returns:
            The failed route, and its finest choices that `route` leaves
            (``per_channel=true``), comma-separated.
        """
        for failed in self._failed:
            how = self._coarser(route, failed)
            if how:
                return failed, how
        return None

    def _coarser(self, route: Route, failed: Route) -> str:
        """The finest choices `failed` has and `route` leaves; "" unless they differ only so."""
        if len(route) != len(failed):
            return ""
        left: list[str] = []
        for ours, theirs in zip(route, failed, strict=True):
            if ours.name != theirs.name:
                return ""
            for param in self._params(ours.name):
                mine, its = _value(ours, param), _value(theirs, param)
                if mine == its:
                    continue
                if param.finest is None or its != param.finest:
                    return ""
                left.append(f"{param.name}={format_value(its)}")
        return ", ".join(left)



def coarseness(step: Step, params: tuple[Param, ...]) -> int:
    """How many of `step`'s parameters (`params`, its seasoning's) are not at their finest."""
    return sum(1 for p in params if p.finest is not None and _value(step, p) != p.finest)


def _value(step: Step, param: Param) -> ParamValue:
    """`step`'s value of `param`: the one it pins, else the default."""
    return dict(step.params).get(param.name, param.default)


COARSER = "not built: quantizes more coarsely than route"
"""How the reason of a route not built by this rule starts (`coarser_reason`)."""


def coarser_reason(failed: Route, how: str) -> str:
    """The reason recorded for a route not built because a finer one failed (one line)."""
    return f"{COARSER} '{failed}' ({how}), which failed the accuracy constraint here"
