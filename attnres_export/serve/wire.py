"""KServe v2 inference requests as they arrive (HTTP JSON with the binary-data extension, gRPC
``ModelInferRequest``) turned into ``RequestTensor`` lists for ``limits.check_request``, the JSON checks that keep
Triton's recursive parser safe, and the one-line form of an error Triton answers with.
"""

from __future__ import annotations

import json
import re
import zlib

from attnres_export.serve.limits import RequestLimits, RequestRefused, RequestTensor, check_request

SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
GRPC_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                 "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                 "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                 "FP64": "fp64_contents"}
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Refused)): (.+)$")


def json_depth(value: object) -> int:
    """How deep lists and objects nest in a parsed JSON value (iteratively: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (list, dict)))
    return deepest if isinstance(value, (list, dict)) else 0


def parse_json(body: bytes, max_depth: int) -> object:
    """``body`` as JSON, refused when it is not JSON or nests deeper than ``max_depth``.

    Python's decoder stops at its recursion limit (``RecursionError``) rather than overflowing the stack, so even
    a body of nothing but ``[`` is refused here before it reaches Triton's parser."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise RequestRefused(f"request JSON nests deeper than {max_depth} levels (the limit)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise RequestRefused(f"request body is not JSON ({detail})") from None
    if json_depth(value) > max_depth:
        raise RequestRefused(f"request JSON nests deeper than {max_depth} levels (the limit)")
    return value


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A gzip or deflate request body inflated to at most ``limit`` bytes (a larger one is refused, 413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise RequestRefused(f"Content-Encoding {encoding!r} is not accepted (gzip, deflate or none)", 415)
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        inflated = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestRefused(f"request body is not valid {encoding} ({exc})") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise RequestRefused(f"request body inflates past this server's limit of {limit} bytes", 413)
    return inflated


def _refuse_shared_memory(name: str, parameters) -> None:
    if any(key in parameters for key in SHARED_MEMORY_KEYS):
        raise RequestRefused(f"input {name!r} names a shared-memory region; this server takes tensors in the "
                             "request only")


def http_tensors(body: bytes, header_length: int | None, limits: RequestLimits) -> list[RequestTensor]:
    """The inputs of an HTTP inference request (``header_length``: the ``Inference-Header-Content-Length`` of the
    binary-data extension, ``None`` for all-JSON)."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise RequestRefused(f"Inference-Header-Content-Length {header_length} is outside the body's "
                             f"{len(body)} bytes")
    split = len(body) if header_length is None else header_length
    request = parse_json(body[:split], limits.max_json_depth)
    binary = memoryview(body)[split:]
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise RequestRefused("request JSON has no 'inputs' list")
    tensors, offset = [], 0
    for entry in request["inputs"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise RequestRefused("every entry of 'inputs' needs a 'name'")
        name = entry["name"]
        parameters = entry.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise RequestRefused(f"input {name!r}: 'parameters' must be an object")
        _refuse_shared_memory(name, parameters)
        if "binary_data_size" in parameters:
            size = parameters["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise RequestRefused(f"input {name!r}: binary_data_size {size!r} does not fit the "
                                     f"{len(binary)} binary bytes after the JSON header")
            data: object = binary[offset:offset + size]
            offset += size
        elif "data" in entry:
            data = entry["data"]
        else:
            raise RequestRefused(f"input {name!r} has neither 'data' nor a binary_data_size parameter")
        tensors.append(RequestTensor(name, entry.get("datatype"), entry.get("shape"), data))
    return tensors


def check_http_infer(body: bytes, header_length: int | None, limits: RequestLimits) -> None:
    check_request(limits, http_tensors(body, header_length, limits))


def grpc_tensors(request) -> list[RequestTensor]:
    """The inputs of a gRPC ``ModelInferRequest`` (raw contents, else the typed contents of the datatype)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RequestRefused(f"the request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents")
    tensors = []
    for index, entry in enumerate(request.inputs):
        _refuse_shared_memory(entry.name, entry.parameters)
        if raw:
            data: object = raw[index]
        else:
            field = GRPC_CONTENTS.get(entry.datatype)
            data = list(getattr(entry.contents, field)) if field else b""
        tensors.append(RequestTensor(entry.name, entry.datatype, tuple(entry.shape), data))
    return tensors


def one_line(message: str) -> str:
    """Triton's error ``message`` without the Python traceback PyTriton puts in it: the last ``SomeError: text``
    line, else the first line."""
    text = message.strip()
    if "Traceback (most recent call last)" not in text:
        return text.splitlines()[0] if text else "the server gave no error message"
    found = [m for m in map(_ERROR_LINE.match, (line.strip() for line in text.splitlines())) if m]
    return f"{found[-1][1]}: {found[-1][2]}" if found else text.splitlines()[0]
