"""The front on its own, in front of a fake Triton (an aiohttp app on loopback): readiness is what the
supervisor reports, requests outside the limits never reach the backend and get one line with a 400-class
status, a traceback from the backend reaches the client as one line, answers come in the encoding the client
accepts, and the front keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest

from attnres_export.serve.backend import loopback_ports
from attnres_export.serve.front import Front, FrontState
from attnres_export.serve.limits import onnx_limits
from attnres_export.serve.signature import onnx_signature
from tests.serve.conftest import NEEDS_SERVER
from tests.serve.models import tiny_onnx
from tests.serve.test_wire import PYTRITON_ERROR

pytestmark = NEEDS_SERVER


class FakeTriton:
    """An HTTP server standing in for Triton: infer echoes after ``delay_s``, or answers PyTriton's traceback for
    input 3; like Triton, it gzips an answer when the request accepts gzip."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.port = loopback_ports(1)[0]
        self.delay_s = delay_s
        self.bodies: list[bytes] = []
        self.accepted: list[str | None] = []
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)

    async def main(self) -> None:
        from aiohttp import web

        async def infer(request):
            body = await request.read()
            self.bodies.append(body)
            self.accepted.append(request.headers.get("Accept-Encoding"))
            await asyncio.sleep(self.delay_s)
            if json.loads(body)["inputs"][0]["data"] == [[3]]:
                return web.json_response({"error": PYTRITON_ERROR}, status=500)
            answer = web.json_response({"model_name": "m", "outputs": []})
            if "gzip" in request.headers.get("Accept-Encoding", ""):
                answer.enable_compression(web.ContentCoding.gzip)
            return answer

        async def metrics(_):
            return web.Response(text="nv_inference_count 1\n")

        async def model_ready(_):
            return web.Response()

        app = web.Application()
        app.router.add_post("/v2/models/m/infer", infer)
        app.router.add_get("/v2/models/m/ready", model_ready)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)  # a slow answer does not hold exit
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self.loop, self.stopping = asyncio.get_running_loop(), asyncio.Event()
        self.ready.set()
        await self.stopping.wait()
        await runner.cleanup()

    def __enter__(self) -> FakeTriton:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *_) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(30)


@pytest.fixture
def front(tmp_path):
    model = onnx.load(str(tiny_onnx(tmp_path / "tiny.onnx")))
    state = FrontState("m", onnx_limits("m", model, onnx_signature(model)))
    http, grpc, metrics = loopback_ports(3)
    running = Front(state, "127.0.0.1", http, grpc, metrics, drain_s=2)
    running.start()
    running.urls = (f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}")
    yield running
    running.stop()
    assert not running._thread.is_alive()


