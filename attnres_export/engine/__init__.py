"""TensorRT engines: profiles, preflight, build, manifest and benchmark (TensorRT itself is imported lazily)."""
