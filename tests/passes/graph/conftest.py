"""Fixtures for the graph seasoning tests: a real model, and run/compare helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from routetune.plugins.onnxruntime.backend import OnnxRuntimeBackend
from routetune.seasoning import PassResult, RouteContext, RouteState, Seasoning


@pytest.fixture(scope="session")
def ppocr_cls_path(model_path: Callable[[str], Path]) -> Path:
    """The PP-OCR mobile v2.0 direction classifier, x f32[N,3,48,192] -> f32[N,2].

    Fetched by `routetune.feeds.examples` from the rapidocr-onnxruntime 1.4.4 wheel, sha256
    checked; the test skips when the wheel cannot be downloaded.
    """
    return model_path("ppocr-cls")


@dataclass
class Seasoned:
    """What running one seasoning on a model gave.

    Args:
        result: The seasoning's `PassResult`.
        graph: The rewritten graph (the very object the seasoning was handed).
        model: `graph` exported, after ``onnx.checker.check_model(full_check=True)``.
    """

    result: PassResult
    graph: gs.Graph
    model: onnx.ModelProto

    @property
    def ops(self) -> list[str]:
        """The op types of the rewritten main graph, in order."""
        return [node.op_type for node in self.model.graph.node]


def _season(cls: type[Seasoning], model: onnx.ModelProto) -> Seasoned:
    graph = gs.import_onnx(model)
    state = RouteState(graph=graph)
    result = cls()(state, RouteContext(backend=OnnxRuntimeBackend()))
    assert state.graph is graph
    exported = gs.export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    return Seasoned(result, graph, exported)


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run `model` once with ONNX Runtime on the CPU, every graph optimisation off."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return session.run(None, dict(feeds))


def _random_feeds(model: onnx.ModelProto, seed: int = 0, **shapes: tuple) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        dims = shapes.get(inp.name) or [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _assert_equivalent(
    original: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: Mapping, atol: float = 1e-5
) -> None:
    assert [i.name for i in rewritten.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in rewritten.graph.output] == [o.name for o in original.graph.output]
    expected, got = run_ort(original, feeds), run_ort(rewritten, feeds)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=atol)


@pytest.fixture
def season() -> Callable[[type[Seasoning], onnx.ModelProto], Seasoned]:
    """Run a seasoning class on a model as a route does: ``season(FoldConstants, model)``.

    Imports the model with onnx-graphsurgeon, calls the seasoning with the real ONNX
    Runtime backend in the context, exports the graph and runs the full ONNX checker.
    """
    return _season


@pytest.fixture
def random_feeds() -> Callable[..., dict]:
    """Seeded standard-normal float32 feeds: ``random_feeds(model, seed=0, x=(1, 3))``.

    Each input takes its declared static shape unless a keyword gives one by name.
    """
    return _random_feeds


@pytest.fixture
def assert_equivalent() -> Callable[..., None]:
    """``assert_equivalent(original, rewritten, feeds, atol=1e-5)``.

    Checks the input and output names, then runs both models with ONNX Runtime at
    ``ORT_DISABLE_ALL`` (so its own fusions cannot mask a bug) and compares every output
    with ``rtol=1e-5`` and `atol`.
    """
    return _assert_equivalent
