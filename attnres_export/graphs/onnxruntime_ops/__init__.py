"""The ``onnxruntime`` target's rewrites (docs/onnxruntime-target.md): a graph's attention, experts, Kimi Delta
Attention, rotary and norms as ONNX Runtime's own ``com.microsoft`` fused ops, each rewrite one module."""
