"""Exhaustive search: measure every route in the space (trtexec's ``--tuningSearch=full``)."""

from __future__ import annotations

from typing import Any

from routetune.routes.route import Route
from routetune.search.strategy import Strategy


class Exhaustive(Strategy):
    """Asks for every route of the space once, in the composer's order."""

    name = "exhaustive"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked = False

    def ask(self) -> list[Route]:
        """Every non-base route on the first call; nothing after."""
        if self._asked:
            return []
        self._asked = True
        return [r for r in self.space.routes() if not r.is_base]

    def planned(self) -> int:
        """The size of the space, less the base route."""
        return self.space.size() - 1
