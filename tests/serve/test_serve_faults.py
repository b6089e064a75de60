"""``attnres serve`` survives its faults: a SIGTERM or SIGINT while clients send requests, to the command or to its
whole process group, answers every request in flight (readiness and new requests get 503 meanwhile) and exits 0;
a killed or hung ``tritonserver`` is noticed within seconds and replaced, and what it left (processes, shared
memory, model copies, its workspace) is removed. The live-server tests are slow; the drain, the health watch and
the process group are also tested here without a server."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from attnres_export.serve.backend import (
    HEALTH_TIMEOUT_S,
    HUNG_AFTER_S,
    STUB,
    HealthWatch,
    Process,
    TritonBackend,
    command_line,
    descendants,
    loopback_ports,
    own_group,
    own_process_group,
)
from attnres_export.serve.front import Front, FrontState
from attnres_export.serve.limits import onnx_limits
from attnres_export.serve.signature import onnx_signature
from attnres_export.serve.workspace import SHM_DIR, shm_prefix
from tests.serve.conftest import NEEDS_SERVER
from tests.serve.models import tiny_onnx
from tests.serve.server_process import Server, alive, launch, wait_for, wait_ready
from tests.serve.test_front import FakeTriton, call
from tests.serve.test_front import infer as infer_body
from tests.serve.test_server import _infer

pytestmark = NEEDS_SERVER
SHUTTING_DOWN = {"error": "model 'm' is not ready: the server is shutting down"}
START_S = 240  # a loaded two-core machine needed up to three starts of the backend
CLIENTS = 8
QUEUE_DELAY_US = 1_500_000
"""Longer than any scheduling hiccup: 8 single-row requests never fill a batch of 16, so Triton's batcher holds
each round of requests this long, and a SIGTERM sent mid-round finds all eight in flight."""


@pytest.fixture
def front(tmp_path):
    """A front on free loopback ports with a 10 s drain, in front of nothing yet."""
    model = onnx.load(str(tiny_onnx(tmp_path / "tiny.onnx")))
    ports = loopback_ports(3)
    running = Front(FrontState("m", onnx_limits("m", model, onnx_signature(model))), "127.0.0.1", *ports,
                    drain_s=10)
    running.start()
    running.url = f"http://127.0.0.1:{ports[0]}"
    yield running
    running.stop()


def test_stopping_answers_requests_in_flight_while_readiness_and_new_requests_get_503(front):
    answers = []
    with FakeTriton(delay_s=1) as triton:
        front.state.serving(f"127.0.0.1:{triton.port}", "127.0.0.1:1", f"127.0.0.1:{triton.port}")
        clients = [threading.Thread(target=lambda: answers.append(call(f"{front.url}/v2/models/m/infer",
                                                                       infer_body([[1]])))) for _ in range(4)]
        for client in clients:
            client.start()
        assert wait_for(lambda: len(triton.bodies) == 4, 10)
        front.state.not_ready("the server is shutting down")  # what serve() does first
        stopping = threading.Thread(target=front.stop)
        stopping.start()
        time.sleep(0.2)
        assert call(f"{front.url}/v2/health/ready")[0] == 503
        assert call(f"{front.url}/v2/models/m/infer", infer_body([[1]])) == (503, SHUTTING_DOWN)
        stopping.join(30)
        for client in clients:
            client.join(30)
    assert answers == [(200, {"model_name": "m", "outputs": []})] * 4
    assert front.cut == 0 and len(triton.bodies) == 4


def test_the_drain_is_bounded_and_says_how_many_requests_it_cut(front):
    front.drain_s = 0.3
    answers = []
    with FakeTriton(delay_s=4) as triton:
        front.state.serving(f"127.0.0.1:{triton.port}", "127.0.0.1:1", f"127.0.0.1:{triton.port}")
        client = threading.Thread(target=lambda: answers.append(post_infer_to(front.url, [[1]])))
        client.start()
        assert wait_for(lambda: triton.bodies, 10)
        front.state.not_ready("the server is shutting down")
        started = time.monotonic()
        assert front.stop() == 1
        assert time.monotonic() - started < 3
        client.join(30)
    assert answers and answers[0][0] != 200


def test_a_tritonserver_that_stops_answering_health_checks_counts_as_dead_within_seconds():
    backend = TritonBackend("m", None, [], Path("unused"), 10, 2000)
    backend.watched = [Process.of(os.getpid(), "tritonserver")]
    with FakeTriton() as triton:  # answers its readiness
        backend.health = HealthWatch(f"127.0.0.1:{triton.port}", "m", period_s=0.05, timeout_s=0.5,
                                     hung_after_s=0.3)
        assert wait_for(lambda: backend.dead() is not None, 1) is None
    with socket.socket() as silent:  # accepts connections and never answers: a stopped or deadlocked server
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        backend.health = HealthWatch(f"127.0.0.1:{silent.getsockname()[1]}", "m", period_s=0.05, timeout_s=0.1,
                                     hung_after_s=1)
        noticed = wait_for(lambda: backend.dead() is not None, 10)
    assert noticed is not None and 0.9 < noticed < 3
    assert backend.dead() == f"tritonserver (pid {os.getpid()}) answered no health check for 1 s" and backend.hung


def test_triton_runs_in_a_process_group_of_its_own_that_stopping_kills_whole():
    import sh  # what PyTriton starts tritonserver with

    with own_process_group():
        leader = sh.Command("/bin/sh")("-c", "sleep 60 & wait", _bg=True, _bg_exc=False).pid
    assert wait_for(lambda: descendants(leader), 10)
    child = next(iter(descendants(leader)))
    assert os.getpgid(leader) == os.getpgid(child) == leader != os.getpgrp()
    outside = sh.Command("/bin/sh")("-c", "cut -d' ' -f5 /proc/$$/stat")  # the process group of a later fork
    assert int(str(outside)) == os.getpgrp()
    backend = TritonBackend("m", None, [], Path("unused"), 10, 2000)
    backend.group, backend.hung = Process.of(own_group(leader), "sh"), True
    backend.stop()
    assert wait_for(lambda: not alive(leader) and not alive(child), 10)


@dataclass
class Answer:
    sent: float
    done: float
    status: int | None
    body: str


def post_infer(server: Server, ids: list[list[int]]) -> tuple[int | None, str]:
    return post_infer_to(f"http://{server.http}", ids, server.model)


def post_infer_to(url: str, ids: list[list[int]], model: str = "m") -> tuple[int | None, str]:
    """One request on a new connection: its status and body (``None``: refused, the server stopped listening)."""
    request = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=infer_body(ids))
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return None, type(error).__name__


class KeepAlive:
    """An HTTP client on one kept-alive connection (what tritonclient and requests sessions do)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.connection = http.client.HTTPConnection(*server.http.split(":"), timeout=30)

    def send(self, ids: list[list[int]]) -> tuple[int | None, str]:
        try:
            self.connection.request("POST", f"/v2/models/{self.server.model}/infer", body=infer_body(ids))
            answer = self.connection.getresponse()
            return answer.status, answer.read().decode(errors="replace")
        except OSError as error:  # closed or refused: the server stopped listening
            self.connection.close()
            return None, type(error).__name__


