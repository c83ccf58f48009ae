"""The verdict: which route wins, from paired speed-ups and independent confirmations.

`pick_winner` orders the routes worth confirming from the search's trials;
`confirm_winner` re-measures them against the base route (in a fresh process, through
the search loop) until one holds, or keeps the base route, and says why in one line.
The rules are the README's "What the speed-up means, and how a winner is decided".
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from routetune.errors import one_line
from routetune.judging.ranking import rank_key, shown_faster
from routetune.records.trial import Status, Trial
from routetune.timing.conditions import PAIRED_SLOWER
from routetune.timing.measure import across_repeats

if TYPE_CHECKING:
    from routetune.records.trial import Confirmation

DEFAULT_MIN_SPEEDUP = 1.03
"""``--min-speedup``: smaller effects are not worth a different engine, and sit within
what a busy or drifting machine fakes."""

FAILED = tuple(s for s in Status if s.failed)
"""Statuses of a trial that produced no engine."""


def _short(reason: str) -> str:
    return reason if len(reason) <= 200 else reason[:199] + "…"


CONFIRM_TRIES = 3
"""Routes re-measured at most after the search before the base route is kept."""

CONFIRM_REPEATS = 3
"""Fresh processes a route is confirmed in (``--confirm-repeats``): it holds only if it
clears in each (`routetune.timing.measure.across_repeats` says why one loop is not enough)."""


def _none_accurate(trials: Sequence[Trial], base: Trial) -> str:
    """Why no route but the base is a candidate: what became of the others, counted.

    ``no other route was tried``; ``no other route was built and measured (3 skipped:
    same engine as the base route)``; ``no other route built and ran (2 crashed, 1
    build-failed)``; or ``no other route met the accuracy constraint (3
    accuracy-failed, 1 crashed)``.
    """
    counts = Counter(t.status for t in trials if t is not base)
    if not counts:
        return "no other route was tried"
    if set(counts) == {Status.SKIPPED}:  # not applicable, the same engine, or no budget
        reasons = Counter(t.reason.split(":")[0] for t in trials
                          if t is not base and t.reason)
        common = f": {reasons.most_common(1)[0][0]}" if reasons else ""
        return (f"no other route was built and measured ({counts[Status.SKIPPED]} "
                f"skipped{common})")
    what = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    if counts.keys() <= set(FAILED):
        return f"no other route built and ran ({what})"
    return f"no other route met the accuracy constraint ({what})"


def pick_winner(trials: Sequence[Trial], min_speedup: float = DEFAULT_MIN_SPEEDUP,
                busy_machine: str = "wait") -> tuple[list[Trial], str]:
    """The routes worth confirming, best first, or why the base route stands.

    A route is worth confirming when it is ``ok``, its paired speed-up estimate is above
    `min_speedup`, the search showed it faster than the base route beyond its 95%
    interval (`routetune.judging.ranking.shown_faster`), and it was not measured on a
    busy machine (``noisy``), unless `busy_machine` is ``ignore``. They are ranked by
    speed-up; among the routes whose speed-up intervals overlap the fastest's (a tie),
    the one with the fewest steps goes first (then the faster).

    Returns:
        The routes in the order to confirm them (empty when none), and a one-line
        reason for the base route when there are none.
    """
    base = next(t for t in trials if t.route == "base")
    accurate = [t for t in trials if t.status == Status.OK and t.latency and t is not base]
    if not accurate and base.status == Status.BUILD_ONLY:
        return [], ("engines were built but this device cannot run them (build-only), so "
                    "nothing was checked or timed and a beam search stops after one step "
                    "(--search exhaustive builds every route); the base route is the "
                    "fallback")
    if not accurate and base.status in FAILED:
        return [], (f"the base route itself is {base.status} ({base.reason[:300]}), and "
                    "no route built, ran and met the accuracy constraint: there is no "
                    "engine to deploy")
    if not accurate:
        return [], _none_accurate(trials, base) + "; the base route is the fallback"
    trusted = [t for t in accurate if not t.noisy or busy_machine == "ignore"]
    above = [t for t in trusted if (t.speedup or 0) > min_speedup]
    faster = sorted((t for t in above if shown_faster(t)), key=rank_key)
    busy = sorted((t for t in accurate if t not in trusted and t.paired is not None
                   and t.paired.ci_low > min_speedup), key=rank_key)  # clearly, if busy
    if not faster:
        # what it rests on: the trusted figures alone, where some were timed while busy
        quiet = "" if len(trusted) == len(accurate) else " timed on a quiet machine"
        if not trusted:
            why = (f"every accurate route was timed while the machine was busy, and a noisy "
                   f"figure cannot win (--busy-machine {busy_machine}), so none was confirmed")
        else:  # the search's figure of the fastest
            best = min(trusted, key=rank_key)
            why = (f"no accurate route{quiet} was more than {min_speedup:g}x faster than the "
                   f"base route (--min-speedup) in the search (the fastest, '{best.route}', "
                   f"at {best.figure})")
        if above:
            best = min(above, key=rank_key)
            why = (f"no accurate route{quiet} was shown faster than the base route in the "
                   f"search (the fastest, '{best.route}' at {best.figure}, has a 95% "
                   f"interval reaching 1), so none was confirmed; {len(above)} had an "
                   f"estimate above --min-speedup {min_speedup:g}")
        if busy:
            why += ("; faster beyond the 95% interval, but only while the machine was "
                    "busy, so not confirmed: " + ", ".join(
                        f"'{t.route}' ({t.figure})" for t in busy[:3]))
        return [], why + "; the base route stands"
    fastest = faster[0]
    tied = [t for t in faster if t.paired is None or fastest.paired is None
            or t.paired.ties(fastest.paired)]
    first = min(tied, key=lambda t: (rank_key(t).steps, rank_key(t)))
    return [first] + [t for t in faster if t is not first], ""


def confirm_winner(trials: Sequence[Trial], confirm: Callable[[Trial], Confirmation],
                   min_speedup: float = DEFAULT_MIN_SPEEDUP, busy_machine: str = "wait",
                   repeats: int = CONFIRM_REPEATS) -> tuple[Trial, str, list[Confirmation]]:
    """Pick the winner: the best route (`pick_winner`) that holds when measured again.

    Each route worth confirming, best first and `CONFIRM_TRIES` at most, is re-measured
    against the base route `repeats` times (`confirm`: each a fresh process, engines
    built anew, paired blocks), stopping at the first repeat that does not clear. It
    holds when the repeats' combined speed-up (`routetune.timing.measure.across_repeats`: every
    repeat's interval above) and each repeat's own clear `min_speedup`
    (`routetune.timing.measure.Speedup.clears`) and the confirmation was not noisy (under
    ``ignore``: its base route stayed within `PAIRED_SLOWER` times its pace, `_refused`);
    otherwise the next one is tried, and after the last
    the base route stands. Once one holds, a later route is confirmed only if its
    search-time interval lies above the held confirmation's (`_challenges`); it wins if
    its own confirmation lies above too.

    A base route that failed or missed the accuracy constraint is no fallback while an
    accurate route exists: then the accurate route fastest in the search wins, unconfirmed
    (OpenVINO's default bf16 on an AVX-512 BF16 CPU fails an FP32 constraint; its f32
    route is slower, and must still win).

    Returns:
        The winner, a one-line reason, and every confirmation made.
    """
    base = next(t for t in trials if t.route == "base")
    accurate = [t for t in trials if t.status == Status.OK and t.latency and t is not base]
    if base.status in FAILED and accurate:  # never rebuilt or re-timed
        best = min(accurate, key=lambda t: rank_key(t).ms)
        return best, (f"the base route is {base.status} ({_short(base.reason)}), so there "
                      f"is no base to compare against: fastest accurate route by absolute "
                      f"latency (p50 {rank_key(best).ms:.3f} ms)"), []
    if base.status == Status.ACCURACY_FAILED and accurate:  # no fallback: the accurate
        best = min(accurate, key=rank_key)  # route fastest against it in the search
        return best, (f"the base route is accuracy-failed ({_short(base.reason)}), so it "
                      f"cannot stand: fastest accurate route, {best.figure} against it in the "
                      "search; not confirmed, since the base route is no alternative"), []
    built = [t for t in trials if t.status == Status.BUILD_ONLY]
    if base.status in FAILED and built:
        best = min(built, key=lambda t: (rank_key(t).steps, t.route))
        return best, (f"the base route is {base.status} ({_short(base.reason)}); "
                      f"'{best.route}' builds, and this device cannot run its engine, so it "
                      "is handed back as built, not measured or checked for accuracy"), []
    order, why = pick_winner(trials, min_speedup, busy_machine)
    if not order:
        return base, why, []
    done: list[Confirmation] = []
    failed: list[str] = []
    held: tuple[Trial, Confirmation, str] | None = None
    beaten: list[str] = []
    tried = 0
    for trial in order:
        if tried == CONFIRM_TRIES:
            break
        if held is not None and not _challenges(trial, held[1]):
            continue
        tried += 1
        try:
            c = _repeated(confirm, trial, repeats, min_speedup, busy_machine)
        except Exception as e:  # an engine that cannot be rebuilt: the next one
            failed.append(f"'{trial.route}' could not be rebuilt ({one_line(e, 200)})")
            continue
        done.append(c)
        p = c.paired
        n = len(c.repeats) or 1
        where = "a fresh process" if n == 1 else f"{n} fresh processes"
        figure = (f"{p.figure} confirmed in {where} "
                  f"(search: {trial.speedup:.2f}x)")
        busy = c.conditions.get("busy", "")
        missed = [f"repeat {i} of {n}: {r.clears(min_speedup)}"
                  for i, r in enumerate(c.repeats, 1) if r.clears(min_speedup) is not None]
        why_not = p.clears(min_speedup) or _refused(c, busy_machine) or (
            missed[0] if missed else None)
        if why_not is not None:
            failed.append(f"'{trial.route}' did not hold: {figure}: {why_not}")
            continue
        note = f"; measured while the machine was busy ({busy})" if busy else ""
        if held is None:
            held = (trial, c, figure + note)
        elif p.ci_low > held[1].paired.ci_high:  # faster beyond the held one's interval
            beaten.append(f"'{held[0].route}' held at {held[1].paired.value:.2f}x but is "
                          "slower")
            held = (trial, c, figure + note)
        else:
            beaten.append(f"'{trial.route}' held at {p.value:.2f}x, not faster than that")
    if held is None:
        return base, "; ".join(failed) + "; the base route stands", done
    trial, _, figure = held
    first = "fastest accurate route" if trial is order[0] else "fastest accurate route that held"
    return trial, "; ".join([f"{first}: {figure}", *failed, *beaten]), done


def _repeated(confirm: Callable[[Trial], Confirmation], trial: Trial, repeats: int,
              min_speedup: float, busy_machine: str) -> Confirmation:
    """`confirm` `trial` up to `repeats` times, until a repeat does not hold.

    Returns:
        The median repeat's confirmation, with the repeats' combined speed-up, each
        repeat's in ``repeats``, the first busy condition seen and the waits summed.
    """
    done: list[Confirmation] = []
    for _ in range(repeats):
        c = confirm(trial)
        done.append(c)
        if c.paired.clears(min_speedup) is not None or _refused(c, busy_machine):
            break
    middle = sorted(done, key=lambda c: c.paired.value)[(len(done) - 1) // 2]
    conditions = {**middle.conditions,
                  "busy": next((c.conditions["busy"] for c in done
                                if c.conditions.get("busy")), ""),
                  "waited_s": sum(float(c.conditions.get("waited_s", 0.0)) for c in done)}
    paces = [float(c.conditions["pace_x"]) for c in done if c.conditions.get("pace_x")]
    if paces:  # the farthest from its pace
        conditions["pace_x"] = max(paces)
    return dataclasses.replace(middle, paired=across_repeats([c.paired for c in done]),
                               conditions=conditions, repeats=tuple(c.paired for c in done))


def _refused(c: Confirmation, busy_machine: str) -> str:
    """Why `c`'s conditions keep it from holding under `busy_machine`, or "".

    Under ``wait`` and ``warn``: a busy machine. Under ``ignore``, which takes a verdict
    for the machine as it is, load alone does not; a base route that ran at over
    `PAIRED_SLOWER` times its pace in this run (``pace_x``) does: the machine changed
    beyond what paired blocks cancel within the run, and such load can favour one
    engine (under the fidelity benchmark's bursty load, ``ort-no-spinning`` held at
    1.44x [1.16, 1.72] in 3 fresh processes with the base route at 3.30x its pace, and
    measured 0.82x on the quiet machine; docs/benchmarks.md).
    """
    busy = c.conditions.get("busy", "")
    if busy_machine != "ignore":
        return f"the machine was busy ({busy})" if busy else ""
    pace_x = float(c.conditions.get("pace_x") or 0.0)
    if pace_x <= PAIRED_SLOWER:
        return ""
    return (f"the base route ran at {pace_x:.2f}x its pace (--busy-machine "
            f"ignore takes a confirmation under load while the base route stays within "
            f"{PAIRED_SLOWER:g}x its pace: beyond, the load can favour one engine)")


def _challenges(trial: Trial, held: Confirmation) -> bool:
    """Whether `trial`'s search-time interval lies above the held route's confirmed one.

    A route ranked first for having fewer steps, or for a wide interval, can hold at a
    speed-up well below what the search measured for another route (Hugging Face
    ``BertModel`` on an H200: ``fp16,ort-cuda-graph`` 2.10x [1.57, 4.06] in the search
    held at 1.59x, while a four-step route measured 2.15x [2.10, 2.17]). Such a route is
    confirmed too, and the faster of the two confirmations wins.
    """
    return trial.paired is not None and trial.paired.ci_low > held.paired.ci_high
