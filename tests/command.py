"""The ``routetune`` command, run in this process or as a real subprocess.

`routetune` calls the command line's entry point, `routetune.cli.main`, in this
process: the same parsing, the same one-line errors and exit codes, without the 1-3 s
a new Python process spends importing ONNX. `routetune_script` runs ``python -m
routetune`` in a subprocess, for what only a process shows: the script as installed,
signals, what libraries write to file descriptors 1 and 2, the environment.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from routetune.cli import main


@dataclass(frozen=True)
class Done:
    """What a command did: its exit code and what it printed (as `subprocess`'s)."""

    returncode: int
    stdout: str
    stderr: str


def routetune(*args: str) -> Done:
    """Run ``routetune ARGS`` through `routetune.cli.main` in this process.

    Standard output and error are Python's (``sys.stdout``, ``sys.stderr``); the
    signal handlers the command installs are put back afterwards.
    """
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return Done(code, out.getvalue(), err.getvalue())


def routetune_script(*args: str, timeout: float = 300, cwd: Path | None = None,
                     **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m routetune ARGS`` in a subprocess, with `env` added to this one's."""
    return subprocess.run([sys.executable, "-m", "routetune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env={**os.environ, **env})


def without_root_rights(*args: str) -> list[str]:
    """`args` run without root's right to write anywhere when this is root, else as is.

    Root keeps its user id, so it still reads a venv in its own home (as nobody, uid
    65534, it could not), and loses the capabilities that let it write a read-only
    folder (``CAP_DAC_OVERRIDE`` and its kin, dropped from the bounding set by
    ``setpriv``).
    """
    if os.geteuid() != 0:
        return list(args)
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to drop the rights with")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *args]
