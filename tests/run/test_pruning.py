"""``--keep``: the candidate models left after a real search, and a resume that needs the
removed ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from graphs import conv_bn, matmul_chain
from quick import quick_spec

from routetune.candidate.artifacts import MODELS
from routetune.records.trial import Trial
from routetune.reporting.report import worst_error
from routetune.run.pruning import PREFIXES, accurate_front, kept_trials
from routetune.run.tuning import TuneResult, tune


def search(model: Path, out: Path, keep: str) -> TuneResult:
    return tune(quick_spec(model=model, shapes="x:1x3x32x32", output=out, keep=keep,
                           seasonings=("fuse-bn-into-conv", "ort-threads", "fp16",
                                       "fold-constants"),
                           search="exhaustive", max_depth=2))


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, TuneResult]:
    """A finished search that kept every candidate model."""
    root = tmp_path_factory.mktemp("keep")
    model = conv_bn(root / "m.onnx")
    result = search(model, root / "all", "all")
    return model, root / "all", result


def models(out: Path) -> set[str]:
    return {p.name for p in (out / MODELS).glob("*.onnx")}


def test_keep_all_removes_nothing(everything: tuple[Path, Path, TuneResult]) -> None:
    _, out, result = everything
    assert result.pruned is not None and result.pruned.files == 0
    named = {Path(t.artifact).name for t in result.trials if t.artifact}
    assert named <= models(out) and len(named) >= 4  # fp16, fuse-bn, fold, base graphs


@pytest.mark.parametrize("keep", ["front", "winner"])
def test_keep_front_or_winner_leaves_only_their_models_and_a_resume_still_works(
        everything: tuple[Path, Path, TuneResult], tmp_path: Path, keep: str) -> None:
    model, out, full = everything
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    result = search(model, copy, keep)  # every trial from the store; then pruned
    assert not result.fresh  # nothing measured again
    kept = kept_trials(result.trials, result.winner, keep)
    expected = {Path(t.artifact).name for t in kept if t.artifact}
    assert models(copy) == expected and not (copy / PREFIXES).exists()
    if keep == "front":
        assert {"base", result.winner.route} <= {t.route for t in kept}
        assert {t.route for t in accurate_front(result.trials)} <= {t.route for t in kept}
    else:
        assert [t.route for t in kept] == [result.winner.route]
    assert result.pruned is not None and result.pruned.files > 0
    assert result.pruned.bytes > 0 and result.pruned.kept == tuple(t.route for t in kept)

    again = search(model, copy, "all")  # resumed: the winner's check rebuilds if needed
    assert again.winner.route in {t.route for t in full.trials if t.status == "ok"}
    assert not again.fresh and (copy / "winner.onnx").exists()


def test_a_run_into_a_folder_that_holds_another_run_removes_none_of_its_models(
        everything: tuple[Path, Path, TuneResult], tmp_path: Path) -> None:
    """A new user tuned a second model into the first one's folder with ``--keep front``:
    its pruning removed the first run's candidate models, base route's included. Each
    run prunes only its own; tried both ways round."""
    model, out, _ = everything
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    first = models(copy)  # --keep all: every candidate of the conv_bn run
    other = tune(quick_spec(model=matmul_chain(tmp_path / "mm.onnx", depth=2, width=32,
                                               batch=4),
                            output=copy, keep="front", seasonings=("fp16", "ort-threads"),
                            search="exhaustive", max_depth=1))
    assert first < models(copy)  # its own kept models added, none of the first's removed
    its_own = {Path(t.artifact).name for t in kept_trials(other.trials, other.winner, "front")
               if t.artifact}
    assert its_own <= models(copy)

    again = search(model, copy, "winner")  # the first model again, resumed, --keep winner
    assert not again.fresh and its_own <= models(copy)
    assert again.pruned is not None and again.pruned.files > 0  # its own did go


def test_the_front_is_the_accurate_trials_no_other_beats_on_both(
        everything: tuple[Path, Path, TuneResult]) -> None:
    _, _, result = everything
    front = {t.route for t in accurate_front(result.trials)}
    measured = [t for t in result.trials if t.status == "ok" and t.latency and t.base_latency]
    assert front and front <= {t.route for t in measured}

    def point(t: Trial) -> tuple[float, float]:
        return worst_error(t) or 0.0, t.relative.p50

    def beats(o: Trial, t: Trial) -> bool:
        return point(o) != point(t) and all(a <= b for a, b in zip(point(o), point(t), strict=True))

    for t in measured:
        on_front = t.route in front
        assert on_front != any(beats(o, t) for o in measured) or (
            not on_front and any(point(o) == point(t) for o in measured if o.route in front))
