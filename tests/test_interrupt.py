"""Ctrl-C (SIGINT) on a real ``routetune tune`` subprocess: it stops cleanly and resumes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from graphs import conv_bn

from routetune.store import TrialStore

SEASONINGS = "ort-threads,fuse-bn-into-conv,fold-constants,ort-opt-level,ort-no-spinning"


def start(model: Path, out: Path, seasonings: str = SEASONINGS) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "routetune", "tune", str(model), "--shapes", "x:1x3x32x32",
         "--output", str(out), "--seasonings", seasonings, "--search", "exhaustive",
         "--max-depth", "3", "--min-runs", "5", "--min-time", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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
    proc = start(model, out)
    wait_for(out, n, proc)
    proc.send_signal(signal.SIGINT)
    return proc


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return conv_bn(tmp_path / "m.onnx")


def test_ctrl_c_writes_the_best_so_far_and_the_same_command_resumes(model: Path,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = interrupt_after(model, out, 3)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    text = " ".join(stdout.split())
    assert "stopped early: interrupted (Ctrl-C): no new trials" in text
    assert "the best so far stands" in text
    shown = int(text.split(" trials: ")[0].split()[-1])
    assert shown >= 3  # every trial stored before the Ctrl-C, from the batch in flight too
    assert "winner: " in text and "Traceback" not in stderr
    assert (out / "winner.json").exists() and (out / "report.html").exists()
    before = stored(out)
    again = start(model, out)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
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


def test_a_second_ctrl_c_stops_at_once_and_the_store_stays_consistent(model: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = interrupt_after(model, out, 2)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 30
    assert "Traceback" not in stderr
    conn = sqlite3.connect(out / "trials.sqlite")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    TrialStore.open(out / "trials.sqlite").close()


def table(out: Path) -> set[tuple[str, str]]:
    rows = sqlite3.connect(out / "trials.sqlite").execute("SELECT route, status FROM trials")
    return set(rows.fetchall())


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
    for _ in range(3):
        proc = start(model, killed, small)
        wait_for(killed, stored(killed) + 1, proc)
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere inside a build or a measurement
        proc.kill()
        proc.wait()
        conn = sqlite3.connect(killed / "trials.sqlite")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
    last = start(model, killed, small)
    stdout, stderr = last.communicate(timeout=600)
    assert last.returncode == 0, stderr
    assert table(killed) == table(whole)
    assert (killed / "winner.json").exists()
