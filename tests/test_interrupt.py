"""Ctrl-C (SIGINT) on a real ``routetune tune`` subprocess: it stops cleanly and resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from graphs import conv_bn, wasteful
from plugin_packages import installed

from routetune.records.store import TrialStore
from routetune.signals import SAME_PRESS_S

SEASONINGS = "ort-threads,fuse-bn-into-conv,fold-constants,ort-opt-level,ort-no-spinning"


def start(model: Path, out: Path, seasonings: str = SEASONINGS, *flags: str,
          **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "routetune", "tune", str(model), "--shapes", "x:1x3x32x32",
         "--output", str(out), "--seasonings", seasonings, "--search", "exhaustive",
         "--max-depth", "3", "--min-runs", "5", "--min-time", "0.1", "--confirm-repeats", "1",
         "--busy-machine", "ignore", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


BOUNDED = ("--max-trials", "12")
"""A search long enough to stop in its middle, short enough to resume to its end."""


def stored(out: Path) -> int:
    try:
        with sqlite3.connect(f"file:{out / 'trials.sqlite'}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


def wait_for(out: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while stored(out) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no trials stored in 120 s"
        time.sleep(0.1)


def interrupt_after(model: Path, out: Path, n: int) -> subprocess.Popen[str]:
    """Start a search, and send it SIGINT once `n` trials are stored."""
    proc = start(model, out, SEASONINGS, *BOUNDED)
    wait_for(out, n, proc)
    proc.send_signal(signal.SIGINT)
    return proc


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return conv_bn(tmp_path / "m.onnx")


@pytest.mark.slow
def test_ctrl_c_writes_the_best_so_far_and_the_same_command_resumes(model: Path,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = interrupt_after(model, out, 3)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    text = " ".join(stdout.split())
    assert "stopped early: interrupted (Ctrl-C): no new trials" in text
    assert "the best so far stands" in text
    # the progress line (on stderr) says it stopped, not that the search is done
    assert "stopped (Ctrl-C); best so far " in stderr and "done; winner" not in stderr
    shown = int(text.split(" trials: ")[0].split()[-1])
    assert shown >= 3  # every trial stored before the Ctrl-C, from the batch in flight too
    assert "winner: " in text and "Traceback" not in stderr
    assert (out / "report.html").exists()
    # the winner file says it is the best so far, not the search's verdict
    assert json.loads((out / "winner.json").read_text())["stopped"].startswith(
        "interrupted (Ctrl-C): no new trials")
    before = stored(out)
    again = start(model, out, SEASONINGS, *BOUNDED)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
    assert (f"resumed: {before} of these trials came from the trial store (trials.sqlite), "
            "not run again" in " ".join(stdout.split()))
    after = sqlite3.connect(out / "trials.sqlite").execute(
        "SELECT count(*), count(DISTINCT fingerprint) FROM trials").fetchone()
    assert after[0] == after[1] > before  # nothing redone twice, the rest added


def test_sigterm_stops_like_ctrl_c_with_exit_143(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start(model, out)
    wait_for(out, 3, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "interrupted (SIGTERM): no new trials" in " ".join(stdout.split())
    assert (out / "report.html").exists() and "Traceback" not in stderr


def test_two_presses_within_a_second_are_one_and_keep_the_results(model: Path,
                                                                  tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of the group; key bounce sends two."""
    out = tmp_path / "out"
    proc = interrupt_after(model, out, 2)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "stopped early: interrupted (Ctrl-C)" in " ".join(stdout.split())
    assert (out / "winner.json").exists() and "Traceback" not in stderr


@pytest.mark.parametrize("delay_s", [0.8, 1.1, 1.4])
def test_ctrl_c_to_the_whole_group_while_workers_start_prints_one_line(
        model: Path, tmp_path: Path, delay_s: float) -> None:
    """What a terminal does: SIGINT to every process, twice, while workers are spawned.

    The workers start with SIGINT blocked (`signals.spawning_quietly`), so none prints a
    traceback; the search process says what it kept, once.
    """
    out = tmp_path / "out"
    proc = start(model, out, start_new_session=True)
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    said = [line for line in stderr.splitlines() if line.startswith("routetune:")]
    assert len(said) <= 1 and all("run the same command to resume" in s for s in said)


