"""``attnres serve`` on a real Triton server (PyTriton, CPU): several concurrent HTTP and gRPC clients get
exactly what ONNX Runtime computes directly, no request is lost, Triton batched them, and SIGTERM stops the
server and every process it started. One server for the module; the shutdown test runs last."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from attnres_export.serve.triton_log import HARMLESS, harmless
from tests.serve.conftest import NEEDS_SERVER
from tests.serve.server_process import start_server, wait_for

pytestmark = [NEEDS_SERVER, pytest.mark.slow]
CLIENTS, REQUESTS_PER_CLIENT = 8, 6


@pytest.fixture(scope="module")
def server(served_onnx, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    # A long queue delay so that concurrent single-row requests are batched on this small machine.
    running = start_server(served_onnx, log, "--instances", "2", "--max-queue-delay-us", "50000")
    yield running
    if running.process.poll() is None:
        running.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(served_onnx):
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    runner = OnnxRuntimeRunner(served_onnx)
    runner.activate()
    lock = threading.Lock()

    def run(ids: np.ndarray) -> np.ndarray:
        with lock:
            return runner.infer({"input_ids": ids})["logits"]

    yield run
    runner.deactivate()


def test_health_and_the_models_real_inputs_and_outputs(server):
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    with http.InferenceServerClient(server.http) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(server.model)
        metadata = client.get_model_metadata(server.model)
        config = client.get_model_config(server.model)
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("input_ids", "INT64",
                                                                                    [-1, -1])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [("logits", "FP32",
                                                                                     [-1, -1, 97])]
    assert config["max_batch_size"] == 16 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 50000
    assert sum(g["count"] for g in config["instance_group"]) == 2
    grpc_client = grpc.InferenceServerClient(server.grpc)
    try:
        assert grpc_client.is_server_live() and grpc_client.is_model_ready(server.model)
    finally:
        grpc_client.close()
    assert "serving m (onnxruntime+ref-ops, 2 instance(s), dynamic batching up to 16" in server.output()


def test_the_served_line_comes_first_and_tritons_harmless_start_up_lines_are_not_shown(server):
    assert wait_for(lambda: "successfully loaded 'm'" in server.output(), 30) is not None, server.output()[-3000:]
    output = server.output()
    # A start that failed on a loaded machine shows its log, then the line saying the backend starts again
    # (Supervisor.start); the start that serves is held behind the served line all the same.
    retried = output.rfind("starting the backend again")
    serving_start = output[output.index("\n", retried) + 1:] if retried >= 0 else output
    assert serving_start.startswith("serving m ("), output
    assert serving_start.index("Started HTTPService") < serving_start.index("successfully loaded"), output
    for entry in HARMLESS:
        assert not any(harmless(line) is entry for line in output.splitlines()), entry.message
    assert "fork_posix.cc" not in output  # gRPC's own start-up line, in this process


def _infer(protocol: str, address: str, model: str, ids: np.ndarray) -> np.ndarray:
    if protocol == "http":
        import tritonclient.http as client_module
    else:
        import tritonclient.grpc as client_module
    client = client_module.InferenceServerClient(address)
    try:
        tensor = client_module.InferInput("input_ids", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        timeout = {"client_timeout": 60} if protocol == "grpc" else {}
        return client.infer(model, [tensor], **timeout).as_numpy("logits")
    finally:
        client.close()


def test_concurrent_clients_get_what_onnx_runtime_computes_and_triton_batches_them(server, reference):
    import tritonclient.http as http

    with http.InferenceServerClient(server.http) as client:
        before = client.get_inference_statistics(server.model)["model_stats"][0]
    rng = np.random.default_rng(0)
    jobs = []
    for client_index in range(CLIENTS):
        protocol = "http" if client_index % 2 == 0 else "grpc"
        address = server.http if protocol == "http" else server.grpc
        for request_index in range(REQUESTS_PER_CLIENT):
            seq = (4, 8)[request_index % 2]
            jobs.append((protocol, address, rng.integers(0, 97, size=(1, seq), dtype=np.int64)))

    def client_run(first: int) -> list[np.ndarray]:
        return [_infer(p, a, server.model, ids) for p, a, ids in jobs[first:first + REQUESTS_PER_CLIENT]]

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(client_run, i * REQUESTS_PER_CLIENT) for i in range(CLIENTS)]
        answers = [a for f in futures for a in f.result(timeout=120)]
    assert len(answers) == len(jobs) == CLIENTS * REQUESTS_PER_CLIENT
    for (_, _, ids), answer in zip(jobs, answers, strict=True):
        expected = reference(ids)
        assert answer.shape == expected.shape and answer.dtype == expected.dtype
        # Bitwise equal on the machines tried; batched rows may take other kernel paths elsewhere, so allow
        # float32 rounding.
        np.testing.assert_allclose(answer, expected, rtol=1e-6, atol=1e-6)
    with http.InferenceServerClient(server.http) as client:
        after = client.get_inference_statistics(server.model)["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == len(jobs), "a request was lost or counted twice"
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert executions < requests, f"no batching: {executions} executions for {requests} single-row requests"
    assert any(int(b["batch_size"]) > 1 for b in after["batch_stats"])


def test_requests_outside_the_limits_get_one_line_and_the_server_keeps_serving(server, reference):
    import tritonclient.grpc as grpc
    import tritonclient.utils as utils

    def post(body: bytes) -> tuple[int, str]:
        request = urllib.request.Request(f"http://{server.http}/v2/models/{server.model}/infer", data=body)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, ""
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())["error"]

    def ids(data) -> bytes:
        return json.dumps({"inputs": [{"name": "input_ids", "shape": [len(data), len(data[0])], "datatype": "INT64",
                                       "data": data}]}).encode()

    answers = [post(ids([[-1, 2]])), post(ids([[1] * 65])), post(b"[" * 50_000), post(b"[" * 1_000_000)]
    assert [status for status, _ in answers] == [400, 400, 400, 413], answers
    assert answers[0][1] == "input 'input_ids' holds -1; values must lie in [0, 97) (the vocabulary of 97 tokens)"
    assert answers[1][1] == ("input 'input_ids' dim 1 (seq) is 65; this model accepts 1 to 64 (the range it was "
                             "exported for)")
    assert all("\n" not in message and "Traceback" not in message for _, message in answers)
    client = grpc.InferenceServerClient(server.grpc)
    try:
        tensor = grpc.InferInput("input_ids", [1, 2], "INT64")
        tensor.set_data_from_numpy(np.array([[3, 97]], dtype=np.int64))
        with pytest.raises(utils.InferenceServerException) as caught:
            client.infer(server.model, [tensor], client_timeout=60)
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT" and "holds 97" in caught.value.message()
    ids_ok = np.array([[5, 7, 11]], dtype=np.int64)
    np.testing.assert_allclose(_infer("http", server.http, server.model, ids_ok), reference(ids_ok),
                               rtol=1e-6, atol=1e-6)
    assert server.process.poll() is None


def test_sigterm_stops_the_server_and_every_process_it_started(server):
    code, left = server.stop(signal.SIGTERM)
    assert code == 0, server.output()[-3000:]
    assert left == set(), f"processes outlived the server: {sorted(left)}"
    assert "stopped (SIGTERM); the server shut down cleanly" in server.output()
