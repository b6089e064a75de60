"""attnres: export AttnRes and RealFormer models to ONNX and TensorRT, verified."""

__version__ = "0.1.0"
