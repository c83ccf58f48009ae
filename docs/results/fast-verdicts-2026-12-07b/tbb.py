"""OpenVINO keeps the TBB partitioner a cached blob was compiled with (2026.4.1).

Prints (LOADED_FROM_CACHE, TBB_PARTITIONER, ENABLE_CPU_PINNING) for PP-OCRv4 det compiled
with a cache folder: the default, then AUTO, then pinning off (both imports of the first
blob); then AUTO compiled without the cache. On 2026-12-07: (False, STATIC, True), (True,
STATIC, True), (True, STATIC, False), AUTO: the import applied pinning, not AUTO.
"""

import sys
import tempfile

import openvino as ov

core = ov.Core()
path = sys.argv[1]  # ch_PP-OCRv4_det_infer.onnx
folder = tempfile.mkdtemp()


def compiled(config: dict[str, str], cache: bool = True) -> ov.CompiledModel:
    model = core.read_model(path)
    model.reshape({"x": [1, 3, 320, 320]})
    extra = {"CACHE_DIR": folder} if cache else {}
    return core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", **extra, **config})


for config in ({}, {"TBB_PARTITIONER": "AUTO"}, {"ENABLE_CPU_PINNING": "NO"}):
    c = compiled(config)
    print(c.get_property("LOADED_FROM_CACHE"), c.get_property("TBB_PARTITIONER"),
          c.get_property("ENABLE_CPU_PINNING"))
print(compiled({"TBB_PARTITIONER": "AUTO"}, cache=False).get_property("TBB_PARTITIONER"))
