"""The workers' inputs travel in memory over an authenticated socket, never as a file."""

from __future__ import annotations

import threading
from multiprocessing.context import AuthenticationError
from pathlib import Path

import numpy as np
import pytest
from graphs import conv_bn

from routetune.candidate.records import TrialInputs
from routetune.execution.handoff import Handoff, receive
from routetune.judging.accuracy import parse_accuracy
from routetune.model.loading import prepare
from routetune.registry import Registry


def inputs(tmp_path: Path, registry: Registry) -> TrialInputs:
    model = prepare(conv_bn(tmp_path / "m.onnx", batch=1))
    feed = {"x": np.ones((1, 3, 32, 32), np.float32)}
    return TrialInputs(model, "onnxruntime", None, (feed,), ({"y": np.zeros(1)},),
                       parse_accuracy("cos>=0.99", registry, ["y"]), tmp_path,
                       model.data)


def test_a_worker_waits_for_the_inputs_and_gets_them_in_memory(
        tmp_path: Path, registry: Registry) -> None:
    handoff = Handoff()
    got: list[TrialInputs] = []
    worker = threading.Thread(target=lambda: got.append(receive(handoff.address, handoff.key)))
    worker.start()  # connects before the inputs exist, as a warmed-up worker does
    given = inputs(tmp_path, registry)
    handoff.give(given)
    worker.join(10)
    later = receive(handoff.address, handoff.key)  # a worker started after a crash
    handoff.close()
    assert got and got[0].base_data == given.base_data and later.outdir == tmp_path
    np.testing.assert_array_equal(got[0].feeds[0]["x"], given.feeds[0]["x"])
    assert not list(tmp_path.rglob("*.pkl")) and not Path(handoff.address).exists()


def test_a_process_without_the_key_gets_nothing(tmp_path: Path, registry: Registry) -> None:
    handoff = Handoff()
    handoff.give(inputs(tmp_path, registry))
    with pytest.raises(AuthenticationError):
        receive(handoff.address, b"x" * 32)
    assert receive(handoff.address, handoff.key).backend == "onnxruntime"  # still serving
    handoff.close()


def test_closing_before_the_inputs_ends_a_waiting_worker() -> None:
    handoff = Handoff()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            receive(handoff.address, handoff.key)
        except BaseException as e:  # noqa: BLE001 - what the worker reports per trial
            errors.append(e)

    worker = threading.Thread(target=wait)
    worker.start()
    handoff.close()
    worker.join(10)
    assert not worker.is_alive() and isinstance(errors[0], (EOFError, OSError))
