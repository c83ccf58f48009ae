from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import routetune
from routetune.install import pip_install

REPO = Path(__file__).resolve().parents[1]
ASK = "from routetune.install import pip_install; print(pip_install('openvino'))"


def installed_as(site: Path, direct_url: dict[str, object] | None) -> str:
    """The line a routetune installed into `site` as pip would lay it out gives: the
    package as a wheel puts it (no pyproject.toml beside it), its dist-info with the
    `direct_url.json` pip records for an install that is not from an index."""
    shutil.copytree(REPO / "core", site / "routetune")
    info = site / "routetune-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: routetune\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True,
                         timeout=60, cwd=site, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_an_install_from_an_index_is_told_the_extra_by_name(tmp_path: Path) -> None:
    assert installed_as(tmp_path, None) == "pip install 'routetune[openvino]'"


def test_an_install_from_a_folder_or_a_repository_is_told_that_origin(tmp_path: Path) -> None:
    # pip's direct_url.json, as "Recording the Direct URL Origin" specifies it
    folder = installed_as(tmp_path / "a", {"url": "file:///src/routetune", "dir_info": {}})
    assert folder == "pip install 'routetune[openvino] @ file:///src/routetune'"
    git = installed_as(tmp_path / "b", {"url": "https://example.org/routetune.git",
                                        "vcs_info": {"vcs": "git", "commit_id": "0a1b2c"}})
    assert git == ("pip install 'routetune[openvino] @ "
                   "git+https://example.org/routetune.git@0a1b2c'")
    editable = installed_as(tmp_path / "c", {"url": "file:///home/me/routetune",
                                             "dir_info": {"editable": True}})
    assert editable == "pip install -e '/home/me/routetune[openvino]'"


def test_a_clone_is_told_to_install_the_extra_from_itself() -> None:
    if Path(routetune.__file__).resolve().parents[1] != REPO:
        pytest.skip("routetune is imported from an install, not from this clone")
    # never 'routetune[openvino]', which pip would fetch from PyPI instead of this tree
    assert pip_install("openvino") == f"pip install -e '{REPO}[openvino]'"
