"""TPE search: Optuna's Tree-structured Parzen Estimator samples the routes.

The baseline that Olive's auto-optimizer uses, and a way for Optuna users to drive
routetune. Bergstra, Bardenet, Bengio and Kégl, "Algorithms for hyper-parameter
optimization", NeurIPS 2011; Optuna's `optuna.samplers.TPESampler`, through its
ask-and-tell interface (`optuna.study.Study.ask` with fixed distributions).

Each seasoning of the space is one categorical parameter: off, or one of its parameter
combinations (`routetune.routes.composer.RouteSpace.choices`). A sample whose set breaks
a ``requires`` or ``conflicts``, or is deeper than ``--max-depth``, is told as failed
and sampled again, as is one already tried (told as failed, so that copies of one
result do not crowd TPE's model); after `RESAMPLES` such samples, an untried route is
taken at random (seeded) and enqueued, so TPE is told of it too. A route takes the
composer's first ordering of its set. The objective is the log speed-up over the base
route measured alongside (maximised); a route that failed or missed the accuracy
constraint is told as failed. TPE knows nothing of the route memory: it starts from
zero on every model, as Olive's does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from routetune.errors import UsageError
from routetune.install import pip_install
from routetune.options import option
from routetune.records.trial import Status
from routetune.routes.route import Route
from routetune.search.strategy import Result, Strategy

OFF = "off"
RESAMPLES = 50
"""Samples drawn for one new route before an untried route is taken at random (TPE
samples what it tried again and again once it has settled)."""


@dataclass(frozen=True)
class TpeOptions:
    """The TPE search's options."""

    n_trials: int = option(50, help="Routes asked at most (Olive's default search budget "
                           "is of this order).", minimum=1)
    seed: int = option(0, help="The sampler's seed: the same seed asks the same routes.")
    n_startup_trials: int = option(10, help="Random samples before TPE models the "
                                   "results (Optuna's default).", minimum=0)


class Tpe(Strategy):
    """Routes sampled by Optuna's TPE sampler, one at a time."""

    name = "tpe"
    Options = TpeOptions
    options: TpeOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            import optuna
        except ImportError as e:
            raise UsageError(f"--search tpe needs Optuna: {pip_install('optuna')}") from e
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        sampler = optuna.samplers.TPESampler(seed=self.options.seed,
                                             n_startup_trials=self.options.n_startup_trials)
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        self._steps = {name: {str(s): s for s in self.space.choices(name)}
                       for name in self.space.infos}
        self._distributions: dict[str, Any] = {
            name: optuna.distributions.CategoricalDistribution([OFF, *steps])
            for name, steps in self._steps.items()}
        self._told: dict[Route, Result] = {}
        self._pending: dict[Route, Any] = {}  # asked, not yet told: the Optuna trial
        self._asked = 0
        self._random = random.Random(self.options.seed)

    def ask(self) -> list[Route]:
        """One new route sampled by TPE; [] after `n_trials`, or when every route was asked."""
        if self._asked >= self.options.n_trials:
            return []
        for attempt in range(RESAMPLES + 1):
            if attempt == RESAMPLES:  # TPE keeps to what it tried: one untried at random
                untried = [r for r in self._first_orderings() if r not in self._told]
                if not untried:
                    return []
                pick = untried[self._random.randrange(len(untried))]
                params = dict.fromkeys(self._steps, OFF)
                params.update({s.name: str(s) for s in pick})
                self._study.enqueue_trial(params)
            trial = self._study.ask(self._distributions)
            chosen = [name for name in self._steps if trial.params[name] != OFF]
            if len(chosen) > self.space.max_depth or not self.space.consistent(chosen):
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            order = self.space.orderings(chosen)[0]
            route = Route(tuple(self._steps[n][trial.params[n]] for n in order))
            if route in self._told or route in self._pending or route.is_base:
                # told as failed: copies of one result would crowd TPE's good set
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            self._pending[route] = trial
            self._asked += 1
            return [route]
        return []

    def _first_orderings(self) -> list[Route]:
        """Every route of the space in the composer's first ordering of its set."""
        seen: set[frozenset[str]] = set()
        routes = []
        for route in self.space.routes():
            names = frozenset(route.names)
            if names not in seen and not route.is_base:
                seen.add(names)
                routes.append(route)
        return routes

    def tell(self, route: Route, result: Result) -> None:
        """Tell Optuna the route's log speed-up (or a failure)."""
        self._told[route] = result
        trial = self._pending.pop(route, None)
        if trial is not None:
            self._tell(trial, result)
        elif route.is_base:  # the base route: every seasoning off, no speed-up
            self._study.add_trial(self._optuna.trial.create_trial(
                params=dict.fromkeys(self._steps, OFF), distributions=self._distributions,
                value=0.0))

    def _tell(self, trial: Any, result: Result | None) -> None:
        rel = None if result is None else result.relative
        if result is None or result.status != Status.OK or rel is None or rel.p50 <= 0:
            self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self._study.tell(trial, -math.log(rel.p50))

    def planned(self) -> int | None:
        """`n_trials`, or the routes of the space besides the base route if fewer."""
        return min(self.options.n_trials, self.space.size() - 1)

    PLANNED_IS_BOUND = True
