"""Does the early look of a confirmation clear a tie under induced load? (issue 38)

A confirmation, and a side-by-side loop of several backends, ends once its first 10
paired ratios all clear ``--min-speedup`` (`routetune.timing.race.clears_early`). This
times a perfect tie, the same engine twice (the example's base route, opened twice), in
side-by-side loops of a confirmation's length (30 paired blocks at least, 3 s per
engine) under the bursty load of `benchmarks/fidelity.py` (every core at a duty cycle of
0, 0.5 or 1, redrawn every 8 s), with ``--busy-machine ignore`` so that nothing waits
for quiet. For each loop it asks, after every round as the live rule does, whether the
early look would have cleared the tie, and whether the full loop's 95% interval clears
it: either is a false clear.

Usage::

    python benchmarks/early_look_load.py --loops 40 --out OUT   # OUT/early_look_load.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from fidelity import DUTIES, PHASE_S, loadavg, start_load

from routetune.candidate.candidate import CONFIRM_BLOCKS
from routetune.plugin_manager import load_registry
from routetune.run.preparation import prepare_run
from routetune.run.run_spec import RunSpec
from routetune.run.side_by_side import loop_inputs, timed_loop
from routetune.timing.measure import paired_speedup
from routetune.timing.race import Bar, clears_early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="ppocr-det")
    parser.add_argument("--loops", type=int, default=40)
    parser.add_argument("--min-speedup", type=float, default=1.03)
    parser.add_argument("--out", type=Path, default=Path("early-look-out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    registry = load_registry()
    spec = RunSpec(example=args.example, busy_machine="ignore",
                   output=args.out / "run", in_process=True)
    run = prepare_run(spec, registry)
    job = (loop_inputs(run), tuple(run.base), None)
    m = spec.measure
    settings = dataclasses.replace(m, min_blocks=max(CONFIRM_BLOCKS, m.min_blocks),
                                   min_time_s=3 * m.min_time_s, max_time_s=3 * m.max_time_s)
    bar = Bar.min_speedup(args.min_speedup)
    rows: list[dict[str, Any]] = []
    started = time.time()
    for i in range(args.loops):
        procs = start_load(seed=7919 * i)
        try:
            loop = timed_loop([job, job], settings, False, registry)
        finally:
            for p in procs:
                p.kill()
                p.join()
        early = next((k for k in range(2, len(loop.blocks) + 1)
                      if clears_early(loop.blocks[:k], bar, 1, 0) is not None), None)
        full = paired_speedup(loop.blocks, 1, 0)
        rows.append({"loop": i, "rounds": len(loop.blocks) // 2,
                     "early_clear_after_blocks": early,
                     "full": [full.value, full.ci_low, full.ci_high, full.pairs, full.drift],
                     "full_clears": full.clears(bar.speedup) is None,
                     "foreign_cores": loop.conditions.get("foreign_cores"),
                     "busy": loop.conditions.get("busy", "")})
        print(json.dumps(rows[-1]), flush=True)
        time.sleep(1)
    result = {"example": args.example, "min_speedup": args.min_speedup, "loops": rows,
              "early_false_clears": sum(r["early_clear_after_blocks"] is not None for r in rows),
              "full_false_clears": sum(r["full_clears"] for r in rows),
              "machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count(), "python": platform.python_version()},
              "load": {"duties": DUTIES, "phase_s": PHASE_S}, "loadavg_at_end": loadavg(),
              "wall_s": round(time.time() - started, 1)}
    (args.out / "early_look_load.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "loops"}, indent=1))


if __name__ == "__main__":
    main()
