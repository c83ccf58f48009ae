"""Machine conditions around a measurement, and what to do on a busy machine.

A verdict measured while other processes compete for the CPU or the GPU is a verdict
about that contention: some routes are faster only when the machine is oversubscribed
(threads that do not spin waste less of a contended CPU). Every measure phase records
what the machine was doing (`Watch`), and the ``--busy-machine`` mode (`BusyPolicy`)
decides what happens when it was busy:

- ``wait`` (default): re-measure after the machine has been quiet for `QUIET_S`
  seconds, waiting at most `BusyPolicy.max_wait_s`; a measurement still busy after that
  is kept and marked noisy;
- ``warn``: measure at once, mark a busy measurement noisy;
- ``ignore``: the same marks, but noisy trials may win (for machines that are always
  busy: the verdict then holds for those conditions).

Under ``wait`` and ``warn`` no winner is crowned from a noisy trial.

A machine can also be slower than it was with nothing here to show it: on the 2-vCPU VM
of docs/benchmarks.md the host takes the second vCPU away for stretches of 2–40 s, with
no other process running and no steal time reported, and two intra-op threads then run
at 25 ms where they ran at 12 ms. So where engines run on the host CPU, the base route's
own figure is watched too (`pace_note`): an attempt whose base route, timed alone, ran
`PACE_SLOWER` times slower than it did alone earlier in the run counts as busy, and
``wait`` waits by timing the base route alone until it is back to its pace.

What is read (Linux ``/proc``; fields missing elsewhere are left out):

- ``load1``: the 1-minute load average (``/proc/loadavg``, every process counted);
- ``foreign_cores``: CPU time used by processes outside the tuner's process tree during
  the window, in cores: the machine's busy time (``/proc/stat``: user, nice, system,
  irq, softirq) less the tree's (``/proc/<pid>/stat`` utime + stime), over the window;
- ``foreign_runnable``: runnable threads outside the tree at the end of the window
  (``/proc/loadavg``'s running count less the tree's threads in state R);
- ``steal_pct``: CPU time the hypervisor gave to other guests, % of all CPU time;
- ``cpu_mhz``: the mean current CPU frequency (cpufreq, else ``/proc/cpuinfo``);
- on a GPU, through NVML (``nvidia-ml-py``): utilisation (%), SM and memory clocks
  (MHz), temperature (°C), and the compute processes on it that are not the tuner's.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MODES = ("wait", "warn", "ignore")
"""The ``--busy-machine`` modes."""

SLACK_CORES = 0.25
"""Foreign CPU use (cores) tolerated beyond the cores the measurer leaves idle: a quiet
machine's daemons use a few percent of a core."""

STEAL_PCT = 5.0
"""Steal time (% of CPU time) above which a virtual machine counts as busy."""

GPU_UTIL_PCT = 10.0
"""GPU utilisation (%) that, while the measurer is idle, means another process computes."""

PACE_SLOWER = 1.3
"""A base route whose p50 alone is this many times its p50 alone earlier in the run marks
the machine slower than it was. A quiet run's base route drifts by about ±6% (the verdicts'
``base drift``); the VM's lost vCPU made it 2.1x (docs/benchmarks.md, 2026-12-05)."""

PAIRED_SLOWER = 1.8
"""A base route whose paired p50 is this many times its p50 alone earlier in the run marks
the machine slower than it was without timing it alone again: sharing caches and cores
with another engine made it up to 1.5x on a small model, the lost vCPU 2.1x and more. A
paired figure between `PACE_SLOWER` and this is timed alone to tell (the slow state may
have ended meanwhile; a figure over this was slow whatever came after)."""

QUIET_S = 2.0
"""Seconds the machine must be quiet before ``wait`` measures again."""

WINDOW_S = 0.5
"""Seconds of one sample window while waiting."""

