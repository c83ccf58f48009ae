"""The race's leader: the accurate route ahead so far, and the bar a new candidate races.

Each candidate of a search races against a bar (`routetune.timing.race`): ``--min-speedup``,
or the lower end of the leading route's paired interval where that is higher. The
leader is the accurate route of this search with the highest lower end, not measured on
a busy machine (unless ``--busy-machine ignore``): a candidate that cannot reach it
cannot be the fastest route, and a candidate that cannot reach ``--min-speedup`` cannot
win at all. In a search over several backends (`routetune.run.backends`), a floor may
raise that bar: the lower end of another backend's base route's speed-up over this
one's, timed side by side before the searches; a route slower than that engine cannot
win the run.
"""

from __future__ import annotations

from routetune.records.trial import Status, Trial
from routetune.timing.race import Bar


class Leader:
    """The leading route of one search, from the trials it is shown.

    Args:
        min_speedup: ``--min-speedup``, the lowest bar.
        busy_machine: The ``--busy-machine`` mode: under ``ignore`` a noisy trial may lead.
        floor: A bar from outside this search (another backend's engine), or None.
    """

    def __init__(self, min_speedup: float, busy_machine: str, floor: Bar | None = None
                 ) -> None:
        self.min_speedup = min_speedup
        self.busy_machine = busy_machine
        self.floor = floor
        self.trial: Trial | None = None

    def consider(self, trial: Trial) -> Trial:
        """Take `trial` as the leader if it is accurate, trusted and ahead; `trial`."""
        paired = trial.paired
        trusted = not trial.noisy or self.busy_machine == "ignore"
        leader = self.trial.paired if self.trial is not None else None
        if (trial.status == Status.OK and paired is not None and trusted
                and not trial.steps.is_base and (leader is None or paired.ci_low > leader.ci_low)):
            self.trial = trial
        return trial

    def bar(self) -> Bar:
        """What a new candidate races against.

        The highest of the leader's lower end, the floor and ``--min-speedup``.
        """
        bars = [Bar.min_speedup(self.min_speedup)]
        if self.floor is not None:
            bars.append(self.floor)
        leader = self.trial
        if leader is not None and leader.paired is not None:
            p = leader.paired
            bars.append(Bar(p.ci_low, f"the lower end of the leading route '{leader.route}' "
                            f"{p.value:.3f}x [{p.ci_low:.3f}, {p.ci_high:.3f}]"))
        return max(bars, key=lambda b: b.speedup)
