"""The ort-trt target: fused nodes move to domain trt.plugins with their attributes, and still run."""

from __future__ import annotations

import onnx
import pytest

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeCudaRunner, OnnxRuntimeRunner, cuda_provider_available
from attnres_export.errors import ParityError
from attnres_export.ops.onnx_nodes import attribute


def test_ort_trt_moves_every_fused_node_to_trt_plugins_keeping_attributes(artifacts):
    source = onnx.load(str(artifacts.tensorrt))
    converted = onnx.load(str(artifacts.ort_trt))
    fused = [n for n in source.graph.node if n.domain == "attnres"]
    moved = [n for n in converted.graph.node if n.domain == "trt.plugins"]
    assert fused and len(moved) == len(fused)
    assert not [n for n in converted.graph.node if n.domain == "attnres"]
    for before, after in zip(fused, moved, strict=True):
        assert after.op_type == before.op_type and list(after.input) == list(before.input)
        for name in ("eps", "plugin_version", "plugin_namespace"):
            assert attribute(after, name) == attribute(before, name)
    imports = {e.domain: e.version for e in converted.opset_import}
    assert imports.get("trt.plugins") == 1 and "attnres" not in imports


def test_ort_trt_onnx_runs_on_cpu_with_the_reference_ops(artifacts):
    import numpy as np

    runner = OnnxRuntimeRunner(artifacts.ort_trt)
    with runner:
        out = runner.infer({"input_ids": np.zeros((1, 3), dtype=np.int64)})
    assert runner.backend == "onnxruntime+ref-ops" and out["logits"].shape == (1, 3, 32)


@pytest.mark.skipif(cuda_provider_available(), reason="this machine has onnxruntime-gpu's CUDA provider")
def test_cuda_runner_without_onnxruntime_gpu_is_a_clear_parity_error(artifacts):
    with pytest.raises(ParityError, match="install onnxruntime-gpu"):
        OnnxRuntimeCudaRunner(artifacts.tensorrt)
