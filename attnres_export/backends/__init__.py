"""Runners behind one interface (``activate``, ``infer``, ``deactivate``): PyTorch, ONNX Runtime (with the
reference ops and the bfloat16 emulation, CPU or CUDA) and TensorRT, plus what loading each needs."""
