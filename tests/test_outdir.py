from __future__ import annotations

from pathlib import Path

from routetune.outdir import move_aside
from routetune.store import Trial, TrialStore


def test_move_aside_never_overwrites_an_earlier_backup(tmp_path: Path) -> None:
    store = tmp_path / "trials.sqlite"
    backups = []
    for i in range(3):  # three --fresh runs within the same second
        s = TrialStore.open(store)
        s.add(Trial(f"f{i}", "m", "base", "b", "d", "s", "ok"))
        s.close()
        backups.append(move_aside(store))
    assert len(set(backups)) == 3 and not store.exists()
    kept = sorted(t.fingerprint for b in backups for t in TrialStore.open(b).trials())
    assert kept == ["f0", "f1", "f2"]


def test_move_aside_without_a_store(tmp_path: Path) -> None:
    assert move_aside(tmp_path / "trials.sqlite") is None
