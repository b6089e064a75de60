"""The supervisor with fake backends: a failed start is tried again, a backend whose process dies is replaced
while the front reports not-ready (with the reason), and a backend that keeps dying ends the server in one line."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from attnres_export.serve import server
from attnres_export.serve.backend import Addresses
from attnres_export.serve.dependencies import ServeError
from attnres_export.serve.front import FrontState
from attnres_export.serve.server import ServedModel, ServeOptions, Supervisor
from attnres_export.serve.signature import Signature, TensorSpec
from attnres_export.serve.workspace import ServeWorkspace

SIGNATURE = Signature((TensorSpec("x", "int64", (-1, -1)),), (TensorSpec("y", "float32", (-1, -1)),), 8)


class Identity:
    def infer(self, feeds):
        return {"y": feeds["x"].astype(np.float32)}


class Script:
    """What each successive fake backend does: ``"fail"`` to start, ``"die"`` after serving a moment, or
    ``"serve"`` until stopped. Records what the front's state was when each one started and while it served."""

    def __init__(self, *plan: str) -> None:
        self.plan = list(plan)
        self.started: list[Path] = []
        self.stopped = 0
        self.at_start = []
        self.serving = []
        self.state = FrontState("m", None)

    def backend(self, model, signature, infer_functions, workspace, exit_timeout_s, max_queue_delay_us, on_folder,
                on_output):
        script, what = self, self.plan.pop(0)

        class Fake:
            polls = 0

            def start(self, stop):
                script.started.append(workspace)
                script.at_start.append(script.state.view)
                if what == "fail":
                    raise ServeError("Triton did not start (TimeoutError: handshake)")
                return Addresses("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")

            def dead(self):
                self.polls += 1
                if self.polls == 1:
                    script.serving.append(script.state.view)
                return "model instance m_0_1 (pid 7) died" if what == "die" and self.polls > 2 else None

            def stop(self):
                script.stopped += 1

        return Fake()


@pytest.fixture
def workspace():
    with ServeWorkspace() as made:
        yield made
    assert not made.root.exists()


@dataclass
class Outcome:
    supervisor: Supervisor
    events: list[str]
    ready: list
    error: str | None


def supervise(script: Script, workspace, stop_on: str) -> Outcome:
    """Run a supervisor on ``script`` until an event starting with ``stop_on`` (``"ready"``: the first serving
    backend), or until it gives up."""
    served = ServedModel("m", SIGNATURE, [Identity()], "fake", limits=None)
    events: list[str] = []
    stop = threading.Event()
    ready = []

    def on_event(message: str) -> None:
        events.append(message)
        if message.startswith(stop_on):
            stop.set()

    def on_ready() -> None:
        ready.append(script.state.view)
        if stop_on == "ready":
            stop.set()

    supervisor = Supervisor(served, ServeOptions(Path("m.onnx")), script.state, workspace, on_event, script.backend)
    try:
        supervisor.run(stop, on_ready, poll_s=0.001)
    except ServeError as exc:
        return Outcome(supervisor, events, ready, str(exc))
    return Outcome(supervisor, events, ready, None)


def test_a_failed_start_is_tried_again_until_the_backend_serves(workspace):
    script = Script("fail", "fail", "serve")
    outcome = supervise(script, workspace, "ready")
    assert outcome.error is None and len(outcome.ready) == 1
    assert outcome.ready[0].ready and outcome.ready[0].http == "127.0.0.1:1"
    assert outcome.events == [
        "Triton did not start (TimeoutError: handshake); starting the backend again (start 2 of 5)",
        "Triton did not start (TimeoutError: handshake); starting the backend again (start 3 of 5)"]
    assert [p.name for p in script.started] == ["triton-0", "triton-1", "triton-2"]
    assert script.at_start[2].reason == "the backend is starting again (Triton did not start (TimeoutError: " \
                                        "handshake))"
    assert script.stopped == 2 and outcome.supervisor.backend is not None  # the serving one is the caller's


def test_a_backend_whose_process_died_is_replaced_and_reported_not_ready_meanwhile(workspace):
    script = Script("die", "serve")
    outcome = supervise(script, workspace, "the backend is serving m again")
    assert outcome.error is None and outcome.events == [
        "model instance m_0_1 (pid 7) died; restarting the backend (restart 1 of at most 3 in 10 minutes)",
        "the backend is serving m again"]
    assert [v.ready for v in script.serving] == [True] and script.state.view.ready and script.stopped == 1
    replacing = script.at_start[1]
    assert not replacing.ready and replacing.reason == "model instance m_0_1 (pid 7) died; the backend is restarting"


def test_a_backend_that_keeps_dying_ends_the_server_in_one_line(workspace):
    script = Script("die", "die", "die", "die")
    outcome = supervise(script, workspace, "never")
    assert outcome.error == "model instance m_0_1 (pid 7) died, the backend's 4th failure in 10 minutes; giving up"
    assert len([e for e in outcome.events if "restarting the backend" in e]) == 3
    assert not script.state.view.ready and "died; the backend is restarting" in script.state.view.reason


def test_a_backend_that_never_starts_ends_the_server_in_one_line(workspace):
    outcome = supervise(Script(*["fail"] * server.START_ATTEMPTS), workspace, "never")
    assert outcome.error == "Triton did not start (TimeoutError: handshake) (start 5 of 5; giving up)"
    assert outcome.ready == [] and len(outcome.events) == server.START_ATTEMPTS - 1
