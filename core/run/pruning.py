"""``--keep``: which candidate models stay in ``OUTDIR/artifacts/models`` after a run.

Every trial's candidate model is kept while the search runs (workers share route
prefixes through them). At the end, `prune` removes those of the routes nobody will
look at again. A removed model costs nothing but time: a later run that needs it
(a resumed confirmation, `routetune build`) applies the route again
(`routetune.candidate.candidate.Candidate.checked_model`), since routes are reproducible.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from routetune.candidate.artifacts import MODELS
from routetune.records.trial import Status, Trial
from routetune.reporting.report import worst_error

PREFIXES = "artifacts/prefixes"
"""The index of shared route prefixes (`routetune.candidate.artifacts.PrefixStore`)."""


@dataclass(frozen=True)
class Pruned:
    """What `prune` did.

    Args:
        kept: Routes whose candidate model was kept.
        files: Files removed.
        bytes: Their size in bytes.
    """

    kept: tuple[str, ...]
    files: int
    bytes: int


def kept_trials(trials: Sequence[Trial], winner: Trial, keep: str) -> list[Trial]:
    """The trials whose models ``--keep`` keeps: every one, the front, or the winner.

    ``front``: the winner, the base route, and the accurate trials that no other
    accurate trial beats on both latency (p50 relative to the base route timed
    alongside) and `ERROR_METRIC` (the worst output's).
    """
    if keep == "all":
        return list(trials)
    chosen = [winner]
    if keep == "front":
        chosen += [t for t in trials if t.route == "base"]
        chosen += accurate_front(trials)
    return list({id(t): t for t in chosen}.values())


def accurate_front(trials: Sequence[Trial]) -> list[Trial]:
    """The accurate trials on the Pareto front of relative p50 against error."""
    points = [(worst_error(t) or 0.0, relative.p50, t) for t in trials
              if t.status == Status.OK and (relative := t.relative)]
    front: list[Trial] = []
    best = float("inf")
    for _, latency, trial in sorted(points, key=lambda p: (p[0], p[1])):
        if latency < best:
            front.append(trial)
            best = latency
    return front


def prune(outdir: Path, trials: Sequence[Trial], winner: Trial, keep: str,
          others: frozenset[str] = frozenset()) -> Pruned:
    """Remove the candidate models ``--keep`` does not keep, and the prefix index.

    A model file several trials share (the same graph under other build options) stays
    if any kept trial names it. External weights (``artifacts/models/weights``) stay:
    they are shared by content. Files that vanish meanwhile are skipped.

    Args:
        outdir: The run's output folder.
        trials: This run's trials.
        winner: This run's winner.
        keep: ``all``, ``front`` or ``winner`` (`kept_trials`).
        others: The artifacts (paths relative to `outdir`) of stored trials that are
            not this run's: another model or other settings tuned into the same
            folder. They stay; that run's own ``--keep`` chose them.
    """
    kept = kept_trials(trials, winner, keep)
    if keep == "all":
        return Pruned(tuple(t.route for t in kept), 0, 0)
    wanted = {(outdir / a).resolve() for a in (*(t.artifact for t in kept if t.artifact),
                                               *others)}
    files = size = 0
    for path in sorted((outdir / MODELS).glob("*.onnx")):
        if path.resolve() not in wanted and path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                size += path.stat().st_size
                path.unlink()
                files += 1
    prefixes = outdir / PREFIXES
    if prefixes.is_dir() and not prefixes.is_symlink():
        for entry in prefixes.iterdir():
            with contextlib.suppress(OSError):
                size += entry.stat().st_size
                files += 1
        shutil.rmtree(prefixes, ignore_errors=True)
    return Pruned(tuple(t.route for t in kept), files, size)
