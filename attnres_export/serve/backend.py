"""One Triton server started by PyTriton on loopback ports for ``attnres serve``'s front, and a watch on every
process that serves the model: ``tritonserver``, one Python-backend stub per instance, and what the stubs start
(PyTriton's tensor store), and on its health: a server that stops answering its loopback readiness endpoint
(stopped, deadlocked) counts as dead. Triton's Python backend does not restart a stub that died: it answers every
request routed to that instance with "Stub process ... is not healthy" while its readiness stays true, so the
supervisor (server.py) replaces the whole backend instead.

``tritonserver`` and everything it starts run in a process group of their own: a signal sent to the command's
process group (Ctrl-C in a terminal, ``kill -- -PGID``) reaches only ``attnres serve``, which drains the front
before it stops Triton, instead of killing the stubs' tensor stores under requests in flight (measured before: every
in-flight request answered 500 ``BrokenPipeError``). A stopped backend's group is killed whole, so nothing it
started outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnres_export.serve.dependencies import ServeError, require, server_environment
from attnres_export.serve.proxy_patches import patch_proxy, patch_server_start, triton_output
from attnres_export.serve.wire import one_line

STUB = "triton_python_backend_stub"
START_GRACE_S = 30
"""How long after PyTriton has prepared the server a ``tritonserver`` process must be seen running (on a loaded
two-core machine the gap was measured above 5 s)."""
RESTRICTED = ["shared-memory", "model-repository", "trace", "logging"]
"""Endpoints that change the server: they keep PyTriton's generated access token (statistics stay readable)."""
HEALTH_PERIOD_S = 1.0
"""How often the watch asks Triton whether the model is ready (on its loopback HTTP port)."""
HEALTH_TIMEOUT_S = 2.0
"""How long one health question waits for its answer."""
HUNG_AFTER_S = 6.0
"""A server that has answered no health question for this long counts as dead: a stopped or deadlocked
``tritonserver`` keeps its pid and readiness, and requests sent to it waited forever (measured before: readiness 200
and a request unanswered after 20 s, 10 s after a SIGSTOP)."""
REAP_WAIT_S = 10.0
"""How long a stop waits for PyTriton to see a killed server exit (it exits at once; this only bounds it)."""

_fork_policy = threading.local()
"""``own_group`` is true on the thread that starts Triton: what it forks gets a process group of its own."""


def _own_process_group() -> None:
    """Run in every child ``os.fork`` makes (PyTriton starts ``tritonserver`` through ``sh``, which forks)."""
    if getattr(_fork_policy, "own_group", False):
        os.setpgid(0, 0)


os.register_at_fork(after_in_child=_own_process_group)


@contextlib.contextmanager
def own_process_group():
    """Processes this thread forks meanwhile lead a process group of their own (and what they start joins it)."""
    _fork_policy.own_group = True
    try:
        yield
    finally:
        _fork_policy.own_group = False


def loopback_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (Triton binds them a moment later)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class Process:
    """A process by pid and start time (a pid reused by a later process is not this one)."""

    pid: int
    started: str
    what: str

    @staticmethod
    def stat(pid: int) -> list[str] | None:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None

    @classmethod
    def of(cls, pid: int, what: str) -> Process | None:
        fields = cls.stat(pid)
        return None if fields is None else cls(pid, fields[19], what)

    def alive(self) -> bool:
        fields = self.stat(self.pid)
        return fields is not None and fields[0] not in ("Z", "X") and fields[19] == self.started


