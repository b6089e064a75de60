"""``attnres serve``: an ONNX or a TensorRT engine on a Triton Inference Server (PyTriton), until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console, debugging
from attnres_export.cli.options import AllowEngineHostCode, Plugin


@command(app)
def serve(
    artifact: Annotated[Path, typer.Argument(help="ONNX (run on ONNX Runtime) or TensorRT engine.")],
    model_name: Annotated[str | None, typer.Option(help="Name the model is served under [the file's stem].")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP/REST port.")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = 8002,
    instances: Annotated[int, typer.Option(
        help="Model instances, each with its own runner (at most one per usable CPU core, and what memory holds).")
                         ] = 1,
    max_batch: Annotated[int | None, typer.Option(
        help="Largest batch Triton's dynamic batcher forms [the artifact's batch range maximum].")] = None,
    max_queue_delay_us: Annotated[int, typer.Option(
        min=0, help="How long the dynamic batcher waits to fill a batch, in microseconds.")] = 2000,
    plugin: Plugin = None,
    allow_engine_host_code: AllowEngineHostCode = False,
) -> None:
    """Serve an artifact on Triton (HTTP, gRPC, metrics, dynamic batching) until SIGINT or SIGTERM."""
    from attnres_export.serve.server import ServeOptions
    from attnres_export.serve.server import serve as run_server

    options = ServeOptions(artifact, model_name, host, http_port, grpc_port, metrics_port, instances, max_batch,
                           max_queue_delay_us, plugin, allow_engine_host_code, show_harmless_log=debugging())
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        stop.set()

    def on_ready(served, where) -> None:
        batching = (f"dynamic batching up to {served.signature.max_batch}, {max_queue_delay_us} us queue delay"
                    if served.signature.batched else "no batching (axis 0 is not a dynamic batch axis)")
        console.print(f"serving [bold]{served.name}[/bold] ({served.backend}, {len(served.runners)} instance(s), "
                      f"{batching}): HTTP {where.http}, gRPC {where.grpc}, metrics {where.metrics}; "
                      "SIGINT or SIGTERM stops", highlight=False)

    def on_event(message: str) -> None:
        console.print(message, highlight=False, soft_wrap=True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        run_server(options, stop, on_ready, on_event)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        console.print(f"stopped ({signal.Signals(received[0]).name}); the server shut down cleanly", highlight=False)
