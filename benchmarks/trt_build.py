"""TensorRT build time per route, with a cold and a warm timing cache, on PP-OCR.

Usage: python benchmarks/trt_build.py [--out DIR] [--models ppocr-det,...] [--repeats N]

For each model: ``routetune tune --backend tensorrt --search exhaustive --max-depth 1``
over the precision and ``trt-*`` seasonings (every route of one step is built; on a
machine whose runtime cannot run the engines they are ``build-only``). Then each built
route is rebuilt `--repeats` times with a cold timing cache (the cache file removed
before each build) and with a warm one (the cache the search left, copied back before
each build), cold and warm alternating route by route so that both see the same machine
state. Figures are medians in seconds and the warm/cold ratio; plan files are never
reused here (no key), so every figure is a real build.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import routetune
from routetune.plugin_manager import load_registry
from routetune.plugins.tensorrt.backend import TIMING_CACHE, TensorRtBackend
from routetune.run.run_spec import RunSpec
from routetune.run.tuning import tune

SEASONINGS = ("fp16", "int8-qdq", "trt-opt-level", "trt-tiling", "trt-aux-streams",
              "trt-tf32", "trt-build-route")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("routetune-out/trt-build-bench"))
    parser.add_argument("--models", default="ppocr-det,ppocr-rec,ppocr-cls")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args()
    registry = load_registry()
    unloaded = _CountUnloadedCaches()
    logging.getLogger("routetune.plugins.tensorrt.backend").addHandler(unloaded)
    logging.getLogger("routetune.plugins.tensorrt.backend").propagate = False
    rows = []
    for name in args.models.split(","):
        started = time.perf_counter()
        unloaded.counting = False
        result = tune(RunSpec(example=name, backend="tensorrt", output=args.out / name,
                              fresh=True, seasonings=SEASONINGS, search="exhaustive",
                              max_depth=1), registry)
        search_s = time.perf_counter() - started
        backend = TensorRtBackend(_profile(result))
        warm_cache = (args.out / name / "artifacts" / "engines" / TIMING_CACHE).read_bytes()
        built = [t for t in result.trials if t.engine_bytes]
        unloaded.count_from_here()
        for t in sorted(built, key=lambda t: t.route):
            cold, warm = [], []
            for _ in range(args.repeats):
                cold.append(_build(backend, args.out / name / t.artifact, t.settings, None))
                warm.append(_build(backend, args.out / name / t.artifact, t.settings,
                                   warm_cache))
            rows.append({"model": name, "route": t.route, "status": t.status,
                         "engine_bytes": t.engine_bytes, "cold_s": statistics.median(cold),
                         "warm_s": statistics.median(warm),
                         "search_s": round(search_s, 1)})
    print(f"routetune {routetune.__version__}, {backend.version()}, device: "
          f"{backend.device()}, Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}; median of {args.repeats} builds")
    print("\n| model | route | status | plan MB | cold cache s | warm cache s | warm/cold |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | `{r['route']}` | {r['status']} | "
              f"{r['engine_bytes'] / 1e6:.1f} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
              f"{r['warm_s'] / r['cold_s']:.2f} |")
    for name in args.models.split(","):
        mine = [r for r in rows if r["model"] == name]
        ratio = statistics.median(r["warm_s"] / r["cold_s"] for r in mine)
        print(f"\n{name}: {len(mine)} routes built, search {mine[0]['search_s']} s; median "
              f"build {statistics.median(r['cold_s'] for r in mine):.2f} s cold, "
              f"{statistics.median(r['warm_s'] for r in mine):.2f} s warm; median "
              f"warm/cold {ratio:.2f}")
    warm_builds = len(rows) * args.repeats
    print(f"\nwarm builds whose timing cache TensorRT could not load: {unloaded.count} of "
          f"{warm_builds}" + (f" ({unloaded.last})" if unloaded.count else ""))
    if args.json:
        args.json.write_text(json.dumps({"backend": backend.version(),
                                         "device": backend.device(), "rows": rows,
                                         "warm_cache_not_loaded": unloaded.count,
                                         "warm_builds": warm_builds,
                                         "cache_message": unloaded.last}, indent=1))


class _CountUnloadedCaches(logging.Handler):
    """Counts the backend's "could not load the timing cache" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count, self.last, self.counting = 0, "", False

    def count_from_here(self) -> None:
        """Count from now on (the search's own builds before this are not counted)."""
        self.counting = True

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "could not load the timing cache" in message and self.counting:
            self.count += 1
            self.last = message.split(" (", 1)[-1][:200]


def _profile(result):  # noqa: ANN001, ANN202
    from routetune.feeds.profile import ShapeProfile

    return ShapeProfile.parse(result.base.settings["tensorrt.profile"])


def _build(backend: TensorRtBackend, model: Path, settings: dict, cache: bytes | None) -> float:
    """One build in a fresh directory, starting from `cache` (None: no cache); seconds."""
    with tempfile.TemporaryDirectory(prefix="trt-bench-") as tmp:
        workdir = Path(tmp)
        if cache is not None:
            (workdir / "engines").mkdir()
            (workdir / "engines" / TIMING_CACHE).write_bytes(cache)
        t0 = time.perf_counter()
        backend.build(model, settings, workdir)
        elapsed = time.perf_counter() - t0
        shutil.rmtree(workdir / "engines", ignore_errors=True)
    return elapsed


if __name__ == "__main__":
    main()
