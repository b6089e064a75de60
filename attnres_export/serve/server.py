"""``attnres serve``: an artifact on a real Triton Inference Server (PyTriton), with our runners in the model
instances: ONNX through the ONNX Runtime runner (attnres reference ops, bfloat16 emulation), engines through the
TensorRT runner.

Triton's dynamic batcher gathers requests for up to ``max_queue_delay_us``; each model instance owns one runner
(its own ONNX Runtime session or TensorRT context). The server stops cleanly when ``stop`` is set (the command
sets it on SIGINT/SIGTERM): in-flight requests finish, the server process and its Python-backend stubs exit.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnres_export.serve.dependencies import ServeError, require, server_environment
from attnres_export.serve.signature import Signature, engine_signature, is_engine, onnx_signature

MODEL_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass
class ServeOptions:
    artifact: Path
    model_name: str | None = None
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    instances: int = 1
    max_batch: int | None = None
    max_queue_delay_us: int = 2000
    plugin: Path | None = None
    allow_engine_host_code: bool = False
    exit_timeout_s: int = 10


@dataclass
class ServedModel:
    """What the server runs: the model's name, signature, runners (one per instance) and backend."""

    name: str
    signature: Signature
    runners: list
    backend: str


def model_name_for(artifact: Path, given: str | None) -> str:
    name = given if given is not None else Path(artifact).name.removesuffix(".onnx").removesuffix(".engine")
    if given is None and Path(artifact).suffix not in (".onnx", ".engine"):
        name = Path(artifact).stem
    if not name or not set(name) <= MODEL_NAME_CHARS or name in (".", ".."):
        raise ServeError(f"model name {name!r}: use letters, digits, '.', '_' and '-' only (--model-name NAME)")
    return name


def check_ports(options: ServeOptions) -> None:
    ports = {"--http-port": options.http_port, "--grpc-port": options.grpc_port,
             "--metrics-port": options.metrics_port}
    for option, port in ports.items():
        if not 1 <= port <= 65535:
            raise ServeError(f"{option} {port}: a port is between 1 and 65535")
    if len(set(ports.values())) != len(ports):
        raise ServeError(f"the HTTP, gRPC and metrics ports must differ (got {', '.join(map(str, ports.values()))})")
    for option, port in ports.items():
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((options.host, port))
            except OSError as exc:
                raise ServeError(f"{option} {port}: cannot listen on {options.host}:{port} ({exc.strerror or exc}); "
                                 f"is another server using it? choose another {option}") from exc


def load_model(options: ServeOptions) -> ServedModel:
    """Runners for ``options.instances`` instances of the artifact, activated, and its signature."""
    if options.instances < 1:
        raise ServeError(f"--instances {options.instances}: must be at least 1")
    if not Path(options.artifact).is_file():
        raise ServeError(f"{options.artifact}: no such file")
    name = model_name_for(options.artifact, options.model_name)
    runners = []
    try:
        if is_engine(options.artifact):
            from attnres_export.backends.factory import engine_runner

            for _ in range(options.instances):
                runner, _ = engine_runner(Path(options.artifact), options.plugin, options.allow_engine_host_code)
                runners.append(runner)
            signature = engine_signature(runners[0])
            backend = "TensorRT"
        else:
            from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
            from attnres_export.graphs.load import load_onnx

            model = load_onnx(Path(options.artifact))
            signature = onnx_signature(model)
            runners = [OnnxRuntimeRunner(model, artifact=Path(options.artifact).name)
                       for _ in range(options.instances)]
            backend = runners[0].backend
        signature = signature.with_max_batch(options.max_batch)
        for runner in runners:
            runner.activate()
    except BaseException:
        for runner in runners:
            runner.deactivate()
        raise
    return ServedModel(name, signature, runners, backend)


