"""The pip line that adds one of routetune's extras to this install of it.

A message about a missing optional dependency names the line that installs it. For a
routetune installed from PyPI that is ``pip install 'routetune[openvino]'``. From a clone
(the README's ``pip install -e ".[test]"``) that line would fetch whatever PyPI holds
under the name ``routetune``, not this tree, so the line names the tree instead:
``pip install -e '/path/to/clone[openvino]'``; from a folder, archive or repository
installed without ``-e``, its address as pip recorded it (``direct_url.json``, the
Python Packaging Authority's "Recording the Direct URL Origin of installed
distributions" specification), as a direct reference (PEP 508):
``pip install 'routetune[openvino] @ file:///path/to/clone'``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from pathlib import Path

DISTRIBUTION = "routetune"


def pip_install(extra: str) -> str:
    """The command that installs routetune's `extra` (``openvino``) here, in one line.

    Args:
        extra: An extra of pyproject.toml's ``[project.optional-dependencies]``.

    Returns:
        ``pip install -e '/path/to/clone[extra]'`` for an editable install, or where
        routetune runs from its source tree; ``pip install 'routetune[extra] @ URL'``
        where pip recorded another origin (a folder, an archive, a repository at a
        commit); else ``pip install 'routetune[extra]'``.
    """
    recorded = _recorded()
    if recorded is not None:
        url, editable = recorded
        if editable and url.startswith("file://"):
            return f"pip install -e '{url.removeprefix('file://')}[{extra}]'"
        return f"pip install '{DISTRIBUTION}[{extra}] @ {url}'"
    tree = source_tree()
    if tree is not None:
        return f"pip install -e '{tree}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


@functools.cache
def source_tree() -> Path | None:
    """The clone routetune runs from (where its pyproject.toml is), or None.

    The package (this module's folder) is the tree's ``core/``, installed as
    ``routetune``; an installed wheel has no pyproject.toml beside its folder.
    """
    root = Path(__file__).resolve().parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DISTRIBUTION}"' in text else None


def _recorded() -> tuple[str, bool] | None:
    """Where pip installed routetune from, as pip takes it, and whether it is editable.

    Read from ``direct_url.json``; None for an install from an index (which records
    none) or a file that does not say.
    """
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        found = json.loads(text) if text else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("url"), str):
        return None
    url: str = found["url"]
    vcs = found.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        commit = vcs.get("commit_id")
        url = f"{vcs['vcs']}+{url}" + (f"@{commit}" if isinstance(commit, str) else "")
    dir_info = found.get("dir_info")
    return url, isinstance(dir_info, dict) and dir_info.get("editable") is True