def call(url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, payload = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read()
    try:
        return status, json.loads(payload) if payload else ""
    except ValueError:
        return status, payload.decode()


def infer(data, shape=None, datatype="INT64") -> bytes:
    return json.dumps({"inputs": [{"name": "input_ids", "shape": shape or [len(data), len(data[0])],
                                   "datatype": datatype, "data": data}]}).encode()


def test_readiness_follows_the_backend_and_infer_waits_for_it(front):
    http, _, metrics = front.urls
    assert call(f"{http}/v2/health/live")[0] == 200
    assert call(f"{http}/v2/health/ready")[0] == 503 and call(f"{http}/v2/models/m/ready")[0] == 503
    assert call(f"{http}/v2/models/m/infer", infer([[1]])) == (
        503, {"error": "model 'm' is not ready: the model is loading"})
    with FakeTriton() as triton:
        address = f"127.0.0.1:{triton.port}"
        front.state.serving(address, "127.0.0.1:1", address)
        assert call(f"{http}/v2/health/ready")[0] == 200 and call(f"{http}/v2/models/m/ready")[0] == 200
        assert call(f"{http}/v2/models/m/infer", infer([[1, 2]]))[0] == 200
        assert call(f"{metrics}/metrics") == (200, "nv_inference_count 1\n")
        front.state.not_ready("model instance m_0_1 (pid 7) died; the backend is restarting")
        assert call(f"{http}/v2/health/ready")[0] == 503
        assert call(f"{http}/v2/models/m/infer", infer([[1]]))[1]["error"].endswith("the backend is restarting")
        assert len(triton.bodies) == 1


def test_refused_requests_never_reach_the_backend_and_errors_arrive_as_one_line(front):
    http, _, _ = front.urls
    with FakeTriton() as triton:
        front.state.serving(f"127.0.0.1:{triton.port}", "127.0.0.1:1", f"127.0.0.1:{triton.port}")
        url = f"{http}/v2/models/m/infer"
        limit = front.state.limits.max_body_bytes
        answers = {
            "id -1": call(url, infer([[-1]])),
            "seq": call(url, infer([[1] * 65])),
            "datatype": call(url, infer([[1.0]], datatype="FP32")),
            "brackets": call(url, b"[" * 50_000),
            "too big": call(url, b"1" * (limit + 1)),
            "generate": call(f"{http}/v2/models/m/generate", b"{}"),
            "control JSON": call(f"{http}/v2/repository/index", b"[[[[[[[[[[]]]]]]]]]]"),
        }
        assert {k: s for k, (s, _) in answers.items()} == {
            "id -1": 400, "seq": 400, "datatype": 400, "brackets": 400, "too big": 413, "generate": 404,
            "control JSON": 400}
        for _, payload in answers.values():
            assert set(payload) == {"error"} and "\n" not in payload["error"], payload
        assert "holds -1; values must lie in [0, 4)" in answers["id -1"][1]["error"]
        assert f"over this server's limit of {limit} bytes" in answers["too big"][1]["error"]
        assert triton.bodies == []
        status, payload = call(url, infer([[3]]))
        assert status == 500 and payload["error"].startswith("ParityError: ONNX Runtime could not run tiny.onnx")
        assert call(url, infer([[2]]))[0] == 200 and len(triton.bodies) == 2


def test_grpc_readiness_and_refusals_are_answered_by_the_front(front):
    import tritonclient.grpc as grpc
    import tritonclient.utils as utils

    client = grpc.InferenceServerClient(front.urls[1])
    try:
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("m")
        front.state.serving("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1")
        assert client.is_server_ready() and client.is_model_ready("m")
        ids = grpc.InferInput("input_ids", [1, 2], "INT64")
        ids.set_data_from_numpy(np.array([[1, 9]], dtype=np.int64))
        with pytest.raises(utils.InferenceServerException) as caught:
            client.infer("m", [ids])
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert caught.value.message() == "input 'input_ids' holds 9; values must lie in [0, 4) (the vocabulary of " \
                                         "4 tokens)"
    finally:
        client.close()


def test_an_answer_comes_in_the_encoding_the_client_accepts_identity_when_it_names_none(front):
    http_url = front.urls[0]

    def post(headers: dict) -> tuple[str | None, bytes]:
        """What ``curl`` sends: no Accept-Encoding unless given (urllib would add ``identity`` itself)."""
        connection = http.client.HTTPConnection(http_url.removeprefix("http://"), timeout=30)
        try:
            body = infer([[1]])
            connection.putrequest("POST", "/v2/models/m/infer", skip_accept_encoding=True)
            for name, value in {"Content-Length": str(len(body)), **headers}.items():
                connection.putheader(name, value)
            connection.endheaders(body)
            answer = connection.getresponse()
            return answer.getheader("Content-Encoding"), answer.read()
        finally:
            connection.close()

    with FakeTriton() as triton:
        front.state.serving(f"127.0.0.1:{triton.port}", "127.0.0.1:1", f"127.0.0.1:{triton.port}")
        encoding, plain = post({})
        assert encoding is None and json.loads(plain)["model_name"] == "m"
        encoding, packed = post({"Accept-Encoding": "gzip"})
        assert encoding == "gzip" and json.loads(gzip.decompress(packed))["model_name"] == "m"
        assert triton.accepted == ["identity", "gzip"]