STATUS_GLOB = "busy-*.json"
"""Files under ``OUTDIR/artifacts/`` in which waiting workers say what they wait for."""

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class BusyPolicy:
    """What a measurement does on a busy machine (``--busy-machine``).

    Args:
        mode: ``wait``, ``warn`` or ``ignore`` (see the module docstring).
        max_wait_s: Seconds ``wait`` waits per measure phase at most.
        gpu: The measuring GPU's ``CUDA_VISIBLE_DEVICES`` value (an index or UUID), or
            None when engines run on the host CPU.
        tuner: Processes whose trees are the tuner's own (not foreign); empty: `tuner_pid`'s.
            Set where workers are not the tuner's children (`routetune.plugins.ray.tasks`).
    """

    mode: str = "wait"
    max_wait_s: float = 60.0
    gpu: str | None = None
    tuner: tuple[int, ...] = ()

    def measurer_cores(self) -> int:
        """Cores the measurer may use: all on the CPU, one (the launching thread) on a GPU."""
        return 1 if self.gpu is not None else cores()


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def tuner_pid() -> int:
    """The tuner's process: this one's parent in a worker, else this one."""
    return os.getppid() if multiprocessing.parent_process() is not None else os.getpid()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu_line() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of all CPUs from ``/proc/stat``."""
    for line in _read("/proc/stat").splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (8 - len(v))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            busy = user + nice + system + irq + softirq
            return busy, steal, busy + idle + iowait + steal
    return 0, 0, 0


def _tree(roots: tuple[int, ...]) -> dict[int, tuple[int, str]]:
    """The processes of the trees of `roots`: pid to (utime + stime jiffies, state)."""
    parent: dict[int, int] = {}
    stats: dict[int, tuple[int, str]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        text = _read(f"/proc/{pid}/stat")
        if not text:
            continue
        fields = text.rsplit(")", 1)[-1].split()  # the name may hold spaces
        parent[pid] = int(fields[1])
        stats[pid] = (int(fields[11]) + int(fields[12]), fields[0])
    members, frontier = set(roots), list(roots)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return {pid: stats[pid] for pid in members if pid in stats}


def _running_threads(pids: Mapping[int, Any]) -> int:
    """Threads in state R among `pids`."""
    count = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            text = _read(f"/proc/{pid}/task/{tid}/stat")
            if text and text.rsplit(")", 1)[-1].split()[0] == "R":
                count += 1
    return count


def _cpu_mhz() -> float | None:
    freqs = []
    base = Path("/sys/devices/system/cpu")
    for f in base.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        text = _read(str(f)).strip()
        if text.isdigit():
            freqs.append(int(text) / 1000)
    if not freqs:
        for line in _read("/proc/cpuinfo").splitlines():
            if line.startswith("cpu MHz"):
                freqs.append(float(line.split(":", 1)[1]))
    return round(sum(freqs) / len(freqs), 1) if freqs else None


@dataclass(frozen=True)
class _Sample:
    t: float
    busy: int
    steal: int
    total: int
    tree: dict[int, tuple[int, str]]


def _sample(roots: tuple[int, ...]) -> _Sample:
    busy, steal, total = _cpu_line()
    return _Sample(time.monotonic(), busy, steal, total, _tree(roots))


def cpu_conditions(a: _Sample, b: _Sample, policy: BusyPolicy) -> dict[str, Any]:
    """The CPU conditions between two samples, with ``busy``: why it was busy, or ""."""
    dt = max(b.t - a.t, 1e-6)
    own = sum(t - a.tree.get(pid, (0, ""))[0] for pid, (t, _) in b.tree.items())
    foreign = max(0.0, (b.busy - a.busy - own) / _TICKS / dt)
    total = b.total - a.total
    steal = 100.0 * (b.steal - a.steal) / total if total > 0 else 0.0
    load = _read("/proc/loadavg").split()
    running = int(load[3].split("/")[0]) if len(load) > 3 else 0
    out: dict[str, Any] = {
        "window_s": round(dt, 3), "cores": cores(),
        "load1": float(load[0]) if load else None,
        "foreign_cores": round(foreign, 3),
        "foreign_runnable": max(0, running - _running_threads(b.tree)),
        "steal_pct": round(steal, 2), "cpu_mhz": _cpu_mhz(),
    }
    limit = max(0, cores() - policy.measurer_cores()) + SLACK_CORES
    reasons = []
    if foreign > limit:
        reasons.append(f"other processes used {foreign:.2f} of {cores()} CPU cores")
    if steal > STEAL_PCT:
        reasons.append(f"CPU steal {steal:.1f}%")
    out["busy"] = "; ".join(reasons)
    return out


def gpu_conditions(gpu: str, own: set[int]) -> dict[str, Any]:
    """The GPU's state through NVML, with ``busy``: why it was busy, or "".

    Args:
        gpu: A ``CUDA_VISIBLE_DEVICES`` value: an index (NVML counts every GPU, as
            ``CUDA_VISIBLE_DEVICES`` does) or a ``GPU-…`` UUID.
        own: The tuner's process ids; other compute processes are foreign.

    Returns:
        ``util_pct``, ``mem_util_pct``, ``sm_mhz``, ``mem_mhz``, ``temp_c``,
        ``foreign_processes`` (pid and used memory in bytes), ``busy``; or ``nvml``
        saying why NVML could not be read.
    """
    try:
        import pynvml
    except ImportError:
        return {"nvml": "nvidia-ml-py is not installed (pip install nvidia-ml-py)", "busy": ""}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"nvml": f"NVML could not start: {e}", "busy": ""}
    try:
        handle = (pynvml.nvmlDeviceGetHandleByUUID(gpu) if gpu.startswith(("GPU-", "MIG-"))
                  else pynvml.nvmlDeviceGetHandleByIndex(int(gpu)))
        utils = []
        for _ in range(3):  # NVML's figure covers its last sample period (1/6 s to 1 s)
            utils.append(pynvml.nvmlDeviceGetUtilizationRates(handle))
            time.sleep(0.05)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        pids = {p.pid for p in procs}
        resolved = bool(pids & own) or not pids
        foreign = [{"pid": p.pid, "bytes": p.usedGpuMemory} for p in procs if p.pid not in own]
        out: dict[str, Any] = {
            "util_pct": max(u.gpu for u in utils),
            "mem_util_pct": max(u.memory for u in utils),
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "foreign_processes": foreign,
            "pids_resolved": resolved,  # False: NVML sees pids of another namespace
        }
    except (pynvml.NVMLError, ValueError) as e:
        return {"nvml": f"NVML could not read GPU {gpu}: {e}", "busy": ""}
    finally:
        pynvml.nvmlShutdown()
    reasons = []
    if out["util_pct"] >= GPU_UTIL_PCT:
        reasons.append(f"GPU {gpu} {out['util_pct']}% busy before our runs")
    if resolved and foreign:
        reasons.append(f"{len(foreign)} other process(es) computing on GPU {gpu}")
    out["busy"] = "; ".join(reasons)
    return out


def pace_note(ms: float | None, pace_ms: float | None, paired: bool = False,
              foreign: bool = False) -> str:
    """Why a base route timed at `ms` shows the machine slower than at `pace_ms`.

    Args:
        ms: The base route's p50 now (ms), or None where it was not timed.
        pace_ms: Its p50 alone earlier in the run (ms), or None where none is known.
        paired: `ms` is a measurement's own figure (paired with another engine, as a
            rule), not one timed alone for this check: its bar is `PAIRED_SLOWER`.
        foreign: Other processes loaded the machine meanwhile: the note then states
            the figures only, blaming nothing (the load is named beside it).

    Returns:
        The reason, or "" where `ms` is within the bar times `pace_ms`.
    """
    bar = PAIRED_SLOWER if paired else PACE_SLOWER
    if ms is None or not pace_ms or ms <= pace_ms * bar:
        return ""
    how = "in this measurement" if paired else "alone"
    note = (f"the base route ran {how} at {ms:.3g} ms (p50), {ms / pace_ms:.2f}x its p50 "
            f"earlier in this run ({pace_ms:.3g} ms)")
    if foreign:
        return note
    return (f"{note}, with no other process to blame: "
            "this machine is slower than it was (a core or clock taken away)")


class Watch:
    """Records the machine's conditions over a measurement, and waits for quiet.

    Use `start` right before timing and `stop` right after; `wait_quiet` between two
    attempts. The GPU is read before timing (while the measurer is idle, its utilisation
    is other processes') and its processes after.

    Args:
        policy: The busy-machine policy.
        status: Where a waiting worker says what it waits for (a JSON file the tuner's
            process polls for its status line), or None.
    """

    def __init__(self, policy: BusyPolicy, status: Path | None = None) -> None:
        self.policy, self.status, self.roots = policy, status, policy.tuner or (tuner_pid(),)
        self._start: _Sample | None = None
        self._gpu_before: dict[str, Any] | None = None

    def start(self) -> None:
        """Begin a measurement window."""
        if self.policy.gpu is not None:
            self._gpu_before = gpu_conditions(self.policy.gpu, set(_tree(self.roots)))
        self._start = _sample(self.roots)

    def stop(self) -> dict[str, Any]:
        """End the window; the conditions, ``busy`` saying why it was busy (or "")."""
        if self._start is None:
            raise RuntimeError("Watch.stop before Watch.start")
        out = cpu_conditions(self._start, _sample(self.roots), self.policy)
        if self._gpu_before is not None:
            out["gpu"] = self._gpu_before
            if self._gpu_before.get("busy"):
                out["busy"] = "; ".join(filter(None, (out["busy"], self._gpu_before["busy"])))
        return out

    def quick_busy(self, window_s: float = 0.1) -> str:
        """Why the machine was busy over the next `window_s` seconds (a quick look), or ""."""
        a = _sample(self.roots)
        time.sleep(window_s)
        reason = cpu_conditions(a, _sample(self.roots), self.policy)["busy"]
        if not reason and self.policy.gpu is not None:
            reason = gpu_conditions(self.policy.gpu, set(_tree(self.roots)))["busy"]
        return reason

    def wait_quiet(self, budget_s: float, why: str,
                   look: Callable[[], str] | None = None) -> float:
        """Wait until the machine has been quiet for `QUIET_S`, at most `budget_s`.

        Says what it waits for in the status file while waiting.

        Args:
            budget_s: Seconds to wait at most.
            why: Why the machine is busy, for the status line.
            look: A further look after each quiet window (the base route's pace):
                why the machine is still not as it was, or "".

        Returns:
            Seconds waited.
        """
        t0 = time.monotonic()
        quiet_since: float | None = None
        try:
            while (waited := time.monotonic() - t0) < budget_s:
                self._say(f"waiting for a quiet machine ({why}); {waited:.0f} s of at most "
                          f"{budget_s:.0f} s")
                reason = self.quick_busy(WINDOW_S) or (look() if look else "")
                if reason:
                    why, quiet_since = reason, None
                elif quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= QUIET_S:
                    break
        finally:
            if self.status is not None:
                self.status.unlink(missing_ok=True)
        return time.monotonic() - t0

    def _say(self, text: str) -> None:
        logger.warning("%s", text)
        if self.status is not None:
            tmp = self.status.with_suffix(".tmp")
            tmp.write_text(json.dumps({"text": text}))
            tmp.replace(self.status)


STEADY_AFTER_S = 30.0
"""A wait that finds no quiet in this long (s) takes the load as steady, and the attempt
before it stands, marked noisy: from then on the same process neither waits nor
measures through (`measure_watched`), and each attempt is its own look (one whose
window is quiet ends the steady state). Waiting the whole `BusyPolicy.max_wait_s` again
and again spent a search's budget on waiting (2026-12-04: 181 s of a 300 s budget, 4 of
120 trials measured), and so did a 10 s look after every unsettled trial (2026-12-06:
111 s of 300, 40%; docs/benchmarks.md). Fifteen times `QUIET_S`: bursty load with a
quiet gap in that time is waited on as before."""


@dataclass
class Steady:
    """Why load lasted through a wait of `STEADY_AFTER_S` in this process, or ""."""

    busy: str = ""


def measure_watched(policy: BusyPolicy, status: Path | None, run: Callable[[], Any],
                    settled: Callable[[Any], bool] | None = None,
                    slower: Callable[[Any, bool], str] | None = None,
                    look: Callable[[], str] | None = None,
                    through: Callable[[], Any] | None = None,
                    steady: Steady | None = None,
                    ) -> tuple[Any, dict[str, Any]]:
    """Run a measurement under `policy`: wait for quiet and measure again as it says.

    Under ``wait``, a busy look before the first attempt, or a busy attempt, waits until
    the machine is quiet (at most ``policy.max_wait_s`` in all) and measures again; the
    last attempt stands. Other modes measure once.

    With `settled`, ``wait`` measures at once, and waits only where the paired
    statistics cannot decide: a busy attempt whose result is settled (a candidate that
    cannot reach its bar even at the top of its interval, whatever the load did to it)
    stands, marked noisy. One that might matter is first measured through the noise
    with `through`, at once: a longer paired measurement, whose narrower interval may
    settle it after all (load that slows both engines alike cancels out of a paired
    figure; what is left widens the interval, and more blocks narrow it). Only one
    still unsettled waits for quiet and is measured again. So a busy machine costs
    waiting only for the routes that could win. With `steady`, a wait that finds no
    quiet in `STEADY_AFTER_S` ends there, and the attempt before it stands, marked
    noisy; later measurements in the process then neither wait nor measure through
    (each attempt's own window is the look; a longer measurement only avoids a wait,
    and a noisy figure neither wins nor is built on) until an attempt finds the
    machine quiet.

    Args:
        policy: The busy-machine policy.
        status: The status file for the tuner's status line, or None.
        run: The measurement.
        settled: Whether a result needs no quiet re-measurement; None: every busy
            result does.
        slower: Why a result itself shows the machine slower than it was (`pace_note`),
            or "": such an attempt counts as busy. Its second argument says whether
            other processes loaded the machine meanwhile (their load is named first).
        look: What ``wait`` checks besides foreign load while it waits (the base
            route's pace now, `pace_note`).
        through: The longer measurement tried once, at once, on a busy attempt that
            is not `settled`, before any wait; None: wait at once.
        steady: This process's steady-load state, kept across measurements; None:
            every wait may take ``policy.max_wait_s``, and none ends early.

    Returns:
        `run`'s result and the conditions of the attempt that stands, with
        ``waited_s`` (seconds waited in all), ``attempts``, ``through`` (whether a
        busy attempt was measured through, `through`), ``steady`` (the steady load that
        let the attempt stand without a quiet one, or "") and ``mode``.
    """
    watch = Watch(policy, status)
    waited, attempts, shortened = 0.0, 0, ""

    def wait(budget_s: float, why: str, look: Callable[[], str] | None = None) -> bool:
        """Wait for quiet; whether the load is steady, so that the attempt stands."""
        nonlocal waited, shortened
        if steady is not None and not steady.busy:
            budget_s = min(budget_s, STEADY_AFTER_S)
        elif steady is not None:  # steady already: no wait, the attempt was the look
            shortened = steady.busy
            return True
        spent = watch.wait_quiet(budget_s, why, look)
        waited += spent
        if steady is not None and spent >= budget_s:  # no quiet found
            steady.busy = shortened = why
            return True
        return False

    if policy.mode == "wait" and settled is None and (why := watch.quick_busy()):
        wait(policy.max_wait_s, why)
    now, measured_through = run, False
    while True:
        attempts += 1
        watch.start()
        result = now()
        conditions = watch.stop()
        if slower is not None:  # both causes named where both are seen
            conditions["busy"] = "; ".join(filter(None, (
                conditions["busy"], slower(result, bool(conditions["busy"])))))
        if steady is not None and not conditions["busy"]:
            steady.busy = ""  # a quiet attempt: the steady load is over
        left = policy.max_wait_s - waited
        if (policy.mode != "wait" or not conditions["busy"] or left <= 0
                or (settled is not None and settled(result))):
            break
        if through is not None and not measured_through and not (steady and steady.busy):
            now, measured_through = through, True
            continue
        if wait(left, conditions["busy"], look):
            break  # steady load: this attempt stands, marked noisy
        now = run
    conditions.update(waited_s=round(waited, 2), attempts=attempts,
                      through=measured_through, steady=shortened, mode=policy.mode)
    return result, conditions


def read_statuses(artifacts: Path) -> list[str]:
    """What waiting workers say (`Watch`), from ``artifacts/busy-*.json``."""
    out = []
    for path in sorted(artifacts.glob(STATUS_GLOB)):
        try:
            out.append(str(json.loads(path.read_text())["text"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