def command_line(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def children(pid: int) -> set[int]:
    """The children of ``pid``; none once it has gone (its /proc folder can vanish while being listed, which
    raises ProcessLookupError from the listing itself)."""
    found = set()
    try:
        listings = list(Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return found
    for listing in listings:
        with contextlib.suppress(OSError, ValueError):
            found |= {int(c) for c in listing.read_text().split()}
    return found


def own_group(pid: int | None) -> int | None:
    """``pid`` when it leads a process group of its own (not this process's), else ``None``."""
    try:
        return pid if pid is not None and os.getpgid(pid) == pid != os.getpgrp() else None
    except ProcessLookupError:
        return None


def descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        kids = children(frontier.pop()) - found
        found |= kids
        frontier.extend(kids)
    return found


@dataclass(frozen=True)
class Addresses:
    http: str
    grpc: str
    metrics: str


class HealthWatch:
    """Asks ``GET /v2/models/MODEL/ready`` at ``address`` at most every ``period_s``; ``hung`` once no question
    has been answered 200 for ``hung_after_s`` (a watch starts as just answered)."""

    def __init__(self, address: str, model: str, period_s: float = HEALTH_PERIOD_S,
                 timeout_s: float = HEALTH_TIMEOUT_S, hung_after_s: float = HUNG_AFTER_S) -> None:
        self.host, _, port = address.rpartition(":")
        self.port, self.path = int(port), f"/v2/models/{model}/ready"
        self.period_s, self.timeout_s, self.hung_after_s = period_s, timeout_s, hung_after_s
        self.answered = self.asked = time.monotonic()

    def healthy(self) -> bool:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request("GET", self.path)
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def hung(self) -> bool:
        if time.monotonic() - self.asked >= self.period_s:
            if self.healthy():
                self.answered = time.monotonic()
            self.asked = time.monotonic()
        return time.monotonic() - self.answered > self.hung_after_s


class TritonBackend:
    """``start`` runs Triton with ``infer_functions`` (one per instance) bound as ``model``, waits until the model
    is ready and every stub runs, and returns the loopback addresses; ``dead`` says what ended it (a watched process
    died, the server stopped answering) or ``None``; ``stop`` stops it all (idempotent)."""

    def __init__(self, model: str, signature, infer_functions: list, workspace: Path, exit_timeout_s: int,
                 max_queue_delay_us: int, on_folder: Callable[[Path], None] = lambda _: None,
                 on_output: Callable[[bytes | str], None] | None = None) -> None:
        self.model = model
        self.signature = signature
        self.infer_functions = infer_functions
        self.workspace = workspace
        self.exit_timeout_s = exit_timeout_s
        self.max_queue_delay_us = max_queue_delay_us
        self.on_folder = on_folder
        """Told each folder Triton makes for the model, as soon as it is seen (workspace.leftover)."""
        self.on_output = on_output
        """Given Triton's output as it comes, in chunks (triton_log.TritonLog.feed; ``None``: PyTriton prints it)."""
        self.triton = None
        self.watched: list[Process] = []
        self.health: HealthWatch | None = None
        self.hung = False
        self.group: Process | None = None
        """The leader of the process group of ``tritonserver`` and what it started (the server itself)."""
        self.model_folders: list[Path] = []
        self.abandoned = False
        self._release = threading.Event()

    def _bind(self, triton_module, model_config, ports: list[int]):
        sig = self.signature
        config = triton_module.TritonConfig(
            http_address="127.0.0.1", http_port=ports[0], grpc_address="127.0.0.1", grpc_port=ports[1],
            metrics_address="127.0.0.1", metrics_port=ports[2], exit_timeout_secs=self.exit_timeout_s,
            allow_gpu_metrics=False, log_verbose=0)
        security = triton_module.TritonSecurityConfig(restricted_endpoints=RESTRICTED)

        def tensors(specs):
            return [model_config.Tensor(name=s.name, dtype=np.dtype(s.served_dtype),
                                        shape=tuple(s.dims[1:] if sig.batched else s.dims)) for s in specs]

        bound = model_config.ModelConfig(
            max_batch_size=sig.max_batch, batching=sig.batched,
            batcher=model_config.DynamicBatcher(max_queue_delay_microseconds=self.max_queue_delay_us))
        self.triton = triton_module.Triton(config=config, workspace=self.workspace, security_config=security)
        self.triton.bind(model_name=self.model, infer_func=self.infer_functions, inputs=tensors(sig.inputs),
                         outputs=tensors(sig.outputs), config=bound, strict=True)

    def start(self, stop: threading.Event, timeout_s: float = 180) -> Addresses | None:
        """Triton's loopback addresses once the model is ready, or ``None`` when ``stop`` was set first.

        PyTriton's ``run`` blocks for up to 120 s when ``tritonserver`` dies while starting (it polls the dead
        server until its timeout, holding a lock ``stop`` needs), so it runs on a thread of its own, which stays
        until ``stop``, and is abandoned when ``stop`` is set or the server process is gone."""
        triton_module = require("pytriton.triton", "attnres serve")
        model_config = require("pytriton.model_config", "attnres serve")
        http = require("tritonclient.http", "attnres serve")
        patch_proxy(require("pytriton.models.model", "attnres serve").Model,
                    require("pytriton.proxy.data", "attnres serve").TensorStore)
        patch_server_start(require("pytriton.server.triton_server", "attnres serve").TritonServer)
        ports = loopback_ports(3)
        self._bind(triton_module, model_config, ports)
        # The Python-backend stub links libpython3.X: this interpreter's must come first (server_environment).
        library_path = server_environment().get("LD_LIBRARY_PATH")
        if library_path:
            os.environ["LD_LIBRARY_PATH"] = library_path
        failure: list[BaseException] = []
        ran = threading.Event()

        def run() -> None:
            try:
                with own_process_group(), triton_output(self.on_output):
                    self.triton.run()
            except BaseException as exc:  # reported by the waiting thread
                failure.append(exc)
                return
            ran.set()
            # PyTriton gives tritonserver a parent-death signal, and Linux sends it when the *thread* that
            # started the server ends: this thread lives as long as the server should.
            self._release.wait()

        starter = threading.Thread(target=run, name="attnres-triton-start", daemon=True)
        starter.start()
        addresses = Addresses(*(f"127.0.0.1:{p}" for p in ports))
        deadline = time.monotonic() + timeout_s
        server: Process | None = None
        prepared = None
        stub_copy = self.workspace / "tritonserver" / "backends" / "python" / STUB
        with http.InferenceServerClient(addresses.http) as client:
            while not ran.is_set() or not self._ready(client):
                if failure:
                    detail = one_line(str(failure[0])) if str(failure[0]) else type(failure[0]).__name__
                    raise ServeError(f"Triton did not start ({detail}); see its log above")
                if stop.wait(0.1):
                    self._abandon()
                    return None
                if server is None:
                    pid = self.server_pid()
                    server = Process.of(pid, "tritonserver") if pid is not None else None
                    self.group = self.group or (server if own_group(pid) else None)
                if server is not None:
                    self._note_model_folders(server.pid)
                # PyTriton copies the stub last, just before it starts the server: a server not seen running
                # long after that died at once (a missing library, say).
                prepared = prepared or (time.monotonic() if stub_copy.exists() else None)
                never_ran = server is None and prepared and time.monotonic() - prepared > START_GRACE_S
                if never_ran or (server is not None and not server.alive()):
                    self._abandon()
                    raise ServeError("tritonserver exited while starting; see its log above")
                if time.monotonic() > deadline:
                    self._abandon()
                    raise ServeError(f"model {self.model!r} was not ready {timeout_s:.0f} s after Triton started; "
                                     "see its log above")
        self.health = HealthWatch(addresses.http, self.model)
        return addresses

    def server_pid(self) -> int | None:
        """This backend's ``tritonserver`` (a child of this process, run from its workspace), if it runs."""
        binary = str(self.workspace.resolve() / "tritonserver" / "bin" / "tritonserver")
        return next((p for p in children(os.getpid()) if command_line(p)[:1] == [binary]), None)

    def _abandon(self) -> None:
        """Give up a start that is still in PyTriton's hands: stop its server process, and drop PyTriton's exit
        hook (which would wait for the start's lock)."""
        self.abandoned = True
        self._release.set()
        atexit.unregister(self.triton.stop)
        server = self.server_pid()
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGTERM)

    def _ready(self, client) -> bool:
        """Triton reports the model ready and one stub per instance runs (then the watch list is set)."""
        try:
            if not client.is_model_ready(self.model):
                return False
        except Exception:  # not answering yet
            return False
        server = self.server_pid()
        if server is None:
            return False
        below = descendants(server)
        stubs = [p for p in below if command_line(p)[:1] and command_line(p)[0].endswith(STUB)]
        if len(stubs) != len(self.infer_functions):
            return False
        watched = [Process.of(server, "tritonserver")]
        for pid in sorted(below):
            args = command_line(pid)
            instance = next((a for a in args if a.startswith(f"{self.model}_")), None)
            what = f"model instance {instance} (Python-backend stub)" if pid in stubs else (
                f"{Path(args[0]).name if args else 'a process'} started by a stub")
            watched.append(Process.of(pid, what))
        if any(p is None for p in watched):
            return False
        self.watched = watched
        return True

    def _note_model_folders(self, server: int) -> None:
        """Triton's copies of the model files (``/tmp/folderXXXXXX``, named by each stub's ``model.py``): Triton
        removes one at unload, but not after a failed load or a killed stub."""
        for pid in descendants(server):
            args = command_line(pid)
            if len(args) > 1 and args[0].endswith(STUB) and args[1].endswith("model.py"):
                folder = Path(args[1]).parents[1]
                if folder.name.startswith("folder") and folder not in self.model_folders:
                    self.model_folders.append(folder)
                    self.on_folder(folder)

    def dead(self) -> str | None:
        """What ended this backend (``what (pid N) died``, or a server that answered no health question for
        ``HUNG_AFTER_S``), else ``None``."""
        for process in self.watched:
            if not process.alive():
                return f"{process.what} (pid {process.pid}) died"
        if self.triton is not None and not self.triton.is_alive():
            return "PyTriton's request handling in this process died"
        if self.health is not None and self.watched and self.health.hung():
            self.hung = True
            server = self.watched[0]
            return f"{server.what} (pid {server.pid}) answered no health check for {self.health.hung_after_s:.0f} s"
        return None

    def stop(self) -> None:
        """Stop the server and its stubs (an abandoned start: its server process was signalled already; a hung
        server is killed, it cannot stop itself), then kill what is left of its process group."""
        if self.hung:
            self._kill_group()
        if self.hung or (self.watched and not self.watched[0].alive()):
            self._await_reaped()
        if self.triton is not None and not self.abandoned:
            self.triton.stop()
        self._release.set()
        self._kill_group()

    def _await_reaped(self) -> None:
        """Wait until PyTriton has seen its dead or killed server exit: until then it counts the server alive and its
        stop signals a process that may be reaped already (``ProcessLookupError``)."""
        deadline = time.monotonic() + REAP_WAIT_S
        while self.triton is not None and self.triton.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _kill_group(self) -> None:
        """SIGKILL the server's process group, while a process known to be in it runs (so that its id cannot have
        passed to another group)."""
        if self.group is not None and any(p.alive() for p in (self.group, *self.watched)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group.pid, signal.SIGKILL)
