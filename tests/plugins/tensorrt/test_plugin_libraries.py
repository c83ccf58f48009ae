"""``--plugin-library``: a real TensorRT-RTX builder loads the library before the parse,
and TensorRT's own refusal of it is one line, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensorrt_helpers import TRT, conv, needs_trt

from routetune.errors import BuildError
from routetune.plugins.tensorrt.loaders import NetworkFromOnnx

SOURCE = Path(__file__).parents[2] / "data" / "plugins" / "marker.c"

pytestmark = [needs_trt, pytest.mark.skipif(shutil.which("gcc") is None,
                                            reason="no gcc to build the test plugin library")]


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The marker plugin library (tests/data/plugins/marker.c), compiled here."""
    out = tmp_path_factory.mktemp("plugin") / "libmarker.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE)],
                   check=True, capture_output=True, timeout=120)
    return out


def _marks(path: Path) -> list[tuple[str, int]]:
    return [(name, int(pid)) for name, pid in
            (line.split() for line in path.read_text().splitlines())]


def test_the_builder_loads_the_library_before_the_parse(marker: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    marks = tmp_path / "marks.txt"
    monkeypatch.setenv("ROUTETUNE_TEST_PLUGIN_MARKS", str(marks))
    model = conv(tmp_path / "m.onnx")
    with pytest.raises(BuildError) as e:
        NetworkFromOnnx(TRT.module, model, (marker,))()
    assert f"refused the plugin library {marker}" in str(e.value)
    assert "No creator returned" in str(e.value)  # TensorRT's own words, captured
    assert _marks(marks) == [("setLoggerFinder", os.getpid()), ("getCreators", os.getpid())]
    parsed = NetworkFromOnnx(TRT.module, model)()  # without it, nothing is loaded
    assert parsed.network.num_inputs == 1 and len(_marks(marks)) == 2


def test_a_library_tensorrt_refuses_is_one_line_and_exit_2(marker: Path,
                                                           tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    model = conv(tmp_path / "m.onnx", [2, 3, 32, 32])
    env = {**os.environ, "ROUTETUNE_TEST_PLUGIN_MARKS": str(marks)}
    for backend, says in (("tensorrt", f"refused the plugin library {marker}"),
                          ("onnxruntime", "the onnxruntime backend loads no plugin libraries")):
        done = subprocess.run([sys.executable, "-m", "routetune", "tune", str(model),
                               "--backend", backend, "--output", str(tmp_path / backend),
                               "--plugin-library", str(marker)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("routetune: error: --plugin-library: ") and says in line, line
        assert not (tmp_path / backend / "trials.sqlite").exists()
    assert [name for name, _ in _marks(marks)] == ["setLoggerFinder", "getCreators"]


def test_a_build_in_a_worker_loads_the_run_s_plugin_libraries(marker: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """What a worker does: `use` the run's libraries (as `Candidate` does), then build."""
    from tensorrt_helpers import PROFILE, settings

    from routetune.libraries import PLUGINS, resolve, use
    from routetune.plugins.tensorrt.backend import TensorRtBackend

    marks = tmp_path / "marks.txt"
    monkeypatch.setenv("ROUTETUNE_TEST_PLUGIN_MARKS", str(marks))
    backend = TensorRtBackend(PROFILE)
    use(resolve([str(marker)], "--plugin-library", PLUGINS))
    try:
        with pytest.raises(BuildError, match="refused the plugin library"):
            backend.build(conv(tmp_path / "m.onnx"), settings(backend), tmp_path)
    finally:
        use(())
    assert [name for name, _ in _marks(marks)] == ["setLoggerFinder", "getCreators"]
