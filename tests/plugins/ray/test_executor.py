"""`--executor ray` on a real Ray cluster of two nodes, both on this machine.

The module's cluster is started once: a head (``ray start --head``) and a second node
(``ray start --address=…``) with a resource of its own (``second``) and its own temp
dir, one CPU each. Node deaths are noticed within about 1.5 s (health checks every
0.5 s, three missed). Each node keeps its run folder apart (`ray_tasks.node_outdir`),
so files travel through the object store as between machines. At the end only the
processes this module started are stopped, by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from command import routetune_script as routetune
from graphs import conv_bn, external_model, wasteful
from plugin_packages import installed_in_the_environment as installed

import routetune as routetune_api
from routetune.model import weights
from routetune.records.store import TrialStore

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.serial  # a cluster of its own, its nodes' processes and timings

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # a local test cluster; whatever ~/.ray holds
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "500",
}
NODE = ["--num-cpus=1", "--num-gpus=0", "--object-store-memory=100000000",
        "--disable-usage-stats"]
SEASONINGS = "fp16,fuse-bn-into-conv,eliminate-noops,ort-threads"


@dataclass
class Cluster:
    address: str
    head_id: str
    second_id: str
    second_raylet: int
    temp: Path
    started: set[int]  # every process of the cluster seen so far

    def kill_second_node(self) -> None:
        """SIGKILL the second node's raylet, then its workers, as when a machine dies.

        A worker whose raylet alone died may still finish its phase and answer the
        driver directly (a valid result, but then no trial is lost to test).
        """
        self.started |= _tree(_pids_with(f"{MARK}={self.temp}\0"))
        node = _tree([self.second_raylet])
        os.kill(self.second_raylet, signal.SIGKILL)
        for pid in node - {self.second_raylet}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def node_folders(self) -> Path:
        """Where the cluster's nodes keep their run folders (`ray_tasks.node_outdir`)."""
        return self.temp / "tmp" / "routetune-ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MARK = "ROUTETUNE_TEST_CLUSTER"
"""Set for ``ray start``: every process of the cluster inherits it (`_pids_with`)."""


