"""``attnres serve``: an artifact on a real Triton Inference Server (PyTriton), with our runners in the model
instances: ONNX through the ONNX Runtime runner (attnres reference ops, bfloat16 emulation), engines through the
TensorRT runner.

The public ports belong to the front (front.py), which checks every request against the model's limits
(limits.py) and answers health and readiness; Triton listens on loopback ports behind it (backend.py). Triton's
dynamic batcher gathers requests for up to ``max_queue_delay_us``; each model instance owns one runner (its own
ONNX Runtime session or TensorRT context). The supervisor here watches every process that serves the model, and
Triton's health, and replaces the backend when one dies or Triton stops answering (the front reports not-ready
meanwhile). The server stops cleanly when ``stop`` is set (the command sets it on SIGINT/SIGTERM): readiness and
new requests answer 503, the front drains the requests in flight (at most ``drain_s``), then the server process
and its Python-backend stubs exit and the workspace is removed (workspace.py; by its guard if this process is
killed). Triton's own output is passed on without its known-harmless lines, and a start's output only after the
line that says where the model is served (triton_log.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnres_export.serve.backend import TritonBackend
from attnres_export.serve.contrib import refuse_length_only_attention
from attnres_export.serve.dependencies import ServeError, require
from attnres_export.serve.front import Front, FrontState
from attnres_export.serve.limits import RequestLimits, engine_limits, onnx_limits
from attnres_export.serve.signature import Signature, engine_signature, is_engine, onnx_signature
from attnres_export.serve.triton_log import TritonLog, quiet_grpc, write_stdout
from attnres_export.serve.workspace import ServeWorkspace

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
    """How long Triton waits for its own in-flight requests when it is stopped (``--exit-timeout-secs``)."""
    drain_s: float = 10.0
    """How long a stop waits for the front's requests in flight to be answered before it cuts them off."""
    show_harmless_log: bool = False
    """Show Triton's known-harmless start-up lines too (triton_log.HARMLESS; they are always in the debug log)."""


MAX_RESTARTS = 3
RESTART_WINDOW_S = 600
"""The backend is replaced at most this often in this window; a fourth failure in it (a process that serves the
model died, or Triton stopped answering its health checks) ends the server (exit 1)."""
START_ATTEMPTS = 5
"""Tries to start a backend before the server gives up (exit 1)."""
STUB_BYTES = 128 * 1024 * 1024
"""Memory one instance costs beside its model's weights: a Python-backend stub process (a Python interpreter with
PyTriton's proxy, 45 MB RSS) and its session's buffers: a second instance of the 1 MB example export added 53 MB
RSS (8 MB in the serving process); rounded up for larger activations."""


