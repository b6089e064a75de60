"""Model files to ONNX: loading, tracing with dynamic dims, targets, atomic saving, the export-time check."""
