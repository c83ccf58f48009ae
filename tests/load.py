"""A CPU load outside the test's process tree, as another user's job would be.

`routetune.timing.conditions` counts only processes outside the tuner's tree as foreign, so the
load is started through a double fork: its process is re-parented away from the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

BUSY = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
for _ in range({cores} - 1):
    if os.fork() == 0:
        break
os.write(1, b"%d\\n" % os.getpid())  # one write: lines never interleave
end = time.time() + {seconds}
while time.time() < end:
    pass
"""


@contextmanager
def foreign_load(cores: int = 2, seconds: float = 30.0) -> Iterator[list[int]]:
    """Keep `cores` CPU cores busy from processes outside this tree; their pids.

    The processes end after `seconds`, or when the block exits.
    """
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(cores=cores, seconds=seconds)],
                             stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids += [int(child.stdout.readline()) for _ in range(cores)]
        child.wait()
        time.sleep(0.3)  # let them get going
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
