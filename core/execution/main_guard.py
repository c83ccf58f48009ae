"""Whether worker processes can start from this program's main script.

Worker processes are started with multiprocessing's *spawn* method: each runs the main
script again, as module ``__mp_main__``, before it does anything else (Python's
"Safe importing of main module" rule, in the multiprocessing documentation's
programming guidelines). A script that calls `routetune.tune` outside an
``if __name__ == "__main__":`` block therefore starts a second search in every worker,
and a script read from standard input cannot be run again at all. Both end in a
broken pool. `check_main_script` finds both before a worker starts; `refuse_in_worker`
stops a worker that runs such a script anyway, with one line instead of a traceback.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from pathlib import Path

from routetune.errors import UsageError

GUARD = 'if __name__ == "__main__":'
FIX = (f"put the call under `{GUARD}` (worker processes run the script again), "
       "or pass in_process=True")


def check_main_script() -> None:
    """Refuse a main script that worker processes cannot run again.

    Raises:
        UsageError: The script calls ``tune`` at its top level, outside the guard, or
            was read from standard input (``python -``), which no worker can read.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None)
    if spec is not None or path is None:  # python -m (routetune's CLI), -c, or a REPL
        return
    if not Path(path).is_file():
        raise UsageError(f"{path}: the script that calls routetune.tune was read from "
                         "standard input, which worker processes cannot read again; save it "
                         f"to a file with the call under `{GUARD}`, or pass in_process=True")
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return  # Python ran it, so this is a reading problem; the workers will say
    callers = _callers_of_tune(tree)
    for node in tree.body:
        if _guarded(node) or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                        | ast.ClassDef | ast.Import | ast.ImportFrom):
            continue
        call = next((c for c in ast.walk(node) if isinstance(c, ast.Call)
                     and _name(c.func) in callers), None)
        if call is not None:
            via = "" if _name(call.func) == "tune" else f" (through {_name(call.func)}())"
            raise UsageError(f"{path}:{call.lineno}: routetune.tune is called{via} outside "
                             f"`{GUARD}`; {FIX}")


def _callers_of_tune(tree: ast.Module) -> set[str]:
    """``tune`` and the script's top-level functions that call it, directly or not."""
    calls = {node.name: {_name(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
             for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    callers = {"tune"}
    while grown := {name for name, called in calls.items()
                    if name not in callers and called & callers}:
        callers |= grown
    return callers


def refuse_in_worker() -> None:
    """Stop at once, with one line, if this is a worker running the main script again."""
    main = sys.modules.get("__main__")
    if multiprocessing.parent_process() is not None and getattr(
            main, "__name__", None) == "__mp_main__":
        path = getattr(main, "__file__", "the main script")
        sys.stderr.write(f"routetune: error: {path}: routetune.tune called again in a worker "
                         f"process; {FIX}\n")
        sys.stderr.flush()
        os._exit(2)


def _guarded(node: ast.stmt) -> bool:
    """Whether `node` is ``if __name__ == "__main__":``."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    parts = [node.test.left, *node.test.comparators]
    return any(isinstance(p, ast.Name) and p.id == "__name__" for p in parts) and any(
        isinstance(p, ast.Constant) and p.value == "__main__" for p in parts)


def _name(func: ast.expr) -> str | None:
    """``tune`` for ``tune(...)`` and ``routetune.tune(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None
