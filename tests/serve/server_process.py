"""Start ``attnres serve`` as a subprocess on free loopback ports and wait (bounded) until its model is ready;
used by the real-server tests and benchmarks/serve_throughput.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from attnres_export.serve.backend import descendants, loopback_ports

LAUNCH = "from attnres_export.cli import main; main()"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(condition, timeout_s: float, step_s: float = 0.1) -> float | None:
    """Seconds until ``condition()`` held (``None``: it did not within ``timeout_s``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(step_s)
    return None


@dataclass
class Server:
    process: subprocess.Popen
    model: str
    http: str
    grpc: str
    metrics: str
    log: Path

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60) -> tuple[int, set[int]]:
        """Signal the server, wait (bounded) for it to exit; returns its exit code and the descendants that
        outlived it (all of them are killed before returning)."""
        children = descendants(self.process.pid)
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        left = {p for p in children if alive(p)}
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = {p for p in left if alive(p)}
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return code, left

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def status(self, path: str) -> int | None:
        """The HTTP status of GET ``path`` on the front (``None``: nothing answered)."""
        try:
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None


def launch(artifact: Path, log: Path, *args: str, model: str = "m", env: dict | None = None) -> Server:
    """``attnres serve ARTIFACT --model-name MODEL`` on free loopback ports, started (not yet ready)."""
    http_port, grpc_port, metrics_port = loopback_ports(3)
    command = [sys.executable, "-c", LAUNCH, "serve", str(artifact), "--model-name", model,
               "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
               *args]
    with log.open("wb") as sink:
        # A session of its own, as a server started from a shell or a service manager has: a signal to its
        # process group (Ctrl-C in a terminal, ``kill -- -PGID``) then reaches the server, not pytest.
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
    return Server(process, model, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}",
                  log)


def wait_ready(server: Server, timeout_s: float) -> Server:
    """``server`` once its server and model readiness both answer true (bounded; killed when it is not)."""
    import tritonclient.http as http

    deadline = time.monotonic() + timeout_s
    client = http.InferenceServerClient(server.http)
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"attnres serve exited with {server.process.returncode}:\n"
                                   f"{server.output()[-3000:]}")
            try:
                if client.is_server_ready() and client.is_model_ready(server.model):
                    return server
            except Exception:  # not listening yet
                pass
            time.sleep(0.25)
    finally:
        client.close()
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"attnres serve was not ready after {timeout_s} s:\n{server.output()[-3000:]}")


def start_server(artifact: Path, log: Path, *args: str, model: str = "m", timeout_s: float = 240) -> Server:
    """``attnres serve ARTIFACT --model-name MODEL`` on free loopback ports, ready to answer (the timeout
    leaves room for the backend's start retries on a loaded machine)."""
    return wait_ready(launch(artifact, log, *args, model=model), timeout_s)