CHAOS_ENV: dict[str, str] = {}
"""The environment under which a process sees routetune-chaos (`slow`)."""


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The chaos package installed, and its `wasteful` model: ``chaos-drop-waste`` is
    exact and over 2x faster (so the winner is confirmed after a stop: seconds of
    work, three fresh processes), ``chaos-hang`` keeps the search busy until its trial
    times out."""
    with installed("routetune-chaos", tmp_path_factory.mktemp("chaos")) as env:
        CHAOS_ENV.update(env)
        yield wasteful(tmp_path_factory.mktemp("model") / "w.onnx")
        CHAOS_ENV.clear()


def start_slow(model: Path, out: Path, *wrapper: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*wrapper, sys.executable, "-m", "routetune", "tune", str(model), "--output", str(out),
         "--seasonings", "chaos-drop-waste,chaos-hang", "--search", "exhaustive",
         "--max-depth", "1", "--trial-timeout", "300", "--min-runs", "5", "--min-time",
         "0.3", "--busy-machine", "ignore"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, **CHAOS_ENV})


def routes(out: Path) -> set[str]:
    try:
        with sqlite3.connect(f"file:{out / 'trials.sqlite'}?mode=ro", uri=True) as conn:
            return {r for (r,) in conn.execute("SELECT route FROM trials")}
    except sqlite3.Error:
        return set()


@pytest.mark.slow
def test_timeout_s_int_stops_once_and_writes_the_results(slow: Path, tmp_path: Path) -> None:
    """GNU timeout signals the child, then its whole process group: one stop, not two."""
    out = tmp_path / "out"
    proc = start_slow(slow, out, "timeout", "--preserve-status", "-s", "INT", "25")
    stdout, stderr = proc.communicate(timeout=200)
    assert proc.returncode == 130, stderr
    assert {"base", "chaos-drop-waste"} <= routes(out)  # stored within the 25 s
    text = " ".join(stdout.split())
    assert "stopped early: interrupted (Ctrl-C): no new trials; cancelled 1 in flight" in text
    assert "winner: chaos-drop-waste" in text and (out / "report.html").exists()
    assert "Traceback" not in stderr and "stopped at once" not in stderr


def test_a_later_second_ctrl_c_stops_at_once_with_one_line(slow: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_slow(slow, out)
    deadline = time.monotonic() + 120
    while "chaos-drop-waste" not in routes(out):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # the winner's confirmation starts: seconds of work
    presses = 1  # a long C call in the main thread can delay the first press's handling,
    while presses < 5:  # so that a second one within SAME_PRESS_S of it counts as the same
        time.sleep(SAME_PRESS_S + 0.2)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        presses += 1
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
            break
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert stderr.splitlines()[-1] == ("routetune: stopped at once (Ctrl-C again); 2 trials "
                                       "stored; run the same command to resume")
    assert "Traceback" not in stderr and not (out / "winner.json").exists()
    conn = sqlite3.connect(out / "trials.sqlite")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM trials").fetchone()[0] == 2
    conn.close()
    TrialStore.open(out / "trials.sqlite").close()


def table(out: Path) -> set[tuple[str, str]]:
    rows = sqlite3.connect(out / "trials.sqlite").execute("SELECT route, status FROM trials")
    return set(rows.fetchall())


@pytest.mark.slow
def test_kill_9_at_random_points_resumes_to_the_same_final_table(model: Path,
                                                                 tmp_path: Path) -> None:
    """SIGKILL gives no chance to clean up: the trial in flight is lost and redone, the
    lock goes with the process, and every stored trial stays (one transaction each)."""
    import random

    small = "ort-threads,fuse-bn-into-conv,fold-constants"
    whole = tmp_path / "whole"
    done = start(model, whole, small)
    assert done.wait(timeout=600) == 0
    killed = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    for _ in range(3):
        proc = start(model, killed, small)
        before = stored(killed)
        deadline = time.monotonic() + 120
        while stored(killed) <= before and proc.poll() is None:  # one more trial, or done
            assert time.monotonic() < deadline, "no trial stored in 120 s"
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere inside a build or a measurement
        if proc.poll() is not None:  # the search ended first: nothing left to kill
            assert proc.wait() == 0, proc.communicate()
            break
        proc.kill()
        proc.wait()
        kills += 1
        conn = sqlite3.connect(killed / "trials.sqlite")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
    assert kills  # at least one search died mid-way
    last = start(model, killed, small)
    stdout, stderr = last.communicate(timeout=600)
    assert last.returncode == 0, stderr
    assert table(killed) == table(whole)
    assert (killed / "winner.json").exists()
