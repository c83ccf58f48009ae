"""The search strategy interface: ask for routes, tell what they scored.

Strategies do no I/O, no timing and no building: `routetune.search.loop` owns those
(Optuna's ask/tell split). A strategy sees only the route space and stored trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from routetune.composer import RouteSpace
from routetune.errors import UsageError
from routetune.route import Route
from routetune.run.option_schema import OptionError, build, check_keyword, options_of, problem
from routetune.trial import Status, Trial

if TYPE_CHECKING:
    from routetune.run.run_spec import RunSpec


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

    def tell(self, route: Route, trial: Trial) -> None:
        """Report the trial of a route that `ask` returned (or of the base route)."""

    PLANNED_IS_BOUND: ClassVar[bool] = False
    """Whether `planned` is an upper bound (the search may stop sooner), not a count."""

    def planned(self) -> int | None:
        """How many routes besides the base route this strategy will ask for, if known."""
        return None


class Rank(NamedTuple):
    """How good an accurate trial is; smaller sorts first (`rank_key`).

    Args:
        relative: p50 over the base route's measured alongside (a ratio; inf without
            a base measurement).
        ms: p50 in ms, which decides only when no trial has a base measurement (the
            base route could not be built); inf when unmeasured.
        steps: The route's seasonings, parameters not counted
            (``fp16{op_types_to_exclude=[Softmax,Pow]}`` is one step).
        text: The route's text, so that the order is total.
    """

    relative: float
    ms: float
    steps: int
    text: str


def rank_key(trial: Trial) -> Rank:
    """Sort key of accurate trials: faster first, then fewer steps, then by text.

    Speed is the p50 relative to the base route measured alongside (`Trial.relative`:
    the inverse of the paired speed-up), never milliseconds of different moments.
    """
    relative = trial.relative
    return Rank(relative.p50 if relative else float("inf"),
                trial.latency.p50 if trial.latency else float("inf"),
                len(trial.steps), trial.route)


def ranked(trials: Sequence[Trial], winner: Trial | None = None) -> list[Trial]:
    """The trials as a reader wants them: the winner, the accurate by `rank_key`, the rest.

    The rest (failed, skipped) keep `rank_key`'s order too (measured ones by speed).
    """
    rest = sorted((t for t in trials if t is not winner),
                  key=lambda t: ((0 if t.status == Status.OK else 1), *rank_key(t)))
    return ([winner] if winner is not None else []) + rest


def configure(cls: type[Strategy], spec: RunSpec) -> Any:
    """The strategy's `Strategy.Options` from the run's ``search_options``.

    ``beam_width`` is the shorthand of the beam strategy's option of that name.

    Raises:
        OptionError: An option the strategy does not declare, a value of the wrong
            type or out of its bounds, or ``beam_width`` given twice with two values;
            it names the option as the user wrote it.
    """
    declared = {o.name: o for o in options_of(cls.Options)}
    given = dict(spec.search_options)
    if spec.beam_width is not None:
        other = given.get("beam_width", spec.beam_width)
        if other != spec.beam_width:  # two values for one option: neither wins silently
            raise OptionError("beam_width", f" {spec.beam_width}: {spec.spelled('search_options')}"
                              f" also sets beam_width={other!r}; give one of them")
        given["beam_width"] = spec.beam_width
    for key, value in given.items():
        where = "beam_width" if key == "beam_width" and spec.beam_width is not None else (
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
