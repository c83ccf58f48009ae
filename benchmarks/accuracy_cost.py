"""What one accuracy measurement costs: `measure_accuracy` on a recogniser's outputs.

A candidate's accuracy pass compares its outputs with the FP32 reference's on every
validation input set, every registered metric over all sets and per set
(`routetune.judging.accuracy.measure_accuracy`). Here the outputs have the shape of
PP-OCRv4's recogniser example (32 input sets of float32[1, 40, 6625] softmax
probabilities), the candidate's off by a normal error of sd 1e-4; the figure is the
median of `--repeats` calls in one process, after one untimed call.

    python benchmarks/accuracy_cost.py [--sets 32] [--repeats 5]

Run it under two builds one after the other (PYTHONPATH pointing at the other's
package) to compare them side by side; docs/benchmarks.md gives the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import routetune
    from routetune.judging.accuracy import measure_accuracy
    from routetune.plugin_manager import load_registry

    registry = load_registry()
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((args.sets, 1, 40, 6625)).astype(np.float32) * 4
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    name = "softmax_11.tmp_0"
    refs = [{name: p} for p in probs]
    outs = [{name: (p + rng.normal(0, 1e-4, p.shape)).astype(np.float32)} for p in probs]
    tolerances = {name: (1e-3, 1e-3)}
    measure_accuracy(registry, outs, refs, tolerances)  # untimed: first-call costs
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        measured = measure_accuracy(registry, outs, refs, tolerances)
        times.append(time.perf_counter() - start)
    print(f"{routetune.__file__}: median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}, max {max(times):.3f}) over {args.repeats} calls; "
          f"cos {measured.metrics[name]['cos']:.9f}")


if __name__ == "__main__":
    main()
