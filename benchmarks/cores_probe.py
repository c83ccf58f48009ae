"""Does this machine's second core keep up? Two-thread against one-thread ONNX Runtime.

Usage:

    python benchmarks/cores_probe.py [--seconds 80] [--example ppocr-det]

One process opens the example's model twice on ONNX Runtime's CPU provider, once with
its default intra-op threads (one per core) and once with one thread, and alternates
them in blocks of 1 s (the first run of each block not counted) on one fixed input.
Each line gives both blocks' median latency (ms) and their ratio. On a machine whose
cores run in parallel the two-thread figure stays put; on the 2-vCPU VM of
docs/benchmarks.md it jumps between two levels for stretches of tens of seconds while
the one-thread figure does not move, with no other process running and no steal time
reported: the host, not this machine, decides whether the second core is there. A
verdict about threads measured in one state does not hold in the other.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from routetune.feeds.examples import fetch, get_example


def session(path: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0: ONNX Runtime's default, one per core
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def block_ms(s: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> float:
    """Median latency (ms) of the runs in one block of `seconds`, the first not counted."""
    s.run(None, feed)
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        s.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=80.0)
    parser.add_argument("--example", default="ppocr-det")
    args = parser.parse_args()
    example = get_example(args.example)
    path = str(fetch(args.example))
    both, one = session(path, 0), session(path, 1)
    name = both.get_inputs()[0].name
    shape = example.shapes[name]
    feed = {name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    for s in (both, one):
        for _ in range(3):
            s.run(None, feed)
    start = time.time()
    print(f"{args.example} {shape}, onnxruntime {ort.__version__}: median ms per 1 s block")
    while time.time() - start < args.seconds:
        default, single = block_ms(both, feed, 1.0), block_ms(one, feed, 1.0)
        print(f"{time.time() - start:6.1f} s  default threads {default:6.2f} ms  "
              f"1 thread {single:6.2f} ms  ratio {default / single:.2f}", flush=True)


if __name__ == "__main__":
    main()
