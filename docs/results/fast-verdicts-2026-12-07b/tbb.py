import openvino as ov, tempfile
core = ov.Core()
path = "/root/.cache/routetune/models/rapidocr-onnxruntime-1.4.4/ch_PP-OCRv4_det_infer.onnx"
d = tempfile.mkdtemp()
def comp(cfg):
    m = core.read_model(path); m.reshape({"x": [1,3,320,320]})
    c = core.compile_model(m, "CPU", {"PERFORMANCE_HINT": "LATENCY", "CACHE_DIR": d, **cfg})
    return c.get_property("LOADED_FROM_CACHE"), c.get_property("TBB_PARTITIONER"), c.get_property("ENABLE_CPU_PINNING")
print(comp({}))
print(comp({"TBB_PARTITIONER": "AUTO"}))
print(comp({"ENABLE_CPU_PINNING": "NO"}))
m = core.read_model(path); m.reshape({"x": [1,3,320,320]})
print(core.compile_model(m, "CPU", {"PERFORMANCE_HINT": "LATENCY", "TBB_PARTITIONER": "AUTO"}).get_property("TBB_PARTITIONER"))