class Grpc:
    """A tritonclient gRPC client (one channel); a refusal by the front is UNAVAILABLE, counted as 503, and a call
    that arrives as the port closes is CANCELLED by gRPC itself, counted as a closed connection."""

    def __init__(self, server: Server) -> None:
        import tritonclient.grpc as grpc

        self.grpc, self.server = grpc, server
        self.client = grpc.InferenceServerClient(server.grpc)

    def send(self, ids: list[list[int]]) -> tuple[int | None, str]:
        from tritonclient.utils import InferenceServerException

        tensor = self.grpc.InferInput("input_ids", [len(ids), len(ids[0])], "INT64")
        tensor.set_data_from_numpy(np.array(ids, dtype=np.int64))
        try:
            self.client.infer(self.server.model, [tensor], client_timeout=30)
        except InferenceServerException as error:
            message = error.message() or ""
            if error.status() == "StatusCode.UNAVAILABLE" and "is not ready" in message:  # refused by the front
                return 503, json.dumps({"error": message})
            if error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"):  # the port closing or closed
                return None, message
            return 500, f"{error.status()}: {message}"
        return 200, ""


@pytest.mark.slow
@pytest.mark.parametrize("signum, group", [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGTERM, True)],
                         ids=["SIGTERM to the command", "Ctrl-C (SIGINT to its process group)",
                              "SIGTERM to its process group"])
