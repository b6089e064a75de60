"""Request limits: every input's shape must lie in the ranges the artifact was exported (or built) for, its
datatype must be the model's, and token and position ids must lie in the tables they index; each refusal is one
line naming the input and the limit. In-process, on the checking function itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnres_export.serve.limits import (
    BODY_OVERHEAD_BYTES,
    JSON_BYTES_PER_VALUE,
    RequestRefused,
    RequestTensor,
    check_request,
    engine_limits,
    onnx_limits,
)
from attnres_export.serve.signature import Signature, TensorSpec, onnx_signature
from tests.serve.models import tiny_onnx, with_past_onnx


@pytest.fixture(scope="module")
def limits(tmp_path_factory):
    """tiny_onnx: input_ids [batch 1..16, seq 1..64] INT64 -> logits [batch, seq, 4]: a vocabulary of 4."""
    model = onnx.load(str(tiny_onnx(tmp_path_factory.mktemp("limits") / "tiny.onnx")))
    return onnx_limits("m", model, onnx_signature(model))


def ids(data, shape=None, datatype="INT64", name="input_ids") -> RequestTensor:
    shape = tuple(np.shape(data)) if shape is None else shape
    return RequestTensor(name, datatype, shape, data)


def refused(limits, tensors) -> str:
    with pytest.raises(RequestRefused) as caught:
        check_request(limits, tensors)
    message = str(caught.value)
    assert "\n" not in message and 400 <= caught.value.status < 500, message
    return message


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (16, 64), (1, 64), (16, 1)])
def test_requests_inside_the_exported_ranges_pass_as_json_and_as_raw_bytes(limits, shape):
    values = np.random.default_rng(list(shape)).integers(0, 4, size=shape, dtype=np.int64)
    values.flat[0], values.flat[-1] = 0, 3  # both ends of the vocabulary
    check_request(limits, [ids(values.tolist())])
    check_request(limits, [ids(values.astype("<i8").tobytes(), shape)])
    check_request(limits, [ids(values.reshape(-1).tolist(), shape)])  # flat JSON data, as KServe allows


@pytest.mark.parametrize(("tensors", "expected"), [
    ([ids([[-1, 2]])], "input 'input_ids' holds -1; values must lie in [0, 4) (the vocabulary of 4 tokens)"),
    ([ids([[1, 4]])], "input 'input_ids' holds 4; values must lie in [0, 4)"),
    ([ids([[1] * 65])], "input 'input_ids' dim 1 (seq) is 65; this model accepts 1 to 64 (the range it was "
                        "exported for)"),
    ([ids([[1]] * 17)], "input 'input_ids' dim 0 (batch) is 17; this model accepts 1 to 16"),
    ([ids([[]], (1, 0))], "input 'input_ids' dim 1 (seq) is 0; this model accepts 1 to 64"),
    ([ids([[[1]]])], "input 'input_ids' has shape [1, 1, 1] (3 dims); this model takes 2 dims (batch, seq)"),
    ([ids([[1.0]], datatype="FP32")], "input 'input_ids' has datatype 'FP32'; this model takes INT64"),
    ([ids([[1]], name="x")], "input 'x' is not an input of model 'm' (its inputs: input_ids)"),
    ([], "input 'input_ids' is missing"),
    ([ids([[1]]), ids([[2]])], "input 'input_ids' is given twice"),
    ([ids([[1, 2], [3]], (2, 2))], "input 'input_ids': data is not a rectangular array of numbers"),
    ([ids([[1.5]])], "input 'input_ids': data holds 'f'-kind values (float64), not INT64"),
    ([ids([[True]])], "input 'input_ids': data holds 'b'-kind values"),
    ([ids([[2 ** 70]])], "input 'input_ids': data holds 'O'-kind values"),
    ([ids([[1, 2]], (1, 3))], "input 'input_ids' holds 2 values; shape [1, 3] needs 3"),
    ([ids(b"\0" * 8, (1, 2))], "input 'input_ids' carries 8 bytes; shape [1, 2] of INT64 needs 16"),
    ([ids([[1]], [1, "a"])], "input 'input_ids': shape must be a list of integers"),
    ([ids([[1]], (1, -1))], "input 'input_ids': shape [1, -1] has a negative dim"),
], ids=["id -1", "id = vocab", "seq over", "batch over", "seq 0", "rank", "datatype", "unknown", "missing",
        "twice", "ragged", "floats", "bools", "huge int", "count", "raw length", "shape type", "negative dim"])
def test_requests_outside_the_limits_are_refused_in_one_line(limits, tensors, expected):
    assert expected in refused(limits, tensors)


def test_the_body_limit_is_the_largest_request_the_ranges_allow(limits):
    assert limits.max_body_bytes == BODY_OVERHEAD_BYTES + 16 * 64 * JSON_BYTES_PER_VALUE
    assert limits.max_json_depth == 6 and limits.unbounded == ()


def test_a_with_past_graph_bounds_positions_by_max_seq_len_and_total_by_past_plus_seq():
    model = with_past_onnx(vocab=5, max_seq_len=16)
    limits = onnx_limits("m", model, onnx_signature(model))
    rng = np.random.default_rng(0)

    def request(batch=1, seq=2, past=3, total=None, positions=None):
        total = past + seq if total is None else total
        return [ids(rng.integers(0, 5, size=(batch, seq)).tolist()),
                ids([[1] * total] * batch, name="attention_mask"),
                ids(positions or [list(range(past, past + seq))] * batch, name="position_ids"),
                RequestTensor("past_key_values.0.key", "FP32", (batch, 2, past, 4),
                              rng.standard_normal((batch, 2, past, 4)).astype("<f4").tobytes())]

    check_request(limits, request())
    check_request(limits, request(past=0, seq=1))  # the first decode step: an empty past
    check_request(limits, request(batch=4, seq=16, past=0))
    assert "input 'attention_mask' has total 6; it must be past + seq = 3 + 2" in refused(limits, request(total=6))
    assert "input 'position_ids' holds 16; values must lie in [0, 16) (max_seq_len 16)" in refused(
        limits, request(positions=[[15, 16]]))
    mixed = request(batch=2)
    mixed[2] = ids([[3, 4]], name="position_ids")
    assert "input 'position_ids' dim 0 (batch) is 1, but input 'input_ids' has batch 2; they must agree" in refused(
        limits, mixed)
    assert "input 'past_key_values.0.key' dim 1 is 3; this model accepts 2" in refused(
        limits, [*request()[:3], RequestTensor("past_key_values.0.key", "FP32", (1, 3, 3, 4), b"\0" * 144)])


def test_an_engine_request_must_fit_one_of_its_optimization_profiles():
    signature = Signature((TensorSpec("input_ids", "int64", (-1, -1)),),
                          (TensorSpec("logits", "float32", (-1, -1, 4)),), 2,
                          [{"input_ids": {"min": [1, 1], "opt": [1, 4], "max": [2, 8]}},
                           {"input_ids": {"min": [1, 9], "opt": [1, 16], "max": [2, 32]}}])
    limits = engine_limits("e", signature)
    check_request(limits, [ids([[1] * 5])])
    check_request(limits, [ids([[3] * 20] * 2)])
    assert refused(limits, [ids([[1] * 40])]) == (
        "the input shapes fit none of the engine's 2 optimization profiles (profile 0: input 'input_ids' dim 1 is "
        "40; this model accepts 1 to 8)")
    assert "input 'input_ids' holds 4; values must lie in [0, 4)" in refused(limits, [ids([[4]])])
