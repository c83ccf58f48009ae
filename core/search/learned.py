"""Learned search: routes in the order the route memory expects them to pay.

The model: a route's log speed-up over the base route is the sum of its steps' effects
and of each pair of steps' effect together, each normal. A step's effect starts from the
route memory's prior for models like this one (`routetune.records.prior`), a pair's from
no effect (sd `INTERACTION_SD`); all are revised by every measurement of this run:
Bayesian linear regression with a normal prior and known noise (Bishop, *Pattern
Recognition and Machine Learning*, 2006, §3.3), each measurement's noise taken from its
paired 95% interval.

Each `ask` takes the untried routes of the highest expected improvement over the
fastest accurate route so far (Jones, Schonlau and Welch, "Efficient global
optimization of expensive black-box functions", J. Global Optimization 13, 1998),
times the chance that each of their steps builds and meets the accuracy constraint
(a beta-binomial estimate per step, from the memory and from this run's failures). A
step the memory knows little of has a wide prior, and so a large expected improvement:
the search explores where the memory is uncertain. The incumbent, the route to improve
on, is the best route so far, or an engine outside this search where that is faster
(`aim`: in a search over several backends, the faster backend's base route, which no
route of this one can win without beating). It ends when no untried route is expected
to improve on the incumbent by `LearnedOptions.stop_gain`.

One ordering of each set of steps is tried (the composer's first). With a memory that
knows no step of the space (an empty one, or ``--memory off``) it is `mixed`, exactly.
The loop measures the base route first and confirms the winner as for every strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from routetune.options import option
from routetune.records.prior import Prior
from routetune.records.trial import Status
from routetune.routes.route import Route
from routetune.search.mixed import Mixed
from routetune.search.strategy import Result, Strategy

NOISE_FLOOR = 0.01
"""Standard deviation (log) added to every measurement's own: run-to-run drift that one
paired interval does not see (about 1%, docs/benchmarks.md's repeated runs)."""
INTERACTION_SD = 0.15
"""Prior standard deviation (log) of the effect of two steps together beyond the sum of
their own: about 0.86x to 1.16x. Such effects are real (a convolution's bias fusion
helps ResNet-50 on the H200 only with FP16 and NHWC, docs/benchmarks.md), so a route
of steps never tried together keeps some uncertainty, and so some expected improvement."""
RESCUED = 0.2
"""Chance that a route holds although one of its steps breaks this model: another step
undoes it (on the H200, ResNet-50's convolution bias fusion fails accuracy in NCHW and
holds in NHWC, docs/benchmarks.md)."""
BROKEN_TOGETHER = 0.1
"""Chance that a route fails although none of its steps breaks this model alone: two
steps that fail together (FP16 with EfficientNet's fused convolution bias crashed)."""
MAX_SUSPECTS = 14
"""Steps whose breaking is modelled jointly (2**14 states); beyond them, the steps the
memory expects to fail least are taken to hold."""


@dataclass(frozen=True)
class LearnedOptions:
    """The learned search's options."""

    batch: int = option(2, help="Routes asked at once (built in parallel where "
                        "--build-workers allows).", minimum=1)
    stop_gain: float = option(0.005, help="Stop once no untried route's expected "
                              "improvement over the best so far reaches this share "
                              "(0.005: 0.5%).", above=0)


class Learned(Strategy):
    """The routes the memory expects to be fastest first; `mixed` when it knows nothing here."""

    name = "learned"
    Options = LearnedOptions
    options: LearnedOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prior = Prior()
        self._mixed = Mixed(self.space)
        self._learned: bool | None = None  # decided at the first ask
        self._told: dict[Route, Result] = {}
        self._routes: list[Route] = []
        self._features: list[str] = []
        self._pairs: list[str] = []
        self._x = np.zeros((0, 0))
        self._incumbent = 1.0

    def aim(self, incumbent: float) -> None:
        """Take an engine faster than the base route from outside: improvement is over it."""
        self._incumbent = incumbent

    def learn(self, prior: Prior) -> None:
        """Take the memory's prior (`routetune.records.prior.prior_of`)."""
        self._prior = prior

    def tell(self, route: Route, result: Result) -> None:
        """Record a result (and tell `mixed`, which runs when the memory knows nothing)."""
        self._told[route] = result
        self._mixed.tell(route, result)

    @property
    def uses_memory(self) -> bool:
        """Whether the memory knows a step of this space (else the search is `mixed`)."""
        if self._learned is None:
            self._learned = any(self._prior.step(s)[3] for r in self._candidates() for s in r)
        return self._learned

    def ask(self) -> list[Route]:
        """The untried routes of the highest expected improvement; [] when none pays."""
        if not self.uses_memory:
            return self._mixed.ask()
        gain = self._acquisition()
        tried = {frozenset(map(str, r)) for r in self._told}
        picked: list[Route] = []
        for i in np.argsort(-gain, kind="stable"):
            if gain[i] < math.log1p(self.options.stop_gain) or len(picked) >= self.options.batch:
                break
            steps = frozenset(map(str, self._routes[i]))
            if steps not in tried:
                tried.add(steps)
                picked.append(self._routes[i])
        return picked

    def _candidates(self) -> list[Route]:
        """The space's routes; `_x` their features: each step, then each pair of steps."""
        if not self._routes:
            self._routes = [r for r in self.space.routes() if not r.is_base]
            self._features = sorted({str(s) for r in self._routes for s in r})
            self._pairs = sorted({pair for r in self._routes for pair in _pairs(r)})
            index = {f: i for i, f in enumerate([*self._features, *self._pairs])}
            self._x = np.zeros((len(self._routes), len(index)))
            for row, route in enumerate(self._routes):
                for feature in [*(str(s) for s in route), *_pairs(route)]:
                    self._x[row, index[feature]] = 1.0
        return self._routes

    def _acquisition(self) -> np.ndarray:
        """Per candidate route: its chance to succeed times its expected improvement (log).

        The improvement is over the incumbent: the best route so far, or the engine
        outside this search where that is faster (`aim`). Tried routes get -1.
        """
        routes = self._candidates()
        steps = {str(s): s for r in routes for s in r}
        priors = [self._prior.step(steps[f]) for f in self._features]
        pairs = len(self._pairs)
        mean0 = np.array([p[0] for p in priors] + [0.0] * pairs)
        precision0 = np.array([1.0 / p[1] ** 2 for p in priors]
                              + [1.0 / INTERACTION_SD ** 2] * pairs)
        fail0 = np.clip([p[2] for p in priors] + [0.0] * pairs, 0.0, 0.99)
        index = {route: i for i, route in enumerate(routes)}
        rows, ys, weights = [], [], []
        held: list[tuple[int, bool]] = []  # (route row, met the constraint)
        best = 0.0  # the base route
        for route, result in self._told.items():
            i = index.get(route)
            if i is None:
                continue
            rel = result.relative
            if result.status.measured and rel is not None and rel.p50 > 0:
                y = -math.log(rel.p50)
                sd = math.log(max(rel.ci_high, rel.p50) / min(rel.ci_low, rel.p50)) / 3.92
                rows.append(self._x[i])
                ys.append(y)
                weights.append(1.0 / (sd ** 2 + NOISE_FLOOR ** 2))
                if result.status == Status.OK and result.trusted:
                    best = max(best, y)
            if result.status == Status.OK:
                held.append((i, True))
            elif result.status.failed or result.status == Status.ACCURACY_FAILED:
                held.append((i, False))
        a = np.diag(precision0)
        b = precision0 * mean0
        if rows:
            x, w = np.array(rows), np.array(weights)
            a = a + x.T @ (w[:, None] * x)
            b = b + x.T @ (w * np.array(ys))
        cov = np.linalg.inv(a)
        mean = cov @ b
        m = self._x @ mean
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", self._x, cov, self._x), 1e-12))
        chance = _chance_to_hold(self._x[:, :len(self._features)], fail0[:len(self._features)],
                                 held)
        gain = chance * _improvement(m, sd, max(best, math.log(self._incumbent)))
        for route in self._told:
            if route in index:
                gain[index[route]] = -1.0
        return gain


def _chance_to_hold(x: np.ndarray, fail: np.ndarray,
                    held: list[tuple[int, bool]]) -> np.ndarray:
    """Per route (row of `x`, one column per step): the chance it builds and holds.

    Each step either breaks this model or not, a property of the model (FP16 that fails
    accuracy on one route fails it on the next): the prior chance that it does is its
    `fail` (the memory's share of failures, per step). A route fails when one of its
    steps breaks the model, but for `RESCUED` and `BROKEN_TOGETHER`. `held` lists this
    run's routes that met the constraint (True) or failed (False), by row; the posterior
    over which steps break the model is exact, by enumerating each set of suspects.
    """
    suspects = [int(j) for j in np.argsort(-fail, kind="stable")[:MAX_SUSPECTS] if fail[j] > 0]
    if not suspects:
        return np.ones(len(x))
    bits = 1 << np.arange(len(suspects))
    masks = (x[:, suspects] > 0).astype(np.int64) @ bits  # each route's suspects, as bits
    states = np.arange(1 << len(suspects))
    in_state = (states[:, None] & bits[None, :]) > 0  # states x suspects: which break
    p = np.clip(fail[suspects], 1e-6, 1 - 1e-6)
    log_post = in_state @ np.log(p) + (~in_state) @ np.log(1 - p)
    broken = (masks[:, None] & states[None, :]) > 0  # routes x states
    hold = np.where(broken, RESCUED, 1 - BROKEN_TOGETHER)
    for row, ok in held:
        log_post = log_post + np.log(hold[row] if ok else 1 - hold[row])
    post = np.exp(log_post - log_post.max())
    chance: np.ndarray = hold @ (post / post.sum())
    return chance


def _improvement(mean: np.ndarray, sd: np.ndarray, target: float) -> np.ndarray:
    """Expected improvement over `target` of normal beliefs (Jones et al. 1998, eq. 15)."""
    z = (mean - target) / sd
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    improvement: np.ndarray = (sd * np.exp(-0.5 * z ** 2) / math.sqrt(2 * math.pi)
                               + (mean - target) * cdf)
    return improvement


def _pairs(route: Route) -> list[str]:
    """Each pair of the route's steps, as one feature name (``a & b``, sorted)."""
    names = sorted(str(s) for s in route)
    return [f"{a} & {b}" for i, a in enumerate(names) for b in names[i + 1:]]