@dataclass
class ServedModel:
    """What the server runs: the model's name, signature, request limits, runners (one per instance) and
    backend."""

    name: str
    signature: Signature
    runners: list
    backend: str
    limits: RequestLimits


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


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (``None`` where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_instances(instances: int, model_bytes: int | None = None) -> None:
    """At least one instance, at most one per usable core (more only queue for the same cores: each ONNX Runtime
    session already runs one thread per core) and, once the model's size is known, no more than the available
    memory holds."""
    if instances < 1:
        raise ServeError(f"--instances {instances}: must be at least 1")
    cores = usable_cores()
    if instances > cores:
        raise ServeError(f"--instances {instances} is over this machine's {cores} usable CPU cores (one instance "
                         f"per core at most); use --instances {cores} or fewer")
    memory = available_memory()
    if model_bytes is None or memory is None:
        return
    each = model_bytes + STUB_BYTES
    if instances * each > memory:
        raise ServeError(f"--instances {instances} needs about {instances * each / 2**20:.0f} MB ({each / 2**20:.0f} "
                         f"MB each: the model's weights and a stub process); {memory / 2**20:.0f} MB is available, "
                         f"enough for {memory // each}")


def prepare_model(options: ServeOptions) -> ServedModel:
    """The artifact's runners (not yet activated), signature and request limits, instances checked against the
    machine."""
    if not Path(options.artifact).is_file():
        raise ServeError(f"{options.artifact}: no such file")
    check_instances(options.instances)
    name = model_name_for(options.artifact, options.model_name)
    if is_engine(options.artifact):
        from attnres_export.backends.factory import engine_runner

        check_instances(options.instances, Path(options.artifact).stat().st_size)
        runners = [engine_runner(Path(options.artifact), options.plugin, options.allow_engine_host_code)[0]
                   for _ in range(options.instances)]
        signature = engine_signature(runners[0]).with_max_batch(options.max_batch)
        return ServedModel(name, signature, runners, "TensorRT", engine_limits(name, signature))
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
    from attnres_export.graphs.load import load_onnx

    model = load_onnx(Path(options.artifact))
    refuse_length_only_attention(model, options.artifact)
    check_instances(options.instances, model.ByteSize())
    signature = onnx_signature(model).with_max_batch(options.max_batch)
    limits = onnx_limits(name, model, signature)
    runners = [OnnxRuntimeRunner(model, artifact=Path(options.artifact).name) for _ in range(options.instances)]
    return ServedModel(name, signature, runners, runners[0].backend, limits)


def activate(served: ServedModel, stop: threading.Event | None = None) -> None:
    """Activate every runner (stopping early when ``stop`` is set); on failure none stays active."""
    try:
        for runner in served.runners:
            if stop is not None and stop.is_set():
                break
            runner.activate()
    except BaseException:
        deactivate(served)
        raise


def deactivate(served: ServedModel) -> None:
    for runner in served.runners:
        runner.deactivate()


def load_model(options: ServeOptions, stop: threading.Event | None = None) -> ServedModel:
    """``prepare_model`` and ``activate``: runners for ``options.instances`` instances, ready to run."""
    served = prepare_model(options)
    activate(served, stop)
    return served


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


class Supervisor:
    """Runs the backend, watches it, and replaces it when a process that serves the model dies (at most
    ``MAX_RESTARTS`` times in ``RESTART_WINDOW_S``); the front reports not-ready while it is replaced.

    A start that fails is tried again, up to ``START_ATTEMPTS`` times (a loaded machine made PyTriton's
    instance handshake miss its deadline before handshake.py lengthened it).

    Each start's Triton output is held in ``output`` until the server has said that it serves (``on_ready``, or
    the event that it serves again), or until the start failed: its log comes before the error."""

    def __init__(self, served: ServedModel, options: ServeOptions, state: FrontState, workspace: ServeWorkspace,
                 on_event: Callable[[str], None], make_backend: Callable[..., TritonBackend] = TritonBackend,
                 output: TritonLog | None = None) -> None:
        self.served, self.options, self.state, self.workspace = served, options, state, workspace
        self.on_event = on_event
        self.make_backend = make_backend
        self.output = output if output is not None else TritonLog(show_harmless=options.show_harmless_log)
        self.backend: TritonBackend | None = None
        self.generation = 0
        self.infer_functions = [infer_function(r, served.signature) for r in served.runners]

    def start(self, stop: threading.Event):
        """A started backend's addresses (``None``: ``stop`` was set first), trying up to ``START_ATTEMPTS``."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.output.hold()
            self.backend = self.make_backend(self.served.name, self.served.signature, self.infer_functions,
                                             self.workspace.generation(self.generation), self.options.exit_timeout_s,
                                             self.options.max_queue_delay_us, self.workspace.leftover,
                                             on_output=self.output.feed)
            self.generation += 1
            try:
                return self.backend.start(stop)
            except ServeError as failure:
                self.output.release()
                if attempt == START_ATTEMPTS:
                    raise ServeError(f"{failure} (start {attempt} of {START_ATTEMPTS}; giving up)") from failure
                self.state.not_ready(f"the backend is starting again ({failure})")
                self.on_event(f"{failure}; starting the backend again (start {attempt + 1} of {START_ATTEMPTS})")
                self.stop_backend()
        return None

    def run(self, stop: threading.Event, on_ready: Callable[[], None], poll_s: float) -> None:
        """Until ``stop`` is set (the backend then still runs: ``stop_backend`` after the front has drained)."""
        deaths: deque[float] = deque()
        announced = False
        while not stop.is_set():
            addresses = self.start(stop)
            if addresses is None:
                return
            self.state.serving(addresses.http, addresses.grpc, addresses.metrics)
            if not announced:
                on_ready()
                announced = True
            else:
                self.on_event(f"the backend is serving {self.served.name} again")
            self.output.release()
            dead = None
            while dead is None and not stop.wait(poll_s):
                dead = self.backend.dead()
            if dead is None:
                return
            self.state.not_ready(f"{dead}; the backend is restarting")
            now = time.monotonic()
            deaths.append(now)
            while deaths[0] < now - RESTART_WINDOW_S:
                deaths.popleft()
            if len(deaths) > MAX_RESTARTS:
                raise ServeError(f"{dead}, the backend's {len(deaths)}th failure in {RESTART_WINDOW_S // 60} "
                                 "minutes; giving up")
            self.on_event(f"{dead}; restarting the backend (restart {len(deaths)} of at most {MAX_RESTARTS} "
                          f"in {RESTART_WINDOW_S // 60} minutes)")
            self.stop_backend()

    def stop_backend(self) -> None:
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
        self.workspace.remove_leftovers()


def serve(options: ServeOptions, stop: threading.Event, on_ready: Callable[[ServedModel, Endpoints], None],
          on_event: Callable[[str], None] = lambda _: None, poll_s: float = 0.5,
          on_triton: Callable[[str], None] = write_stdout) -> None:
    """Run the server until ``stop`` is set (or the backend keeps dying: an error); always stops the front, the
    backend and the runners, and removes the workspace. Triton's lines go to ``on_triton`` (triton_log.py)."""
    quiet_grpc()
    for module in ("tritonclient.http", "tritonclient.grpc.service_pb2", "pytriton.triton", "aiohttp", "grpc.aio"):
        require(module, "attnres serve")
    check_ports(options)
    served = prepare_model(options)
    state = FrontState(served.name, served.limits)
    front = Front(state, options.host, options.http_port, options.grpc_port, options.metrics_port,
                  drain_s=options.drain_s)
    output = TritonLog(on_triton, options.show_harmless_log)
    with ServeWorkspace(served.name, len(served.runners)) as workspace:
        supervisor = Supervisor(served, options, state, workspace, on_event, output=output)
        front.start()
        try:
            activate(served, stop)
            supervisor.run(stop, lambda: on_ready(served, endpoints(options)), poll_s)
        finally:
            output.release()
            state.not_ready("the server is shutting down")
            cut = front.stop()
            if cut:
                on_event(f"{cut} request(s) still in flight after the {options.drain_s:.0f} s drain were cut off")
            supervisor.stop_backend()
            output.close()
            deactivate(served)
