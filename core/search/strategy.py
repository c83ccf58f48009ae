"""The search strategy interface: ask for routes, tell what they scored.

Strategies do no I/O, no timing and no building: `routetune.search.loop` owns those
(Optuna's ask/tell split). A strategy sees only the route space and stored trials.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from routetune.errors import UsageError
from routetune.options import OptionError, build, check_keyword, options_of, problem
from routetune.records.prior import Prior
from routetune.records.trial import Status, Trial
from routetune.routes.composer import RouteSpace
from routetune.routes.route import Route
from routetune.timing.measure import Latency


@dataclass(frozen=True)
class Result:
    """What a strategy is told of one route's trial: how it ended, and how fast it ran.

    Args:
        route: The route.
        status: How its trial ended (`Status.OK`: built, ran and met the accuracy
            constraint; only such a route may win).
        latency: Its latency (ms); None when it was not measured.
        relative: Its latency relative to the base route's measured alongside (a ratio
            with its 95% interval: the inverse of the paired speed-up); None without a
            base measurement.
        out_of_race: Whether its timing stopped because it cannot reach the speed-up it
            raced against (`routetune.timing.race`): a route not worth building on.
        trusted: Whether its measurement may decide a winner: False for one timed on a
            busy machine (``noisy``) under ``--busy-machine wait`` or ``warn``, where no
            noisy trial wins. A strategy builds on trusted results only: a route faster
            only while the machine was busy leads nowhere that could win.
    """

    route: Route
    status: Status
    latency: Latency | None = None
    relative: Latency | None = None
    out_of_race: bool = False
    trusted: bool = True

    @property
    def steps(self) -> Route:
        """The route (`routetune.judging.ranking.Ranked`)."""
        return self.route

    @classmethod
    def of(cls, trial: Trial, busy_machine: str = "wait") -> Result:
        """The result of a stored trial, under the ``--busy-machine`` mode it ran with."""
        return cls(trial.steps, Status(trial.status), trial.latency, trial.relative,
                   trial.raced is not None, not trial.noisy or busy_machine == "ignore")


@dataclass(frozen=True)
class NoOptions:
    """The options of a strategy that takes none."""


class Strategy:
    """Base class of search strategies.

    The loop measures the base route first and tells it to the strategy, then calls
    `ask` until it returns an empty list, telling every route it asked for.

    A strategy declares its own options as a frozen dataclass of `option` fields
    (`Options`); users set them with ``--search-option KEY=VALUE``, a recipe's
    ``[search] options`` table or ``routetune.tune(search_options={...})``, checked
    against the declaration before any trial runs (`configure`).

    Args:
        space: The routes that may be tried.
        options: An instance of `Options`; its defaults when None.
    """

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions

    def __init__(self, space: RouteSpace, options: Any = None) -> None:
        self.space = space
        self.options = options if options is not None else self.Options()

    def ask(self) -> list[Route]:
        """The next routes to try; an empty list when the search is done."""
        raise NotImplementedError

    def tell(self, route: Route, result: Result) -> None:
        """Report how the trial of a route that `ask` returned (or the base route) went."""

    def aim(self, incumbent: float) -> None:
        """Take the speed-up over the base route of an engine outside this search.

        In a search over several backends (`routetune.run.backends`), another backend's
        base route may be faster than this one's (the lower end of its side-by-side
        speed-up, the race's floor): no route of this search wins without beating it.
        The loop calls it once, before the first `ask`, where there is such a floor. The
        default ignores it.
        """

    def learn(self, prior: Prior) -> None:
        """Take what the route memory expects of each step, before the first `ask`.

        The run calls it when a memory is on (`routetune.records.memory`); the default
        ignores it. A prior may order and prune what a strategy asks; it is no result,
        and no route wins without being measured in this run.
        """

    PLANNED_IS_BOUND: ClassVar[bool] = False
    """Whether `planned` is an upper bound (the search may stop sooner), not a count."""

    def planned(self) -> int | None:
        """How many routes besides the base route this strategy will ask for, if known."""
        return None


def configure(cls: type[Strategy], search_options: Mapping[str, Any],
              beam_width: int | None = None,
              spelled: Callable[[str], str] = lambda name: name) -> Any:
    """The strategy's `Strategy.Options` from the run's ``search_options``.

    Args:
        cls: The strategy.
        search_options: Its options, by name, as given.
        beam_width: ``--beam-width``, the shorthand of the beam strategy's option of
            that name; None when not given.
        spelled: An option's name as the user wrote it (``--search-option``, a recipe
            field, a keyword), for the message that names two of them.

    Raises:
        OptionError: An option the strategy does not declare, a value of the wrong
            type or out of its bounds, or ``beam_width`` given twice with two values;
            the run rewords it after where the option was written.
    """
    declared = {o.name: o for o in options_of(cls.Options)}
    given = dict(search_options)
    if beam_width is not None:
        other = given.get("beam_width", beam_width)
        if other != beam_width:  # two values for one option: neither wins silently
            raise OptionError("beam_width", f" {beam_width}: {spelled('search_options')}"
                              f" also sets beam_width={other!r}; give one of them")
        given["beam_width"] = beam_width
    for key, value in given.items():
        where = "beam_width" if key == "beam_width" and beam_width is not None else (
            "search_options")
        shown = f" {value}" if where == "beam_width" else f" {key}={value!r}"
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise OptionError(where, f"{shown}: the {cls.name} search takes no option "
                              f"'{key}' (its options: {known})")
        try:
            check_keyword(declared[key], value)
        except UsageError as e:
            raise OptionError(where, f"{shown}: {str(e).partition(': ')[2]}") from e
        why = problem(declared[key], value)
        if why:
            raise OptionError(where, f"{shown}: {why}")
    return build(cls.Options, given)
