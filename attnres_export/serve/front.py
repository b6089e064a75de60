"""The front of ``attnres serve``: the public HTTP, gRPC and metrics ports, in front of a Triton server that
listens on loopback only.

Every request is checked here before Triton sees it (body size, JSON nesting, and for inference requests the
inputs against ``RequestLimits``) and refused with one line and a 400-class status; health and readiness are
answered here from what the supervisor reports (ready: the model is loaded and every process that serves it is
alive), so a restart of the backend shows as not-ready instead of failing requests. Errors Triton answers with
reach the client as their last line (PyTriton puts whole Python tracebacks in them). Runs on its own thread and
asyncio loop; the supervisor publishes the backend's state with one attribute write (``FrontState.view``).

Stopping drains: the ports keep listening, readiness and new requests answer 503 (the state says why), and the
requests in flight finish (at most ``drain_s``) before the ports close and Triton is stopped behind them. Closing
the listening sockets first, as aiohttp's cleanup does, refused readiness probes outright during the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from dataclasses import dataclass

from attnres_export.serve.dependencies import ServeError, require
from attnres_export.serve.limits import CONTROL_BODY_BYTES, RequestLimits, RequestRefused, check_request
from attnres_export.serve.wire import check_http_infer, decompress, grpc_tensors, one_line, parse_json

SERVICE = "inference.GRPCInferenceService"
MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<rest>/[^/]*)?$")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
               "expect", "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection"}
RESPONSE_HEADERS = ("Content-Type", "Content-Encoding", "Inference-Header-Content-Length")
CONTROL_JSON_DEPTH = 8
"""Nesting allowed in a request that is not an inference (their JSON is flat objects)."""
CLOSE_S = 1.0
"""How long the ports wait for requests still in flight after the drain before they close (and cut them)."""


@dataclass(frozen=True)
class BackendView:
    """The backend as the front sees it: ready or not (and why), and Triton's loopback addresses when ready."""

    ready: bool
    reason: str
    http: str | None = None
    grpc: str | None = None
    metrics: str | None = None


class FrontState:
    """What the supervisor tells the front; ``view`` is replaced whole, never changed in place."""

    def __init__(self, model: str, limits: RequestLimits) -> None:
        self.model = model
        self.limits = limits
        self.view = BackendView(False, "the model is loading")

    def serving(self, http: str, grpc: str, metrics: str) -> None:
        self.view = BackendView(True, "", http, grpc, metrics)

    def not_ready(self, reason: str) -> None:
        self.view = BackendView(False, reason)

    def not_ready_message(self) -> str:
        return f"model {self.model!r} is not ready: {self.view.reason}"


class InFlight:
    """The requests the front is answering, counted on its loop, so that stopping can wait for them."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    @contextlib.contextmanager
    def held(self):
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            self._changed.set()

    async def drained(self, timeout_s: float) -> int:
        """Wait until no request is in flight, at most ``timeout_s``; the number still in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.count and loop.time() < deadline:
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
        return self.count


def _error(web, status: int, message: str):
    return web.json_response({"error": message}, status=status)


