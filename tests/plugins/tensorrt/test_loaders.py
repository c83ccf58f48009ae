"""The TensorRT build's loaders, composed by hand as the backend composes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorrt_helpers import PROFILE, TRT, conv, needs_trt, settings

from routetune.errors import BuildError
from routetune.plugins.tensorrt.backend import TensorRtBackend
from routetune.plugins.tensorrt.loaders import (
    ConfigFromSettings,
    NetworkFromOnnx,
    PlanCache,
    PlanFromNetwork,
    TimingCacheFile,
)

pytestmark = needs_trt


def test_each_loader_makes_one_thing_and_the_plan_is_their_composition(
        tmp_path: Path) -> None:
    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    parsed = NetworkFromOnnx(TRT.module, model)()
    assert parsed.network.num_inputs == 1 and parsed.network.get_input(0).name == "x"
    config = ConfigFromSettings(TRT.module, settings(backend, builder_optimization_level=1))(
        parsed)
    assert config.builder_optimization_level == 1 and config.num_optimization_profiles == 1
    cache = TimingCacheFile(tmp_path / "engines" / "timing.cache", str(TRT), gpu=False)
    plan = PlanFromNetwork(NetworkFromOnnx(TRT.module, model),
                           ConfigFromSettings(TRT.module, settings(backend)), cache)()
    assert len(plan) > 1000 and cache.path.stat().st_size > 0  # the cache was merged
    missing = ConfigFromSettings(TRT.module, settings(backend) | {"tensorrt.profile": ""})
    with pytest.raises(BuildError, match="input 'x' dimension 0 is dynamic"):
        PlanFromNetwork(NetworkFromOnnx(TRT.module, model), missing)()


def test_a_kept_plan_comes_back_only_for_the_same_source(tmp_path: Path) -> None:
    model = conv(tmp_path / "m.onnx")
    backend = TensorRtBackend(PROFILE)
    source = PlanCache.source_of(model, settings(backend), str(TRT))
    plans = PlanCache(tmp_path / "engines" / "k.plan", source)
    assert plans.get() is None
    plans.put(b"plan bytes")
    assert plans.get() == b"plan bytes"
    other = PlanCache.source_of(model, settings(backend, tf32=False), str(TRT))
    assert other != source and PlanCache(plans.path, other).get() is None
    assert PlanCache(plans.path, PlanCache.source_of(model, settings(backend), "TensorRT 99")
                     ).get() is None  # another TensorRT: built again