def _pids_with(text: str, where: str = "environ") -> list[int]:
    """This user's processes whose environment (or command line) contains `text`."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text.encode() in (proc / where).read_bytes():
                    out.append(int(proc.name))
            except OSError:
                pass
    return out


def _tree(roots: list[int]) -> set[int]:
    """`roots` and all their descendants (Ray's agents rewrite their environment)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _ray(temp: Path, *args: str) -> None:
    (temp / "tmp").mkdir(exist_ok=True)
    done = subprocess.run([str(Path(sys.executable).parent / "ray"), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **RAY_ENV, MARK: str(temp),
                               "TMPDIR": str(temp / "tmp")})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp = Path(tempfile.mkdtemp(prefix="rt-ray-"))  # short: Ray's socket paths have a limit
    port = _free_port()
    _ray(temp, "start", "--head", f"--port={port}", "--include-dashboard=false",
         f"--temp-dir={temp / 'head'}", *NODE)
    try:
        _ray(temp, "start", f"--address=127.0.0.1:{port}", "--resources={\"second\": 1}",
             f"--temp-dir={temp / 'second'}", *NODE)
        ray.init(address=f"127.0.0.1:{port}", configure_logging=False, log_to_driver=False)
        try:
            nodes = {n["Resources"].get("second", 0): n for n in ray.nodes() if n["Alive"]}
        finally:
            ray.shutdown()
        second = nodes[1]
        raylet = [p for p in _pids_with(f"{temp / 'second'}/session", "cmdline")
                  if b"raylet/raylet\0" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(raylet) == 1, raylet
        yield (cluster := Cluster(f"127.0.0.1:{port}", nodes[0]["NodeID"], second["NodeID"],
                                  raylet[0], temp, set()))
    finally:
        started = _tree(_pids_with(f"{MARK}={temp}\0"))  # only what this module started
        for pid in started | (cluster.started if "cluster" in locals() else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def tune_flags(model: Path, out: Path, *flags: str) -> list[str]:
    return ["tune", str(model), "--shapes", "x:1x3x32x32", "--output", str(out),
            "--seasonings", SEASONINGS, "--search", "exhaustive", "--max-depth", "1",
            "--min-runs", "3", "--min-time", "0.05", "--busy-machine", "warn",
            "--keep", "all", "--min-speedup", "1.5", *flags]


def stored(out: Path) -> dict[str, object]:
    store = TrialStore.open(out / "trials.sqlite")
    try:
        return {t.route: t for t in store.trials()}
    finally:
        store.close()


def timeline(out: Path) -> list[dict[str, object]]:
    path = out / "artifacts" / "timeline.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return conv_bn(tmp_path_factory.mktemp("model") / "m.onnx")


@pytest.fixture(scope="module")
def by_pool(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The trials of the local pool's search."""
    out = tmp_path_factory.mktemp("local") / "out"
    done = routetune(*tune_flags(model, out), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    winner = json.loads((out / "winner.json").read_text())["route"]
    return {"winner": winner, **stored(out)}


def test_ray_and_the_local_pool_find_the_same_trials_and_winner(
        cluster: Cluster, model: Path, by_pool: dict[str, object], tmp_path: Path) -> None:
    # Both "nodes" share this machine's two cores, so a build on one disturbs a
    # measurement on the other, as two machines would not: speed-ups of a few percent
    # (ort-threads) come and go between runs. --min-speedup 1.5 (tune_flags) asks a
    # margin no route of this model has on a quiet machine, and --busy-machine warn
    # keeps a route faster only while the suite's other tests load the cores (one
    # thread of two, 2026-12-06) from winning: the verdict is a declared tie in both.
    done = routetune(*tune_flags(model, tmp_path / "ray", "--executor", "ray",
                                 "--ray-address", cluster.address), timeout=240, **RAY_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    by_pool = dict(by_pool)
    pool_winner = by_pool.pop("winner")
    by_ray = stored(tmp_path / "ray")
    assert {r: t.status for r, t in by_ray.items()} == {r: t.status for r, t in by_pool.items()}
    assert {t.fingerprint for t in by_ray.values()} == {t.fingerprint for t in by_pool.values()}
    winners = [pool_winner, json.loads((tmp_path / "ray" / "winner.json").read_text())["route"]]
    assert winners == ["base", "base"]
    # both nodes worked, every trial says where, and files travelled between them
    events = [e for e in timeline(tmp_path / "ray") if e["phase"] in ("build", "measure")]
    assert {e["node_id"] for e in events} == {cluster.head_id, cluster.second_id}
    measured = [t for t in by_ray.values() if t.latency is not None]
    assert measured and all(t.conditions["node"]["node_id"] in (cluster.head_id,
                                                                 cluster.second_id)
                            for t in measured)
    assert all("node" in t.conditions for t in by_ray.values() if t.status != "skipped")
    for t in by_ray.values():  # the driver holds every candidate model
        if t.artifact:
            assert (tmp_path / "ray" / t.artifact).is_file(), t.route
    assert not list(cluster.node_folders().glob("*/*"))  # the nodes' run folders: deleted


def test_a_model_with_external_data_is_searched_on_both_nodes(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    # The base model's data file travels once through the object store; the second node
    # writes it into its own folder, and new weights (fp16) come back with the candidate.
    model = external_model(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    done = routetune("tune", str(model), "--shapes", "x:2x64", "--output", str(out),
                     "--seasonings", "fold-constants,fp16", "--search", "exhaustive",
                     "--max-depth", "2", "--min-runs", "3", "--min-time", "0.05",
                     "--busy-machine", "ignore", "--accuracy", "l2<=0.05", "--keep", "all",
                     "--executor", "ray", "--ray-address", cluster.address,
                     timeout=240, **RAY_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = stored(out)
    assert {r: t.status for r, t in trials.items()} == {
        "base": "ok", "fold-constants": "ok", "fp16": "ok", "fold-constants,fp16": "ok"}, {
        r: t.reason for r, t in trials.items()}
    events = [e for e in timeline(out) if e["phase"] in ("build", "measure")]
    assert {e["node_id"] for e in events} == {cluster.head_id, cluster.second_id}
    fp16 = [t for r, t in trials.items() if "fp16" in r]
    for t in fp16:  # the driver has each candidate and the weights it names
        candidate = onnx.load(str(out / t.artifact), load_external_data=False)
        for name in weights.locations(candidate):
            assert (out / t.artifact).parent.joinpath(name).is_file(), (t.route, name)
    assert not list(cluster.node_folders().glob("*/*"))


def test_a_dead_worker_is_crashed_and_a_hang_timed_out(cluster: Cluster,
                                                      tmp_path: Path) -> None:
    with installed("routetune-chaos", tmp_path / "pkg"):  # the nodes load it too
        out = tmp_path / "out"
        done = routetune(
            "tune", str(wasteful(tmp_path / "w.onnx")), "--output", str(out),
            "--seasonings", "chaos-segfault,chaos-hang,chaos-drop-waste", "--search",
            "exhaustive", "--max-depth", "1", "--trial-timeout", "6", "--min-runs", "3",
            "--min-time", "0.05", "--busy-machine", "ignore", "--executor", "ray",
            "--ray-address", cluster.address, timeout=240, **RAY_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = stored(out)
    assert {r: t.status for r, t in trials.items()} == {
        "base": "ok", "chaos-drop-waste": "ok", "chaos-segfault": "crashed",
        "chaos-hang": "timed-out"}
    segfault, hang = trials["chaos-segfault"].reason, trials["chaos-hang"].reason
    assert segfault.startswith("the build worker died: ") and "Segmentation fault" in segfault
    assert "--trial-timeout 6 s" in hang and "Timeout (" in hang and "in apply" in hang
    assert "from node" in hang and "from node" in segfault
    hung = next(e for e in timeline(out) if e["route"] == "chaos-hang")
    assert 6 <= hung["end"] - hung["start"] < 16


def test_past_the_time_budget_a_built_candidate_is_not_measured_and_a_resume_measures_it(
        cluster: Cluster, tmp_path: Path) -> None:
    """RayPool asks the loop when a measuring actor is free (`_place_measurements`), as
    the local pool does: ``chaos-slow`` (a 12 s build) starts before the 10 s deadline
    and is built after it, so it is not measured until a resumed run."""
    out = tmp_path / "out"
    flags = ("--seasonings", "chaos-slow", "--search", "exhaustive", "--max-depth", "1",
             "--min-runs", "3", "--min-time", "0.02", "--busy-machine", "ignore",
             "--executor", "ray", "--ray-address", cluster.address)
    with installed("routetune-chaos", tmp_path / "pkg"):  # the nodes load it too
        model = str(wasteful(tmp_path / "w.onnx"))
        done = routetune("tune", model, "--output", str(out), "--time-budget", "10", *flags,
                         timeout=240, **RAY_ENV)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads((out / "run.json").read_text())["result"]["stopped"] == (
            "--time-budget 10 s reached; 1 built, not measured (measured on resume): "
            "chaos-slow")
        assert list(stored(out)) == ["base"]
        again = routetune("tune", model, "--output", str(out), *flags, timeout=240, **RAY_ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {r: t.status for r, t in stored(out).items()} == {"base": "ok", "chaos-slow": "ok"}
    assert json.loads((out / "run.json").read_text())["result"]["stopped"] is None


def test_bad_addresses_and_a_gpu_backend_without_gpus_are_one_line(
        cluster: Cluster, model: Path, tmp_path: Path) -> None:
    from routetune.errors import UsageError
    from routetune.plugins.ray.pool import RayPool

    port = _free_port()
    done = routetune(*tune_flags(model, tmp_path / "o", "--executor", "ray", "--ray-address",
                                 f"127.0.0.1:{port}"), timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--ray-address 127.0.0.1:{port}: no Ray cluster answers" \
        in lines[0] and "ray start --head" in lines[0], done.stderr
    done = routetune(*tune_flags(model, tmp_path / "o", "--ray-address", "auto"), timeout=120)
    assert done.returncode == 2 and "only with --executor ray" in done.stderr
    with pytest.raises(UsageError, match=r"ray_address=\.\.\.\) 127.0.0.1:\d+: no Ray cluster"):
        routetune_api.tune(model, shapes="x:1x3x32x32", output=tmp_path / "api",
                           executor="ray", ray_address=f"127.0.0.1:{port}")
    pool = RayPool(cluster.address, "onnxruntime-cuda", gpu=True, timeout_s=60)
    with pytest.raises(UsageError, match="ray: the onnxruntime-cuda backend measures on GPUs, "
                       "and this Ray cluster .2 nodes. has none"):
        pool.warm_up(tmp_path)
    assert not ray.is_initialized()


def _running_on(cluster: Cluster, phase: str, out: Path) -> bool:
    """Whether a trial's `phase` has started on the second node (its log there says) and
    not ended (the driver's timeline says)."""
    ended = {e["route"] for e in timeline(out) if e["phase"] == phase}
    for log in cluster.node_folders().glob(f"*/{cluster.second_id[:12]}/artifacts/logs/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("== ") and f": {phase} " in line \
                    and line.split(f": {phase} ", 1)[1] not in ended:
                return True
    return False


def test_a_lost_node_sends_its_trial_to_another_node(
        cluster: Cluster, model: Path, by_pool: dict[str, object], tmp_path: Path) -> None:
    out = tmp_path / "out"
    driver = subprocess.Popen(
        [sys.executable, "-m", "routetune", *tune_flags(
            model, out, "--executor", "ray", "--ray-address", cluster.address,
            "--min-time", "0.5", "--no-race")],  # every measurement long enough to cut
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **RAY_ENV})
    try:
        deadline = time.monotonic() + 120
        while not _running_on(cluster, "measure", out):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.05)
        cluster.kill_second_node()  # mid-measure
        before = _rows(out)
        stdout, stderr = driver.communicate(timeout=180)
    finally:
        driver.kill()
    assert driver.returncode == 0, stderr[-3000:]
    trials = stored(out)
    lost = [t for t in trials.values() if t.conditions.get("lost_attempts")]
    assert len(lost) == 1, ({r: (t.status, t.reason) for r, t in trials.items()}, timeline(out))
    (attempt,) = lost[0].conditions["lost_attempts"]
    assert attempt["node_id"] == cluster.second_id and attempt["phase"] == "measure"
    assert lost[0].conditions["node"]["node_id"] == cluster.head_id  # measured again
    assert lost[0].status in ("ok", "accuracy-failed")
    events = timeline(out)
    assert [e["route"] for e in events if e["status"] == "node-lost"] == [lost[0].route]
    assert {k: v for k, v in _rows(out).items() if k in before} == before  # none lost
    loss = next(i for i, e in enumerate(events) if e["status"] == "node-lost")
    assert all(e["node_id"] == cluster.head_id for e in events[loss + 1:]
               if e["phase"] in ("build", "measure"))
    assert set(trials) == set(by_pool) - {"winner"}  # the search finished, on the head


def test_sigterm_keeps_the_trials_and_a_killed_driver_resumes(cluster: Cluster, model: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    flags = tune_flags(model, out, "--executor", "ray", "--ray-address", "auto")
    env = {**os.environ, **RAY_ENV, "RAY_ADDRESS": cluster.address}

    def start_and_wait_for(rows: int) -> subprocess.Popen[str]:
        driver = subprocess.Popen([sys.executable, "-m", "routetune", *flags],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
        deadline = time.monotonic() + 120
        while len(_rows(out)) < rows:
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.05)
        return driver

    driver = start_and_wait_for(2)
    driver.send_signal(signal.SIGTERM)  # the search stops, Ray's tasks are cancelled
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 143, stderr[-3000:]
    assert "interrupted (SIGTERM): no new trials" in " ".join(stdout.split())
    after_term = _rows(out)
    assert len(after_term) >= 2
    driver = start_and_wait_for(len(after_term) + 1)
    driver.kill()  # kill -9: no clean-up at all
    driver.communicate()
    kept = _rows(out)
    done = routetune(*flags, timeout=240, **RAY_ENV, RAY_ADDRESS=cluster.address)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(out)
    assert {k: v for k, v in rows.items() if k in kept} == kept  # read back, not redone
    assert len(rows) > len(kept) and after_term.items() <= kept.items()
    assert not [e for e in timeline(out) if e["route"] in kept and e["start"] > max(
        kept.values()) and e["phase"] in ("build", "measure")]


def _rows(out: Path) -> dict[str, float]:
    """Stored trials: route to when written (read without the store's lock)."""
    try:
        with sqlite3.connect(f"file:{out / 'trials.sqlite'}?mode=ro", uri=True) as db:
            return dict(db.execute("SELECT route, created_at FROM trials"))
    except sqlite3.Error:
        return {}
