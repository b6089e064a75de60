"""Every family's real with-past export (grouped K/V, a latent cache, KDA states) through ``attnres triton-repo`` and
``attnres serve``'s request limits: the config names each cache input and output with the dims and type the model's
``cache_inputs()`` gives, and the limits accept a prefill and a decode step of that cache in float32 and float16.
Slow: one export per family and dtype."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnres_export.models import load_checkpoint
from attnres_export.models.base import step_input_axes
from attnres_export.serve.dependencies import model_config_pb2
from attnres_export.serve.limits import RequestTensor, check_request, onnx_limits
from attnres_export.serve.repository import RepoOptions, write_repository
from attnres_export.serve.signature import onnx_signature
from tests.serve.conftest import NEEDS_CLIENT
from tests.serve.family_exports import FAMILIES, example_folder, export

pytestmark = [pytest.mark.slow, NEEDS_CLIENT]
TRITON = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}
WIRE = {"float32": ("FP32", np.float32), "float16": ("FP16", np.float16), "int64": ("INT64", np.int64)}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    folder = example_folder(request.param, out / "folder")
    return folder, load_checkpoint(folder)[0].with_past().cache_inputs(), out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_families_with_past_export_reaches_triton_and_the_limits_with_its_own_cache(family, dtype):
    from google.protobuf import text_format

    folder, cache, out = family
    path = export(folder, out / f"m.{dtype}.onnx", with_past=True, dtype=dtype)
    result = write_repository(RepoOptions(path, out / f"repo-{dtype}", "m"))
    config = text_format.Parse(result.config, model_config_pb2().ModelConfig())
    name_of = model_config_pb2().DataType.Name
    inputs = {t.name: (list(t.dims), name_of(t.data_type)) for t in config.input}
    outputs = {t.name: (list(t.dims), name_of(t.data_type)) for t in config.output}
    assert list(inputs) == list(step_input_axes(cache)) and config.max_batch_size == 8
    for entry in cache:
        expected = ([-1 if a == "past" else a for a in entry.axes[1:]],
                    TRITON[dtype if entry.dtype == "model" else entry.dtype])
        assert inputs[entry.name] == expected and outputs[entry.present] == expected
    graph = onnx.load(str(path), load_external_data=False)
    limits = onnx_limits("m", graph, onnx_signature(graph))
    rng = np.random.default_rng(0)
    for batch, seq, past in [(1, 7, 0), (3, 1, 9), (8, 2, 31)]:
        tensors = [RequestTensor("input_ids", "INT64", (batch, seq), rng.integers(0, 256, (batch, seq)).tobytes()),
                   RequestTensor("attention_mask", "INT64", (batch, past + seq),
                                 np.ones((batch, past + seq), np.int64).tobytes()),
                   RequestTensor("position_ids", "INT64", (batch, seq),
                                 np.tile(np.arange(past, past + seq), (batch, 1)).tobytes())]
        for entry in cache:
            wire, kind = WIRE[dtype if entry.dtype == "model" else entry.dtype]
            shape = tuple(batch if a == "batch" else past if a == "past" else a for a in entry.axes)
            tensors.append(RequestTensor(entry.name, wire, shape, np.zeros(shape, kind).tobytes()))
        check_request(limits, tensors)
