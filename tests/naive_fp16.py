"""A test seasoning: fp16 without its range analysis, to make candidates that overflow."""

from __future__ import annotations

from dataclasses import replace

from routetune.passes.precision.mixed import Fp16
from routetune.passes.precision.ranges import Ranges


class NaiveFp16(Fp16):
    """fp16 without its range analysis: everything the spec admits runs in float16."""

    info = replace(Fp16.info, name="naive-fp16", conflicts=frozenset())

    def _decide(self, graph, ranges, no_kernel, schemas):  # noqa: ANN001, ANN202
        return super()._decide(graph, Ranges(), no_kernel, schemas)
