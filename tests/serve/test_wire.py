"""The wire formats the front reads: a body of nothing but ``[`` is refused without recursion, JSON nesting and
compressed bodies are bounded, the binary-data extension and gRPC contents become the tensors the limits check,
and a PyTriton traceback becomes its last line."""

from __future__ import annotations

import gzip
import json
import time
import zlib

import numpy as np
import onnx
import pytest

from attnres_export.serve.limits import RequestRefused, onnx_limits
from attnres_export.serve.signature import onnx_signature
from attnres_export.serve.wire import check_http_infer, decompress, grpc_tensors, json_depth, one_line, parse_json
from tests.serve.conftest import NEEDS_CLIENT
from tests.serve.models import tiny_onnx

PYTRITON_ERROR = (  # as the live server answered an id outside the vocabulary before the front (shortened)
    "Failed to process the request(s) for model 'm_0_0', message: TritonModelException: Model execute error: "
    "Traceback (most recent call last):\n  File \"/tmp/folderKpEoRS/1/model.py\", line 492, in execute\n"
    "    raise triton_responses_or_error\nc_python_backend_utils.TritonModelException: Traceback (most recent call "
    "last):\n  File \"/work/main/attnres_export/backends/onnxruntime/runner.py\", line 86, in infer\n"
    "onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT\n\n"
    "The above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n"
    "  File \"/work/main/attnres_export/serve/server.py\", line 128, in run\n"
    "attnres_export.errors.ParityError: ONNX Runtime could not run tiny.onnx on inputs input_ids [1, 3]: "
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : idx=1000 must be within the inclusive range [-256,255]\n\n\n\n"
    "At:\n  /tmp/folderKpEoRS/1/model.py(501): execute\n")


@pytest.fixture(scope="module")
def limits(tmp_path_factory):
    model = onnx.load(str(tiny_onnx(tmp_path_factory.mktemp("wire") / "tiny.onnx")))
    return onnx_limits("m", model, onnx_signature(model))


def refusal(call, *args) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        call(*args)
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_megabyte_of_open_brackets_is_refused_quickly_without_recursing():
    start = time.monotonic()
    assert "nests deeper than 6 levels" in str(refusal(parse_json, b"[" * 1_000_000, 6))
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("depth", [1, 5, 6])
def test_json_up_to_the_depth_limit_parses_and_one_level_more_is_refused(depth):
    body = "[" * depth + "]" * depth
    assert json_depth(parse_json(body.encode(), 6)) == depth
    deeper = json.dumps({"inputs": [{"data": json.loads(body)}]})  # three levels more
    if depth + 3 > 6:
        assert "nests deeper than 6" in str(refusal(parse_json, deeper.encode(), 6))


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b"inputs=1"])
def test_a_body_that_is_not_json_is_refused(body):
    assert "request body is not JSON" in str(refusal(parse_json, body, 6))


def test_the_binary_data_extension_is_split_and_checked(limits):
    values = np.array([[0, 3, 1]], dtype="<i8")
    header = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64",
                                     "parameters": {"binary_data_size": values.nbytes}}]}).encode()
    check_http_infer(header + values.tobytes(), len(header), limits)
    bad = np.array([[0, -1, 1]], dtype="<i8").tobytes()
    assert "holds -1" in str(refusal(check_http_infer, header + bad, len(header), limits))
    assert "does not fit the 8 binary bytes" in str(refusal(check_http_infer, header + bad[:8], len(header), limits))
    assert "is outside the body's" in str(refusal(check_http_infer, header, len(header) + 1, limits))


@pytest.mark.parametrize("key", ["shared_memory_region", "shared_memory_byte_size"])
def test_inputs_in_shared_memory_are_refused(limits, key):
    body = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                                   "parameters": {key: "r"}}]}).encode()
    assert "names a shared-memory region" in str(refusal(check_http_infer, body, None, limits))


def test_compressed_bodies_inflate_only_up_to_the_limit():
    body = json.dumps({"inputs": []}).encode()
    assert decompress(gzip.compress(body), "gzip", 1000) == body
    assert decompress(zlib.compress(body), "deflate", 1000) == body
    assert decompress(body, None, 1000) == body
    bomb = gzip.compress(b"0" * 10_000_000)
    assert len(bomb) < 20_000
    assert refusal(decompress, bomb, "gzip", 1_000_000).status == 413
    assert refusal(decompress, body, "br", 1000).status == 415
    assert "not valid gzip" in str(refusal(decompress, b"not gzip", "gzip", 1000))


def test_a_pytriton_traceback_becomes_its_last_error_line():
    line = one_line(PYTRITON_ERROR)
    assert line.startswith("ParityError: ONNX Runtime could not run tiny.onnx on inputs input_ids [1, 3]")
    assert "\n" not in line and "/tmp/folder" not in line and "File " not in line
    assert one_line("[400] unexpected shape\nmore") == "[400] unexpected shape"


@NEEDS_CLIENT
def test_grpc_raw_and_typed_contents_become_the_same_tensors(limits):
    from tritonclient.grpc import service_pb2

    from attnres_export.serve.limits import check_request

    def request(values: np.ndarray, raw: bool):
        entry = service_pb2.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64",
                                                               shape=list(values.shape))
        message = service_pb2.ModelInferRequest(model_name="m", inputs=[entry])
        if raw:
            message.raw_input_contents.append(values.astype("<i8").tobytes())
        else:
            message.inputs[0].contents.int64_contents.extend(values.reshape(-1).tolist())
        return message

    good = np.arange(8, dtype=np.int64).reshape(2, 4) % 4
    for raw in (True, False):
        check_request(limits, grpc_tensors(request(good, raw)))
        assert "holds 4;" in str(refusal(check_request, limits, grpc_tensors(request(good + 4, raw))))
    twice = request(good, True)
    twice.raw_input_contents.append(b"")
    assert "1 inputs but 2 raw_input_contents" in str(refusal(grpc_tensors, twice))
