"""Engines that turn on flush-to-zero keep it to themselves (real ONNX Runtime, OpenVINO).

Each case runs in a subprocess: a leak is exactly what is tested, and it would otherwise
change every later test in this process (hypothesis refuses floats under flush-to-zero).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from routetune.timing.float_env import FloatEnv, contained, flushes_denormals

HERE = Path(__file__).parents[1]  # tests/: graphs.py, for the script

SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[3])
from graphs import product
from routetune.timing.float_env import flushes_denormals
from routetune.plugin_manager import load_registry
from routetune.candidate.artifacts import build_engine, open_engine

backend_name, key = sys.argv[1], sys.argv[2]
work = Path(sys.argv[4])
model = product(work / "m.onnx")
backend = load_registry().backend(backend_name)(None)
settings = backend.full_settings({key: json.loads(sys.argv[5])})
feed = {"a": np.full((1, 8), 1e-40, np.float32), "b": np.ones((1, 8), np.float32)}
seen = {"before": flushes_denormals()}
if sys.argv[6] == "unguarded":  # what the search did before: the first build leaks
    backend.build(model, settings, work)
    print(json.dumps({"unguarded": flushes_denormals()}))
    sys.exit()
engine = build_engine(backend, model, settings, work, "", "")
seen["after_build"] = flushes_denormals()
with open_engine(backend, engine) as runner:
    seen["engine_out"] = float(runner.infer(feed)["y"].max())
    runner.prepare(feed)()
    seen["after_run"] = flushes_denormals()
plain = backend.build(model, backend.full_settings({}), work)  # the base route after it
with open_engine(backend, plain) as runner:
    seen["base_out"] = float(runner.infer(feed)["y"].max())
print(json.dumps(seen))
"""

CASES = {
    # ort-denormal-as-zero
    "onnxruntime": ("onnxruntime.config.session.set_denormal_as_zero", "1"),
    # ov-denormals
    "openvino": ("openvino.CPU_DENORMALS_OPTIMIZATION", "YES"),
}


@pytest.mark.parametrize("backend", sorted(CASES))
def test_an_engine_that_flushes_denormals_does_so_only_inside_its_own_calls(
        backend: str, tmp_path: Path) -> None:
    key, value = CASES[backend]
    seen: dict[str, object] = {}
    for mode in ("unguarded", "guarded"):  # each compiles, with a cache of its own
        work = tmp_path / mode
        work.mkdir()
        env = {**os.environ, "ROUTETUNE_CACHE": str(work / "cache")}
        done = subprocess.run([sys.executable, "-c", SCRIPT, backend, key, str(HERE),
                               str(work), json.dumps(value), mode],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.update(json.loads(done.stdout.splitlines()[-1]))
    assert seen["unguarded"] is True  # the engine does set it in the calling thread
    assert seen["engine_out"] == 0.0  # and computes with it, guarded or not
    assert seen["base_out"] == pytest.approx(1e-40)  # the next engine does not
    assert not seen["before"] and not seen["after_build"] and not seen["after_run"]


def test_contained_restores_the_environment_and_reports_what_changed() -> None:
    tiny = np.array([1e-40], np.float32)
    ours = FloatEnv.current()
    assert ours is not None and not flushes_denormals()
    with contained() as left:
        pass
    assert left.env is None
    # a block that changes the rounding mode only: kept out, and not reported (it does
    # not change how denormals are treated)
    import ctypes
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    with contained() as left:
        libm.fesetround(0xC00)  # FE_TOWARDZERO on x86-64
    assert left.env is None and libm.fegetround() == 0  # FE_TONEAREST again
    assert float((tiny * np.float32(1.0))[0]) > 0.0
