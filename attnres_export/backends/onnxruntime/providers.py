"""The ONNX Runtime execution providers a check can run an ONNX on, by the name the command line takes
(``--ort-provider``); kept apart from the runners so that the choices are listed without importing onnxruntime."""

PROVIDERS = ("cpu", "cuda")
"""``cpu``: CPUExecutionProvider; ``cuda``: CUDAExecutionProvider (onnxruntime-gpu), CPU for what it lacks."""
