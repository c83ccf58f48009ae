"""Start-up time: ``import routetune`` and ``routetune --help``, against a bare interpreter.

Usage:

    python benchmarks/startup.py [--runs 20] [--vs OTHER_PYTHON]

Each round runs, one after the other in a fresh process, a bare interpreter
(``python -c pass``), ``python -c "import routetune"`` and ``routetune --help`` (as
``python -m routetune --help``), so that all three see the same machine state; the
order rotates each round. Wall time per process (``time.perf_counter`` around
``subprocess.run``), median over the rounds, and the load average before and after.

With ``--vs``, the same two routetune commands run in the same rounds with another
interpreter (a venv with another routetune checkout: the "before"), and the ratios are
taken round by round.

Targets (core issue): ``import routetune`` adds at most 0.25 s to the bare
interpreter, and ``routetune --help`` finishes in at most 0.6 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def commands(python: str, tag: str = "") -> dict[str, list[str]]:
    """The timed commands for one interpreter, named with `tag`."""
    return {f"import{tag}": [python, "-c", "import routetune"],
            f"help{tag}": [python, "-m", "routetune", "--help"]}


def wall_s(command: list[str]) -> float:
    """Seconds from start to exit of `command`, its output thrown away."""
    t0 = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    """Time the commands in rotating order and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("--vs", help="another interpreter, timed in the same rounds")
    args = parser.parse_args()
    load_before = os.getloadavg()
    table = {"bare": [sys.executable, "-c", "pass"], **commands(sys.executable)}
    if args.vs:
        table.update(commands(args.vs, " (vs)"))
    names = list(table)
    for name in names:  # warm the file cache
        wall_s(table[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(wall_s(table[name]))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} CPUs; {args.runs} rounds")
    for name in names:
        print(f"{name:12s} median {median[name]:.3f} s  (min {min(times[name]):.3f}, "
              f"max {max(times[name]):.3f})")
    added = median["import"] - median["bare"]
    print(f"import routetune adds {added:.3f} s (target <= 0.25 s): "
          f"{'met' if added <= 0.25 else 'NOT met'}")
    print(f"routetune --help takes {median['help']:.3f} s (target <= 0.6 s): "
          f"{'met' if median['help'] <= 0.6 else 'NOT met'}")
    if args.vs:
        for name in ("import", "help"):
            ratios = [b / a for a, b in zip(times[name], times[f"{name} (vs)"], strict=True)]
            print(f"{name}: the other interpreter's time / this one's, median of rounds "
                  f"{statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
