"""The Ray executor's driver against N simulated measuring actors (issue 18).

    python benchmarks/ray_scale.py [--actors 1,2,4,8,16,32] [--trials-per-actor 6]
        [--scale 0.5] [--bundle-mb 1] [--out docs/results/ray-scale-DATE]

The real `routetune.plugins.ray.pool.RayPool` schedules, on a real local Ray instance,
a search whose phases are simulated (`RayPool`'s ``tasks`` argument): a build task
sleeps for a build time and returns a candidate "model" of ``--bundle-mb`` MiB through
the object store; a measuring actor (``num_gpus=1``; Ray is told of N GPUs, as of N
CPUs for builds) receives it and sleeps for a measure time. The times are drawn, with a
fixed seed, from the build and measure phases of recorded real runs
(``docs/results/**/artifacts/timeline.jsonl``: ResNet-50 on H200s, onnxruntime-cuda),
times ``--scale``. The driver does everything it does in a real search: it places
phases, fetches every candidate model into its output folder, appends the timeline and
the logs, and writes each trial to a real trial store (SQLite).

Weak scaling: ``--trials-per-actor`` trials per actor, so a perfect driver takes the
same wall time at every N. Efficiency is the measuring actors' busy share: the sum of
the drawn measure times over (N x wall time). ``scheduled_wall_s`` is the same schedule
played with no overhead at all (`scheduled_s`: the pipeline's fill and the uneven end
are in it); ``overhead_s``, the rest, is what the driver, Ray and this machine cost.
Driver CPU is this process's CPU time (every thread, Ray's core worker included) during
the search; ``machine_busy_cores``, the whole machine's (every process, /proc/stat).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_durations: dict[str, tuple[float, float]] = {}


def _times(box: list[Any], route: Any) -> tuple[float, float]:
    import ray

    if not _durations:
        _durations.update(ray.get(box[0]).durations)
    return _durations[str(route)]


def sim_build(box: list[Any], run: str, route: Any, fingerprint: str, deadline: float,
              *bundles: Any) -> tuple[Any, dict[str, bytes]]:
    """A build task: sleep for the drawn build time, return a model of the drawn size."""
    import ray

    from routetune.candidate.records import BUILT, Outcome

    t0 = time.time()
    build_s, _ = _times(box, route)
    time.sleep(build_s)
    size = ray.get(box[0]).bundle_bytes
    name = f"artifacts/models/{fingerprint[:16]}.onnx"
    fields = {"artifact": name, "candidate_sha256": fingerprint, "settings": {},
              "passes": (), "build_ms": build_s * 1e3}
    where = {"node": "sim", "node_id": ray.get_runtime_context().get_node_id(),
             "gpu": None, "pid": os.getpid()}
    return ((Outcome(BUILT, "", fields), t0, time.time(), os.getpid()), where, ""), {
        name: os.urandom(16) + bytes(size)}


class SimMeasurer:
    """A measuring actor: takes the build's files, sleeps for the drawn measure time."""

    def __init__(self, box: list[Any], run: str, timeout_s: float) -> None:
        self.box = box

    def ready(self) -> dict[str, Any]:
        import ray

        _pause(0)

        return {"gpu": ",".join(map(str, ray.get_gpu_ids()))}

    def measure(self, route: Any, fingerprint: str, built: Any, deadline: float,
                *bundles: Any) -> Any:
        import ray

        from routetune.candidate.records import Outcome
        from routetune.records.trial import Status

        t0 = time.time()
        assert all(len(b) for b in bundles)  # the model arrived
        time.sleep(_times(self.box, route)[1])
        where = {"node": "sim", "node_id": ray.get_runtime_context().get_node_id(),
                 "gpu": ",".join(map(str, ray.get_gpu_ids())), "pid": os.getpid()}
        return (Outcome(Status.OK, "", dict(built)), t0, time.time(), os.getpid()), where, ""

    def close(self) -> None:
        pass


def _pause(seconds: float) -> None:
    """Warm a build worker: its imports, as a real worker's are loaded before trials."""
    import routetune.candidate.records  # noqa: F401
    import routetune.records.trial  # noqa: F401

    time.sleep(seconds)


def sim_clean(run: str) -> None:
    """Nothing to delete: simulated phases write no files on the nodes."""


def scheduled_s(phases: list[tuple[float, float]], n: int) -> float:
    """The wall time of the same schedule with no overhead at all (s).

    Jobs in order; up to `n` builds at once; each built trial measured by the first
    actor free, in the order builds finish. What is left between this and the real
    wall time is the cost of the driver, Ray and this machine.
    """
    import heapq

    slots, actors = [0.0] * n, [0.0] * n
    built = []
    for build_s, measure_s in phases:
        start = heapq.heappop(slots)
        heapq.heappush(slots, start + build_s)
        built.append((start + build_s, measure_s))
    end = 0.0
    for ready, measure_s in sorted(built):
        free = heapq.heappop(actors)
        end = max(free, ready) + measure_s
        heapq.heappush(actors, end)
    return max(actors)