def test_a_stop_signal_answers_every_request_in_flight_refuses_new_ones_with_503_and_exits_0(
        served_onnx, tmp_path, signum, group):
    server = wait_ready(launch(served_onnx, tmp_path / "serve.log", "--max-queue-delay-us", str(QUEUE_DELAY_US)),
                        START_S)
    answers: list[list[Answer]] = [[] for _ in range(CLIENTS)]
    stopping = threading.Event()

    def client(index: int) -> None:
        sender = KeepAlive(server) if index % 2 == 0 else Grpc(server)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sent = time.monotonic()
            status, body = sender.send([[index, 1, 2, 3]])
            answers[index].append(Answer(sent, time.monotonic(), status, body))
            if status != 200 and stopping.is_set():
                return

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        assert wait_for(lambda: all(a and a[-1].status == 200 for a in answers), 60), answers
        time.sleep(QUEUE_DELAY_US / 2e6)  # the next round is queued in Triton's batcher
        started = descendants(server.process.pid)
        signalled = time.monotonic()
        stopping.set()
        if group:
            os.killpg(server.process.pid, signum)
        else:
            server.process.send_signal(signum)
        time.sleep(0.3)
        # Draining: readiness is off and a new request is refused in one line while the round finishes.
        ready, refused = server.status("/v2/health/ready"), post_infer(server, [[1]])
        for thread in threads:
            thread.join(60)
        code = server.process.wait(timeout=60)
    finally:
        if server.process.poll() is None:
            server.stop(signal.SIGKILL)
    in_flight = [a for each in answers for a in each if a.sent < signalled < a.done]
    assert len(in_flight) >= CLIENTS, answers
    early = [a for each in answers for a in each if a.sent < signalled - 0.2]
    assert all(a.status == 200 for a in early), [a for a in early if a.status != 200]
    late = [a for each in answers for a in each if a.sent >= signalled - 0.2]
    wrong = [a for a in late if a.status not in (200, None) and (a.status, a.body) != (503, json.dumps(SHUTTING_DOWN))]
    assert not wrong, (signalled, wrong, server.output()[-3000:])
    assert ready == 503 and refused == (503, json.dumps(SHUTTING_DOWN)), (ready, refused)
    assert code == 0, server.output()[-3000:]
    assert f"stopped ({signum.name}); the server shut down cleanly" in server.output()
    assert wait_for(lambda: not any(alive(p) for p in started), 10), [p for p in started if alive(p)]


def tritonserver(server: Server) -> int:
    return next(p for p in descendants(server.process.pid)
                if command_line(p)[:1] and command_line(p)[0].endswith("/bin/tritonserver"))


@dataclass
class Left:
    """What one backend of a server runs and holds: its processes, model copies, workspace and shared memory."""

    processes: set[int]
    folders: list[Path]
    workspace: Path
    regions: set[str]

    @classmethod
    def of(cls, server: Server) -> Left:
        triton = tritonserver(server)
        below = descendants(triton)
        folders = [Path(command_line(p)[1]).parents[1] for p in below
                   if command_line(p)[:1] and command_line(p)[0].endswith(STUB)]
        workspace = Path(command_line(triton)[0]).parents[2]
        return cls({triton, *below}, folders, workspace, set(regions(server)))

    def remaining(self, server: Server) -> dict:
        return {k: v for k, v in {
            "processes": sorted(p for p in self.processes if alive(p)),
            "folders": [f for f in self.folders if f.exists()],
            "workspace": self.workspace if self.workspace.exists() else None,
            "regions": sorted(self.regions & set(regions(server)))}.items() if v}


def regions(server: Server) -> list[str]:
    return [p.name for p in SHM_DIR.glob(f"{shm_prefix(server.process.pid)}*")] if SHM_DIR.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("signum, noticed_s, reported", [
    (signal.SIGKILL, 5, "died"),
    (signal.SIGSTOP, HUNG_AFTER_S + HEALTH_TIMEOUT_S + 5, f"answered no health check for {HUNG_AFTER_S:.0f} s")],
    ids=["killed", "hung"])
def test_a_killed_or_hung_tritonserver_is_noticed_within_seconds_and_replaced_leaving_nothing(
        served_onnx, tmp_path, signum, noticed_s, reported):
    ids = np.array([[3, 1, 4, 1, 5]], dtype=np.int64)
    server = wait_ready(launch(served_onnx, tmp_path / "serve.log"), START_S)
    try:
        expected = _infer("http", server.http, server.model, ids)
        first = Left.of(server)
        assert first.folders and first.regions and first.workspace.name.startswith("triton-"), first
        killed = tritonserver(server)
        os.kill(killed, signum)
        noticed = wait_for(lambda: server.status("/v2/health/ready") == 503, noticed_s, step_s=0.05)
        assert noticed is not None, server.output()[-3000:]
        assert wait_for(lambda: f"tritonserver (pid {killed}) {reported}; restarting the backend" in server.output(),
                        5), server.output()[-3000:]
        # Nothing of the replaced backend is left: its processes, model copies, workspace folder, shared memory.
        assert wait_for(lambda: not first.remaining(server), 15, step_s=0.2), first.remaining(server)
        assert wait_for(lambda: server.status("/v2/health/ready") == 200, START_S, step_s=0.5), \
            server.output()[-3000:]
        assert "the backend is serving m again" in server.output()
        np.testing.assert_array_equal(_infer("grpc", server.grpc, server.model, ids), expected)
        second = Left.of(server)
        assert second.workspace != first.workspace
        code, outlived = server.stop(signal.SIGTERM)
        assert code == 0 and not outlived, server.output()[-3000:]
        assert not first.remaining(server) and not second.remaining(server)
        assert not second.workspace.parent.exists() and not regions(server)
    finally:
        if server.process.poll() is None:
            server.stop(signal.SIGKILL)
