"""Running a TensorRT engine on the GPU: CuPy buffers, ``execute_async_v3``, CUDA events.

Each input set is copied to device buffers once (`TensorRtRunner.prepare`); a timed run
is the enqueue alone, bracketed by CUDA events on the runner's stream. With
``cuda_graph`` the enqueue is captured once per input set (after one plain enqueue, as
TensorRT's best-practices guide asks, so that shape-dependent setup is done) and each
run is one graph launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from routetune.backend import Feed, Runner
from routetune.feeds.profile import ShapeProfile
from routetune.plugins.cuda import event_timed


class TensorRtRunner(Runner):
    """An execution context of one engine, on its own CuPy stream.

    Args:
        trt: The TensorRT module.
        runtime: The ``trt.Runtime`` that deserialized the engine (kept alive).
        engine: The ``ICudaEngine``.
        profile: The engine's optimisation profile (for messages).
        cuda_graph: Whether timed runs replay a captured CUDA graph.
    """

    host_copies = True

    def __init__(self, trt: Any, runtime: Any, engine: Any, profile: ShapeProfile,
                 cuda_graph: bool) -> None:
        import cupy

        self.trt, self.runtime, self.engine = trt, runtime, engine
        self.profile = profile
        self.cuda_graph = cuda_graph
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self._keep: list[Any] = []

    def _bind(self, feed: Feed) -> dict[str, Any]:
        """Copy `feed` to new device buffers, allocate outputs, set every address."""
        import cupy

        buffers: dict[str, Any] = {}
        for name in self.inputs:
            host = np.ascontiguousarray(np.asarray(feed[name]).astype(self.dtypes[name]))
            buffers[name] = cupy.asarray(host)
            if not self.context.set_input_shape(name, host.shape):
                raise ValueError(f"input '{name}' shape {host.shape} is outside the engine's "
                                 f"optimisation profile {self.profile}")
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"output '{name}' has a data-dependent shape {shape}; "
                                   "routetune does not bind an output allocator yet")
            buffers[name] = cupy.empty(shape, self.dtypes[name])
        for name, buf in buffers.items():
            self.context.set_tensor_address(name, buf.data.ptr)
        self._keep.append(buffers)
        return buffers

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.ptr):
            raise RuntimeError("execute_async_v3 returned False (see TensorRT's log)")

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once host to host; outputs by name as host arrays."""
        import cupy

        buffers = self._bind(feed)
        self._enqueue()
        self.stream.synchronize()
        return {n: cupy.asnumpy(buffers[n]) for n in self.outputs}

    def prepare(self, feed: Feed) -> Callable[[], None]:
        """Bind `feed` on the device; return the enqueue (or a captured graph's launch).

        The call re-sets the tensor addresses first (cheap host calls), so prepared
        calls of several input sets can alternate.
        """
        buffers = self._bind(feed)
        context = self.context

        def bind() -> None:
            for name, buf in buffers.items():
                context.set_tensor_address(name, buf.data.ptr)

        if not self.cuda_graph:
            def call() -> None:
                bind()
                self._enqueue()
            return call
        self._enqueue()  # one plain run before capture
        self.stream.synchronize()
        self.stream.begin_capture()
        self._enqueue()
        graph = self.stream.end_capture()
        self._keep.append(graph)
        stream = self.stream
        return lambda: graph.launch(stream)

    def prepare_end_to_end(self, feed: Feed) -> Callable[[], None]:
        """A call that also copies the inputs in and the outputs out (host to host)."""
        import cupy

        buffers = self._bind(feed)
        hosts = {n: np.ascontiguousarray(np.asarray(feed[n]).astype(self.dtypes[n]))
                 for n in self.inputs}
        outs = {n: cupy.cuda.alloc_pinned_memory(buffers[n].nbytes) for n in self.outputs}
        context, stream = self.context, self.stream

        def call() -> None:
            for name, buf in buffers.items():
                context.set_tensor_address(name, buf.data.ptr)
            for name, host in hosts.items():
                buffers[name].set(host, stream=stream)
            self._enqueue()
            for name in self.outputs:
                buffers[name].get(stream=stream, out=np.frombuffer(
                    outs[name], self.dtypes[name], buffers[name].size).reshape(
                        buffers[name].shape))
        return call

    def timed(self, call: Callable[[], None]) -> float:
        """Run `call` between two CUDA events on the runner's stream; their gap in ms."""
        return event_timed(self.stream, call)

    def synchronize(self) -> None:
        """Wait for the runner's stream."""
        self.stream.synchronize()

    def close(self) -> None:
        """Free the buffers, graphs and the execution context."""
        self._keep.clear()
        self.context = None