def infer_function(runner, signature: Signature) -> Callable[[list], list[dict[str, np.ndarray]]]:
    """PyTriton's inference callable for one instance: the requests Triton's batcher gathered, grouped by their
    non-batch shapes, each group concatenated along axis 0, run once, and split back per request."""
    inputs = {s.name: s for s in signature.inputs}

    def feed(request, name: str) -> np.ndarray:
        if name not in request.data:
            raise ServeError(f"request has no input {name!r}")
        return np.asarray(request.data[name], dtype=np.dtype(inputs[name].served_dtype))

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = runner.infer(feeds)
        return {s.name: np.asarray(results[s.name]).astype(s.served_dtype, copy=False) for s in signature.outputs}

    def infer(requests: list) -> list[dict[str, np.ndarray]]:
        if not signature.batched:
            return [run({name: feed(r, name) for name in inputs}) for r in requests]
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            key = tuple((name, np.shape(request.data.get(name))[1:]) for name in inputs)
            groups.setdefault(key, []).append(index)
        responses: list[dict[str, np.ndarray] | None] = [None] * len(requests)
        for members in groups.values():
            feeds = {name: np.concatenate([feed(requests[i], name) for i in members]) for name in inputs}
            outputs = run(feeds)
            start = 0
            for i in members:
                rows = len(requests[i].data[next(iter(inputs))])
                responses[i] = {k: v[start:start + rows] for k, v in outputs.items()}
                start += rows
        return responses

    return infer


@dataclass
class Endpoints:
    http: str
    grpc: str
    metrics: str


def endpoints(options: ServeOptions) -> Endpoints:
    host = f"[{options.host}]" if ":" in options.host else options.host
    return Endpoints(f"{host}:{options.http_port}", f"{host}:{options.grpc_port}", f"{host}:{options.metrics_port}")


def serve(options: ServeOptions, stop: threading.Event, on_ready: Callable[[ServedModel, Endpoints], None],
          poll_s: float = 0.5) -> None:
    """Run the server until ``stop`` is set (or the server dies: an error); always stops it and the runners."""
    require("tritonclient.http", "attnres serve")
    triton_module = require("pytriton.triton", "attnres serve")
    model_config = require("pytriton.model_config", "attnres serve")
    check_ports(options)
    served = load_model(options)
    if stop.is_set():  # a signal arrived while the runners loaded
        for runner in served.runners:
            runner.deactivate()
        return
    # The Python-backend stub links libpython3.X: this interpreter's must come first (server_environment).
    library_path = server_environment().get("LD_LIBRARY_PATH")
    if library_path:
        os.environ["LD_LIBRARY_PATH"] = library_path
    sig = served.signature
    config = triton_module.TritonConfig(
        http_address=options.host, http_port=options.http_port, grpc_address=options.host,
        grpc_port=options.grpc_port, metrics_address=options.host, metrics_port=options.metrics_port,
        exit_timeout_secs=options.exit_timeout_s, allow_gpu_metrics=False, log_verbose=0)
    # Statistics stay readable (as on a stock Triton server); the endpoints that change the server keep
    # PyTriton's generated access token.
    security = triton_module.TritonSecurityConfig(
        restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"])

    def tensors(specs, batched: bool):
        return [model_config.Tensor(name=s.name, dtype=np.dtype(s.served_dtype),
                                    shape=tuple(s.dims[1:] if batched else s.dims)) for s in specs]

    bound_config = model_config.ModelConfig(
        max_batch_size=sig.max_batch, batching=sig.batched,
        batcher=model_config.DynamicBatcher(max_queue_delay_microseconds=options.max_queue_delay_us))
    triton = None
    try:
        triton = triton_module.Triton(config=config, security_config=security)
        triton.bind(model_name=served.name, infer_func=[infer_function(r, sig) for r in served.runners],
                    inputs=tensors(sig.inputs, sig.batched), outputs=tensors(sig.outputs, sig.batched),
                    config=bound_config, strict=True)
        try:
            triton.run()
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ServeError(f"Triton did not start ({detail}); see its log above") from exc
        on_ready(served, endpoints(options))
        while not stop.wait(poll_s):
            if not triton.is_alive():
                raise ServeError("the Triton server stopped by itself; see its log above")
    finally:
        if triton is not None:
            triton.stop()
        for runner in served.runners:
            runner.deactivate()