class HttpFront:
    """The HTTP/REST port (KServe v2) and the metrics port, on aiohttp."""

    def __init__(self, state: FrontState, in_flight: InFlight) -> None:
        self.web = require("aiohttp.web", "attnres serve")
        self.aiohttp = require("aiohttp", "attnres serve")
        self.state = state
        self.in_flight = in_flight
        self.session = None

    def apps(self):
        web = self.web
        limit = max(self.state.limits.max_body_bytes, CONTROL_BODY_BYTES)
        api = web.Application(client_max_size=limit)
        api.router.add_route("*", "/{tail:.*}", self.handle)
        metrics = web.Application()
        metrics.router.add_route("GET", "/metrics", self.metrics)
        return api, metrics

    async def open(self) -> None:
        self.session = self.aiohttp.ClientSession(auto_decompress=False,
                                                  timeout=self.aiohttp.ClientTimeout(total=None, connect=10))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def read_body(self, request, limit: int) -> bytes:
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            raise RequestRefused("chunked request bodies are not accepted; send Content-Length", 411)
        length = request.content_length
        if length is None:
            if request.method in ("POST", "PUT", "PATCH"):
                raise RequestRefused("a request with a body needs Content-Length", 411)
            return b""
        if length > limit:
            raise RequestRefused(f"request body of {length} bytes is over this server's limit of {limit} bytes "
                                 "(the largest request the model's input ranges allow)", 413)
        body = await request.read()
        return decompress(body, request.headers.get("Content-Encoding"), limit)

    async def handle(self, request):
        web, state = self.web, self.state
        path = request.path
        if path == "/v2/health/live":
            return web.Response()
        view = state.view
        if path == "/v2/health/ready":
            return web.Response(status=200 if view.ready else 503)
        match = MODEL_PATH.match(path)
        rest = (match["rest"] or "") if match else None
        ours = match is not None and match["name"] == state.model
        if ours and rest == "/ready":
            return web.Response(status=200 if view.ready else 503)
        with self.in_flight.held():
            return await self.answer(request, view, rest, ours)

    async def answer(self, request, view: BackendView, rest: str | None, ours: bool):
        """A request that is not health or readiness: refused in one line, or forwarded to the backend."""
        web, state = self.web, self.state
        try:
            if rest in ("/generate", "/generate_stream"):
                raise RequestRefused(f"{rest.lstrip('/')} is not served here; use POST "
                                     f"/v2/models/{state.model}/infer", 404)
            if not view.ready:
                raise RequestRefused(state.not_ready_message(), 503)
            infer = rest == "/infer"
            body = await self.read_body(request, state.limits.max_body_bytes if infer else CONTROL_BODY_BYTES)
            if infer and ours:
                header = request.headers.get("Inference-Header-Content-Length")
                try:
                    header_length = None if header is None else int(header)
                except ValueError:
                    raise RequestRefused(f"Inference-Header-Content-Length {header!r} is not a number") from None
                check_http_infer(body, header_length, state.limits)
            elif body:
                parse_json(body, CONTROL_JSON_DEPTH)
        except RequestRefused as refused:
            return _error(web, refused.status, str(refused))
        return await self.forward(request, view.http, body)

    async def forward(self, request, address: str, body: bytes):
        web = self.web
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        # The client's encodings, or none: aiohttp would otherwise offer gzip for it, and Triton gzipped the answer
        # to a plain ``curl`` that never asked for it.
        if "accept-encoding" not in (k.lower() for k in headers):
            headers["Accept-Encoding"] = "identity"
        url = f"http://{address}{request.rel_url}"
        try:
            async with self.session.request(request.method, url, data=body or None, headers=headers,
                                            allow_redirects=False) as upstream:
                payload = await upstream.read()
                status = upstream.status
                kept = {k: upstream.headers[k] for k in RESPONSE_HEADERS if k in upstream.headers}
        except self.aiohttp.ClientError as exc:
            return _error(web, 503, f"model {self.state.model!r}: the backend stopped while answering "
                                    f"({type(exc).__name__}); retry")
        if status >= 400 and "Content-Encoding" not in kept:
            payload = _one_line_error_body(payload)
            kept["Content-Type"] = "application/json"
        return web.Response(status=status, body=payload, headers=kept)

    async def metrics(self, request):
        view = self.state.view
        if not view.ready:
            return _error(self.web, 503, self.state.not_ready_message())
        return await self.forward(request, view.metrics, b"")


def _one_line_error_body(payload: bytes) -> bytes:
    try:
        message = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        message = None
    if not isinstance(message, str):
        message = payload.decode("utf-8", "replace")
    return json.dumps({"error": one_line(message)}).encode()