def _busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every process; /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def recorded_phases() -> tuple[list[float], list[float]]:
    """Build and measure durations (s) of every recorded real run's timeline."""
    builds, measures = [], []
    for path in sorted((ROOT / "docs" / "results").glob("**/timeline.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("status") in ("built", "ok") and e["phase"] in ("build", "measure"):
                (builds if e["phase"] == "build" else measures).append(e["end"] - e["start"])
    return builds, measures


def one(n: int, args: argparse.Namespace, builds: list[float], measures: list[float],
        rng: random.Random) -> dict[str, Any]:
    import ray

    from routetune.execution.executor import Job
    from routetune.plugins.ray.pool import RayPool
    from routetune.records.store import TrialStore
    from routetune.records.trial import Trial
    from routetune.routes.route import Route, Step

    trials = n * args.trials_per_actor
    routes = [Route((Step(f"sim-{i:04d}"),)) for i in range(trials)]
    durations = {str(r): (rng.choice(builds) * args.scale, rng.choice(measures) * args.scale)
                 for r in routes}
    out = Path(tempfile.mkdtemp(prefix=f"ray-scale-{n}-"))
    inputs = SimpleNamespace(outdir=out, durations=durations, model=SimpleNamespace(weights=None),
                             bundle_bytes=int(args.bundle_mb * 2**20))
    ray.init(num_cpus=n, num_gpus=n, object_store_memory=max(200, 40 * n) * 2**20,
             include_dashboard=False, configure_logging=False, log_to_driver=False)
    tasks = SimpleNamespace(build=sim_build, Measurer=SimMeasurer, clean=sim_clean,
                            read_log=lambda run, name: "")
    pool = RayPool(None, "sim", gpu=True, timeout_s=600, tasks=tasks)
    warm = ray.remote(_pause).options(num_cpus=1)  # start the build workers first
    ray.get([warm.remote(0.5) for _ in range(n)])
    t_start = time.time()
    pool.warm_up(out)
    pool.start(SimpleNamespace(added=lambda: []), inputs)  # type: ignore[arg-type]
    started_s = time.time() - t_start
    store = TrialStore.open(out / "trials.sqlite")
    jobs = iter([Job(r, f"{i:064x}", r) for i, r in enumerate(routes)])
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), _busy_s()
    done = 0
    for job, outcome in pool.run(jobs, lambda job, built: None):
        store.add(Trial(job.fingerprint, "sim", str(job.route), "sim", "sim", "sim",
                        outcome.status, **{k: v for k, v in outcome.fields.items()
                                           if k in ("artifact", "conditions", "build_ms")}))
        done += 1
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    busy = _busy_s() - busy0
    store.close()
    pool.close()
    shutil.rmtree(out, ignore_errors=True)
    assert done == trials
    measure_sum = sum(m for _, m in durations.values())
    scheduled = scheduled_s(list(durations.values()), n)
    result = {"actors": n, "trials": trials, "wall_s": round(wall, 2),
              "scheduled_wall_s": round(scheduled, 2),
              "overhead_s": round(wall - scheduled, 2),
              "driver_cpu_s": round(cpu, 2),
              "driver_cpu_ms_per_trial": round(1e3 * cpu / trials, 1),
              "driver_cores": round(cpu / wall, 2), "machine_busy_cores": round(busy / wall, 2),
              "efficiency": round(measure_sum / (n * wall), 3),
              "ideal_wall_s": round(measure_sum / n, 2), "start_s": round(started_s, 1)}
    print(json.dumps(result), flush=True)
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["actors"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(n, [r["wall_s"] for r in results], "o-", label="wall")
    a.plot(n, [r["ideal_wall_s"] for r in results], "k--", label="measuring alone")
    a.plot(n, [r["scheduled_wall_s"] for r in results], "k:", label="same schedule, no overhead")
    a.plot(n, [r["driver_cpu_s"] for r in results], "s-", label="driver CPU")
    a.set_xscale("log", base=2)
    a.set_xlabel("measuring actors N")
    a.set_ylabel("s")
    a.legend()
    b.plot(n, [100 * r["efficiency"] for r in results], "o-")
    b.axhline(80, color="grey", lw=0.8)
    b.set_xscale("log", base=2)
    b.set_ylim(0, 105)
    b.set_xlabel("measuring actors N")
    b.set_ylabel("efficiency %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,2,4,8,16,32")
    parser.add_argument("--trials-per-actor", type=int, default=6)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--bundle-mb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "docs" / "results" / f"ray-scale-{time.strftime('%F')}")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local instance
    builds, measures = recorded_phases()
    print(f"{len(builds)} builds, {len(measures)} measurements recorded", flush=True)
    rng = random.Random(args.seed)
    load = os.getloadavg()
    results = [one(int(n), args, builds, measures, rng) for n in args.actors.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} CPUs", "python": sys.version.split()[0],
              "load_before": [round(x, 2) for x in load],
              "load_after": [round(x, 2) for x in os.getloadavg()],
              "driver_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
              "args": {k: str(v) for k, v in vars(args).items()},
              "recorded": {"builds": len(builds), "measures": len(measures)},
              "results": results}
    (args.out / "ray_scale.json").write_text(json.dumps(record, indent=1) + "\n")
    try:
        plot(results, args.out / "ray_scale.png")
    except ImportError:
        pass
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
