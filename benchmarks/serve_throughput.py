"""Throughput and latency of ``attnres serve`` (Triton through PyTriton, ONNX Runtime in the model instances)
against calling ONNX Runtime directly in the client process, at 1, 4 and 16 concurrent clients, in one
interleaved run (a server round, then a direct round, at each concurrency, repeated).

Model: the bundled example (examples/tiny-block-attnres.pt, exported with --target tensorrt, so the attnres
reference op runs in ONNX Runtime), each request one sequence of --seq tokens. Run from the repository root:
    python benchmarks/serve_throughput.py [--rounds 3] [--requests 96] [--seq 32] [--protocol http|grpc]
Needs the serve extra (pip install -e .[serve]). Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-block-attnres.pt"
CONCURRENCY = (1, 4, 16)
LAUNCH = "from attnres_export.cli import main; main()"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_server(onnx_path: Path, log: Path, instances: int, delay_us: int) -> tuple[subprocess.Popen, str, str]:
    import tritonclient.http as http

    ports = free_ports(3)
    command = [sys.executable, "-c", LAUNCH, "serve", str(onnx_path), "--model-name", "m", "--instances",
               str(instances), "--max-queue-delay-us", str(delay_us), "--http-port", str(ports[0]),
               "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    http_url, grpc_url = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"
    client = http.InferenceServerClient(http_url)
    try:
        for _ in range(480):  # at most 120 s
            if process.poll() is not None:
                raise SystemExit(f"attnres serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if client.is_model_ready("m"):
                    return process, http_url, grpc_url
            except Exception:  # not listening yet
                pass
            time.sleep(0.25)
    finally:
        client.close()
    process.kill()
    raise SystemExit(f"attnres serve was not ready after 120 s:\n{log.read_text()[-3000:]}")


class TritonCaller:
    """One client connection per thread (as separate client processes would have)."""

    def __init__(self, protocol: str, url: str) -> None:
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self.module, self.url = module, url
        self.local = threading.local()
        self.clients: list = []

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = self.module.InferenceServerClient(self.url)
            self.clients.append(client)
        tensor = self.module.InferInput("input_ids", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        return client.infer("m", [tensor]).as_numpy("logits")

    def close(self) -> None:
        for client in self.clients:
            client.close()


def run_round(call, inputs: list[np.ndarray], clients: int) -> tuple[float, list[float]]:
    """``clients`` threads share ``inputs``; returns the wall time and each request's latency."""
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(share: list[np.ndarray]) -> None:
        for ids in share:
            start = time.perf_counter()
            call(ids)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)

    shares = [inputs[i::clients] for i in range(clients)]
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(worker, s) for s in shares]:
            future.result(timeout=600)
    return time.perf_counter() - start, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per concurrency")
    parser.add_argument("--requests", type=int, default=96, help="requests per round")
    parser.add_argument("--seq", type=int, default=32, help="tokens per request")
    parser.add_argument("--instances", type=int, default=2, help="server model instances")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="attnres-serve-bench-") as tmp:
        onnx_path = Path(tmp) / "tiny.tensorrt.onnx"
        export_checkpoint(ExportOptions(EXAMPLE, onnx_path, batch=DimRange(1, 8, 16), seq=DimRange(1, args.seq, 64),
                                        check=False))
        direct = OnnxRuntimeRunner(onnx_path)
        direct.activate()
        rng = np.random.default_rng(0)
        inputs = [rng.integers(0, 256, size=(1, args.seq), dtype=np.int64) for _ in range(args.requests)]
        process, http_url, grpc_url = start_server(onnx_path, Path(tmp) / "serve.log", args.instances,
                                                   args.max_queue_delay_us)
        caller = TritonCaller(args.protocol, http_url if args.protocol == "http" else grpc_url)
        try:
            expected = direct.infer({"input_ids": inputs[0]})["logits"]
            if not np.allclose(caller(inputs[0]), expected, rtol=1e-6, atol=1e-6):
                raise SystemExit("the server's answer differs from ONNX Runtime's")
            backends = {"attnres serve (Triton)": caller,
                        "ONNX Runtime direct": lambda ids: direct.infer({"input_ids": ids})}
            for call in backends.values():  # warm-up
                run_round(call, inputs[:16], 4)
            results = {(name, c): ([], []) for c in CONCURRENCY for name in backends}
            for _ in range(args.rounds):
                for clients in CONCURRENCY:
                    for name, call in backends.items():
                        wall, latencies = run_round(call, inputs, clients)
                        results[name, clients][0].append(wall)
                        results[name, clients][1].extend(latencies)
        finally:
            caller.close()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=120)
            direct.deactivate()
        if code != 0:
            raise SystemExit(f"attnres serve exited with {code} on SIGTERM")

    table = Table(title=f"{args.rounds} interleaved rounds of {args.requests} requests (1 x {args.seq} tokens) "
                        "per backend and concurrency")
    for column in ("backend", "clients", "requests/s", "p50 ms", "p99 ms"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for clients in CONCURRENCY:
        for name in backends:
            walls, latencies = results[name, clients]
            throughput = args.requests * len(walls) / sum(walls)
            p50 = statistics.median(latencies) * 1e3
            p99 = float(np.percentile(latencies, 99)) * 1e3
            table.add_row(name, str(clients), f"{throughput:.1f}", f"{p50:.2f}", f"{p99:.2f}")
    console.print(f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                  f"Python {platform.python_version()}; server: {args.instances} instances, max queue delay "
                  f"{args.max_queue_delay_us} us, {args.protocol}; ONNX Runtime direct: one session shared by the "
                  "client threads")
    console.print(table)


if __name__ == "__main__":
    main()