class GrpcFront:
    """The gRPC port: Triton's GRPCInferenceService forwarded as raw messages, inference requests checked,
    health and readiness answered here."""

    def __init__(self, state: FrontState, in_flight: InFlight) -> None:
        self.grpc = require("grpc", "attnres serve")
        self.aio = require("grpc.aio", "attnres serve")
        self.pb = require("tritonclient.grpc.service_pb2", "attnres serve")
        self.state = state
        self.in_flight = in_flight
        self.channels: dict[str, object] = {}
        self.closing: set[asyncio.Future] = set()

    def handler(self):
        grpc, front = self.grpc, self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                service, _, method = details.method.lstrip("/").partition("/")
                if service != SERVICE:
                    return None
                if method == "ModelStreamInfer":
                    return grpc.stream_stream_rpc_method_handler(front.stream)

                async def behaviour(raw: bytes, context) -> bytes:
                    return await front.unary(method, raw, context)

                return grpc.unary_unary_rpc_method_handler(behaviour)

        return Handler()

    def channel(self, address: str):
        """The channel to the backend at ``address`` (a restarted backend has new ports: the old channel closes)."""
        if address not in self.channels:
            for old in self.channels.values():
                closing = asyncio.ensure_future(old.close(grace=5))
                self.closing.add(closing)
                closing.add_done_callback(self.closing.discard)
            self.channels = {address: self.aio.insecure_channel(address, options=[
                ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])}
        return self.channels[address]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    def refuse_code(self, status: int):
        codes = self.grpc.StatusCode
        return {503: codes.UNAVAILABLE, 404: codes.UNIMPLEMENTED, 413: codes.RESOURCE_EXHAUSTED}.get(
            status, codes.INVALID_ARGUMENT)

    def check_infer(self, raw: bytes):
        from google.protobuf.message import DecodeError

        try:
            request = self.pb.ModelInferRequest.FromString(raw)
        except DecodeError:
            raise RequestRefused("the ModelInferRequest does not parse") from None
        if request.model_name == self.state.model:
            check_request(self.state.limits, grpc_tensors(request))
        return request

    async def upstream(self, method: str, raw: bytes, context) -> bytes:
        view = self.state.view
        if not view.ready:
            raise RequestRefused(self.state.not_ready_message(), 503)
        call = self.channel(view.grpc).unary_unary(f"/{SERVICE}/{method}")
        metadata = tuple((k, v) for k, v in context.invocation_metadata()
                         if not k.startswith((":", "grpc-")) and k not in ("content-type", "te", "user-agent"))
        return await call(raw, metadata=metadata, timeout=context.time_remaining())

    async def unary(self, method: str, raw: bytes, context) -> bytes:
        pb, state = self.pb, self.state
        try:
            if method == "ServerLive":
                return pb.ServerLiveResponse(live=True).SerializeToString()
            if method == "ServerReady":
                return pb.ServerReadyResponse(ready=state.view.ready).SerializeToString()
            if method == "ModelReady" and pb.ModelReadyRequest.FromString(raw).name == state.model:
                return pb.ModelReadyResponse(ready=state.view.ready).SerializeToString()
            with self.in_flight.held():
                if method == "ModelInfer":
                    self.check_infer(raw)
                return await self.upstream(method, raw, context)
        except RequestRefused as refused:
            await context.abort(self.refuse_code(refused.status), str(refused))
        except self.aio.AioRpcError as error:
            await context.abort(error.code(), one_line(error.details() or ""))

    async def stream(self, requests, context):
        """ModelStreamInfer for a model that is not decoupled: each request answered in turn, errors as
        ``error_message`` responses (the stream stays open)."""
        pb = self.pb
        async for raw in requests:
            request_id = ""
            try:
                with self.in_flight.held():
                    request_id = self.check_infer(raw).id
                    answer = pb.ModelInferResponse.FromString(await self.upstream("ModelInfer", raw, context))
                yield pb.ModelStreamInferResponse(infer_response=answer).SerializeToString()
            except RequestRefused as refused:
                yield pb.ModelStreamInferResponse(error_message=str(refused), infer_response=pb.ModelInferResponse(
                    id=request_id, model_name=self.state.model)).SerializeToString()
            except self.aio.AioRpcError as error:
                yield pb.ModelStreamInferResponse(error_message=one_line(error.details() or ""),
                                                  infer_response=pb.ModelInferResponse(
                                                      id=request_id, model_name=self.state.model)
                                                  ).SerializeToString()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Front:
    """The three public ports on one thread: ``start`` returns once they listen (or raises one line),
    ``stop`` lets requests in flight finish (at most ``drain_s``; the caller has set the state not ready, which
    readiness and new requests answer meanwhile) and closes the ports."""

    def __init__(self, state: FrontState, host: str, http_port: int, grpc_port: int, metrics_port: int,
                 drain_s: float) -> None:
        self.state = state
        self.host, self.ports = host, {"--http-port": http_port, "--grpc-port": grpc_port,
                                       "--metrics-port": metrics_port}
        self.drain_s = drain_s
        self.in_flight = InFlight()
        self.http = HttpFront(state, self.in_flight)
        self.grpc = GrpcFront(state, self.in_flight)
        self.cut = 0
        """Requests still in flight when the drain ended (their connections were closed)."""
        self._started = threading.Event()
        self._error: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="attnres-front", daemon=True)

    def start(self, timeout_s: float = 30) -> None:
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise ServeError(f"the front did not start listening within {timeout_s:.0f} s")
        if self._error:
            self._thread.join(timeout_s)
            raise ServeError(self._error)

    def stop(self) -> int:
        """Drain and close the ports; the number of requests cut off at the end of the drain."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(self.drain_s + CLOSE_S + 10)
        return self.cut

    async def _main(self) -> None:
        web = self.http.web
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        api, metrics = self.http.apps()
        runners = [web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=CLOSE_S)
                   for app in (api, metrics)]
        grpc_server = self.grpc.aio.server(options=[
            ("grpc.max_receive_message_length", self.state.limits.max_body_bytes),
            ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
        grpc_server.add_generic_rpc_handlers([self.grpc.handler()])
        option = "--http-port"
        try:
            await self.http.open()
            for runner in runners:
                await runner.setup()
            await web.TCPSite(runners[0], self.host, self.ports["--http-port"], reuse_port=False).start()
            option = "--metrics-port"
            await web.TCPSite(runners[1], self.host, self.ports["--metrics-port"], reuse_port=False).start()
            option = "--grpc-port"
            grpc_server.add_insecure_port(_address(self.host, self.ports["--grpc-port"]))
            await grpc_server.start()
        except (OSError, RuntimeError) as exc:
            port = self.ports[option]
            self._error = (f"{option} {port}: cannot listen on {self.host}:{port} "
                           f"({getattr(exc, 'strerror', None) or exc}); choose another {option}")
        self._started.set()
        if self._error is None:
            await self._stopping.wait()
            self.cut = await self.in_flight.drained(self.drain_s)
            await grpc_server.stop(CLOSE_S)
        for runner in runners:
            await runner.cleanup()
        await self.grpc.close()
        await self.http.close()
