"""Every with-past cache layout the families declare (``cache_inputs()``: grouped keys and values at
``num_key_value_heads``, DeepSeek-V3's latent and rope key, Kimi Linear's KDA recurrent and conv states beside its
latent layers) reaches Triton with its own names, dims and dtypes: in ``triton-repo``'s config.pbtxt and in the
request limits of ``attnres serve``. The graphs carry the signature and metadata such an export writes; the
expected values come from the model's ``cache_inputs()`` alone. Cheap: tiny folders, no export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnres_export.models import load_checkpoint
from attnres_export.models.registry import for_example
from attnres_export.serve.dependencies import model_config_pb2
from attnres_export.serve.limits import RequestRefused, RequestTensor, check_request, onnx_limits
from attnres_export.serve.repository import RepoOptions, write_repository
from attnres_export.serve.signature import onnx_signature
from tests.serve.conftest import NEEDS_CLIENT
from tests.serve.models import cache_graph

FAMILIES = ("llama", "deepseek-v3", "kimi-linear")
"""One of each cache kind: grouped K/V (2 of 4 heads), a latent cache, KDA states with latent layers."""
TRITON = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}
WIRE = {"float32": np.float32, "float16": np.float16}


@pytest.fixture(scope="module", params=FAMILIES)
def cache(request, tmp_path_factory) -> list:
    family, hf_type = for_example(request.param)
    folder, _, _ = family.write_example_folder(hf_type, tmp_path_factory.mktemp(request.param) / "m", 0, 1, 2)
    model, _ = load_checkpoint(folder)
    return model.with_past().cache_inputs()


def held(entry, dtype: str) -> str:
    return dtype if entry.dtype == "model" else entry.dtype


@NEEDS_CLIENT
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_triton_repo_names_every_cache_input_and_output_with_its_dims_and_type(cache, dtype, tmp_path):
    from google.protobuf import text_format

    graph = cache_graph(tmp_path / "m.onnx", cache, dtype)
    result = write_repository(RepoOptions(graph, tmp_path / "repo", "m"))
    config = text_format.Parse(result.config, model_config_pb2().ModelConfig())
    names = model_config_pb2().DataType.Name
    inputs = {t.name: (list(t.dims), names(t.data_type)) for t in config.input}
    outputs = {t.name: (list(t.dims), names(t.data_type)) for t in config.output}
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    for entry in cache:
        dims = [-1 if a == "past" else a for a in entry.axes[1:]]
        assert inputs.pop(entry.name) == (dims, TRITON[held(entry, dtype)])
        assert outputs.pop(entry.present) == (dims, TRITON[held(entry, dtype)])
    assert inputs == {n: ([-1], "TYPE_INT64") for n in ("input_ids", "attention_mask", "position_ids")}
    assert outputs == {"logits": ([-1, 8], "TYPE_FP32")}


def feeds(cache, dtype: str, batch: int, seq: int, past: int, rng) -> list[RequestTensor]:
    """A request as a client sends it: ids, mask over past + seq, positions, every state at ``past`` positions."""
    tensors = [RequestTensor("input_ids", "INT64", (batch, seq), rng.integers(0, 8, (batch, seq)).tolist()),
               RequestTensor("attention_mask", "INT64", (batch, past + seq), [[1] * (past + seq)] * batch),
               RequestTensor("position_ids", "INT64", (batch, seq), [list(range(past, past + seq))] * batch)]
    for entry in cache:
        shape = tuple(batch if a == "batch" else past if a == "past" else a for a in entry.axes)
        kind = held(entry, dtype)
        tensors.append(RequestTensor(entry.name, "FP32" if kind == "float32" else "FP16", shape,
                                     rng.standard_normal(shape).astype(WIRE[kind]).tobytes()))
    return tensors


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_serve_accepts_a_prefill_and_decode_steps_of_the_cache_and_refuses_a_wrong_state(cache, dtype, tmp_path):
    graph = onnx.load(str(cache_graph(tmp_path / "m.onnx", cache, dtype)))
    limits = onnx_limits("m", graph, onnx_signature(graph))
    rng = np.random.default_rng(3)
    for batch, seq, past in [(1, 5, 0), (2, 1, 1), (4, 1, 15), (3, 2, 7)]:
        check_request(limits, feeds(cache, dtype, batch, seq, past, rng))
    entry = cache[-1]
    static = next(i for i, a in enumerate(entry.axes) if isinstance(a, int))
    bad = feeds(cache, dtype, 1, 1, 3, rng)
    wrong = bad[-1]
    shape = tuple(d + 1 if i == static else d for i, d in enumerate(wrong.shape))
    bad[-1] = RequestTensor(wrong.name, wrong.datatype, shape, b"\0" * (np.prod(shape) * (4 if "32" in
                                                                                           wrong.datatype else 2)))
    with pytest.raises(RequestRefused, match=f"input '{entry.name}' dim {static} is {shape[static]}"):
        check_request(limits, bad)
    other = "FP16" if wrong.datatype == "FP32" else "FP32"
    bad[-1] = RequestTensor(wrong.name, other, wrong.shape, wrong.data)
    with pytest.raises(RequestRefused, match=f"input '{entry.name}' has datatype '{other}'"):
        check_request(limits, bad)
    if any("past" in c.axes for c in cache):
        unaligned = feeds(cache, dtype, 1, 1, 3, rng)
        unaligned[1] = RequestTensor("attention_mask", "INT64", (1, 5), [[1] * 5])
        with pytest.raises(RequestRefused, match=r"total 5; it must be past \+ seq = 3 \+ 1"):
            check_request(limits, unaligned)
