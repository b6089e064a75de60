"""Triton's output as ``attnres serve`` shows it, without a live Triton: the start-up lines a CPU machine prints
(recorded from ``attnres serve`` on PyTriton 0.7.0, Triton 2.51.0, no GPU) lose exactly their known-harmless lines,
whatever chunks they come in; a start's output is held until the server has said where it serves (a fake backend
whose start writes Triton's lines); and PyTriton's server sends its output to the sink it was started with."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest

from attnres_export.serve import triton_log
from attnres_export.serve.backend import Addresses
from attnres_export.serve.dependencies import ServeError
from attnres_export.serve.front import FrontState
from attnres_export.serve.proxy_patches import patch_server_start, triton_output
from attnres_export.serve.server import ServedModel, ServeOptions, Supervisor
from attnres_export.serve.triton_log import HARMLESS, TritonLog, harmless
from attnres_export.serve.workspace import ServeWorkspace
from tests.serve.test_supervisor import SIGNATURE, Identity

HARMLESS_LINES = [
    'W1203 12:54:26.002766 16118 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned '
    'memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"\n',
    'I1203 12:54:26.002890 16118 cuda_memory_manager.cc:117] "CUDA memory pool disabled"\n',
    'E1203 12:54:26.003043 16118 server.cc:241] "CudaDriverHelper has not been initialized."\n',
    'E1203 12:54:26.924627 16118 model_repository_manager.cc:470] "Failed to set config modification time: '
    'model_config_content_name_ is empty"\n',
]
START = [
    *HARMLESS_LINES[:3],
    "I1203 12:54:26.009154 16118 server.cc:604] \n",
    "+------------------+------+\n",
    "| Repository Agent | Path |\n",
    "+------------------+------+\n",
    "+------------------+------+\n",
    "\n",
    'I1203 12:54:26.009474 16118 metrics.cc:770] "Collecting CPU metrics"\n',
    'I1203 12:54:26.011809 16118 grpc_server.cc:2558] "Started GRPCInferenceService at 127.0.0.1:44951"\n',
    'I1203 12:54:26.012099 16118 http_server.cc:4713] "Started HTTPService at 127.0.0.1:57183"\n',
    HARMLESS_LINES[3],
    'I1203 12:54:26.924996 16118 model_lifecycle.cc:472] "loading: tiny:1"\n',
    'I1203 12:54:28.625799 16118 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_0_0 (CPU device '
    '0)"\n',
    "I1203 12:54:29.507621 16118 model_lifecycle.cc:839] \"successfully loaded 'tiny'\"\n",
]
"""The start of ``attnres serve``'s Triton log on a machine without a GPU, as recorded (one table kept)."""
NOT_HARMLESS = [
    # Same sources and levels as harmless lines, other messages: shown.
    'E1203 12:54:27.000000 16118 server.cc:241] "CudaDriverHelper failed: out of memory"\n',
    'E1203 12:54:27.000001 16118 model_repository_manager.cc:470] "Poll failed for model directory \'tiny\'"\n',
    "E1203 12:54:27.000002 16118 model_lifecycle.cc:642] \"failed to load 'tiny' version 1: Internal: Stub process "
    "'tiny_0_0' is not healthy.\"\n",
    'W1203 12:54:27.000003 16118 metrics.cc:811] "Unable to get power limit for GPU 0"\n',
    # A harmless message in another line's text is not that line.
    "client said: CudaDriverHelper has not been initialized.\n",
]


def chunks(text: str, seed: int) -> list[str]:
    """``text`` cut at random places, as PyTriton's unbuffered reader hands it over."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), 40))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_every_recorded_harmless_line_matches_its_entry_and_no_other_line_does():
    assert [harmless(line) for line in HARMLESS_LINES] == [HARMLESS[1], HARMLESS[2], HARMLESS[0], HARMLESS[3]]
    assert [line for line in START if harmless(line)] == HARMLESS_LINES
    assert [harmless(line) for line in NOT_HARMLESS] == [None] * len(NOT_HARMLESS)
    # Triton before 2.4x printed its messages unquoted.
    assert harmless("E0316 07:48:38.533850 1 server.cc:243] CudaDriverHelper has not been initialized.") \
        is HARMLESS[0]
    assert all(entry.why and entry.seen for entry in HARMLESS)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("as_bytes", [False, True])
def test_harmless_lines_are_taken_out_in_any_chunks_and_every_other_line_is_shown_whole(seed, as_bytes, caplog):
    shown: list[str] = []
    log = TritonLog(shown.append)
    text = "".join(START + NOT_HARMLESS)
    with caplog.at_level(logging.DEBUG, logger=triton_log.__name__):
        for chunk in chunks(text, seed):
            log.feed(chunk.encode() if as_bytes else chunk)
        log.close()
    assert shown == [line for line in START if line not in HARMLESS_LINES] + NOT_HARMLESS
    assert [r.getMessage() for r in caplog.records] == [f"Triton, known harmless (triton_log.HARMLESS): {line}"
                                                        for line in (h.rstrip("\n") for h in HARMLESS_LINES)]
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}


def test_show_harmless_shows_every_line_and_a_last_unfinished_line_is_kept():
    shown: list[str] = []
    log = TritonLog(shown.append, show_harmless=True)
    log.feed("".join(START) + "I1203 12:55:36.186687 16118 server.cc:345] \"Timeout 8")
    log.close()
    assert shown == [*START, 'I1203 12:55:36.186687 16118 server.cc:345] "Timeout 8\n']


def test_held_lines_wait_for_release_then_lines_pass_as_they_come():
    shown: list[str] = []
    log = TritonLog(shown.append)
    log.feed(NOT_HARMLESS[0])
    log.hold()
    log.feed("".join(NOT_HARMLESS[1:3]))
    assert shown == [NOT_HARMLESS[0]] and log.holding
    log.release()
    log.feed(NOT_HARMLESS[3])
    assert shown == NOT_HARMLESS[:4] and not log.holding


class TritonLike:
    """A backend whose start writes Triton's start-up lines to its output (the way PyTriton's reader thread
    does, from another thread) before it reports ready, or fails after writing them."""

    def __init__(self, plan: list[str], events: list[str]) -> None:
        self.plan, self.events = plan, events

    def __call__(self, model, signature, infer_functions, workspace, exit_timeout_s, max_queue_delay_us, on_folder,
                 on_output):
        what = self.plan.pop(0)
        lines = START if what == "serve" else [NOT_HARMLESS[2]]

        class Fake:
            def start(self, stop):
                writer = threading.Thread(target=lambda: [on_output(line.encode()) for line in lines])
                writer.start()
                writer.join()
                if what == "fail":
                    raise ServeError("tritonserver exited while starting; see its log above")
                return Addresses("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")

            def dead(self):
                return None

            def stop(self):
                pass

        return Fake()


def run_supervisor(plan: list[str]) -> list[str]:
    """Everything the user would see, in order: Triton's lines, the served line, the supervisor's events."""
    seen: list[str] = []
    stop = threading.Event()
    served = ServedModel("m", SIGNATURE, [Identity()], "fake", limits=None)

    def on_ready() -> None:
        seen.append("serving m at http://127.0.0.1:8000\n")
        stop.set()

    with ServeWorkspace() as workspace:
        output = TritonLog(seen.append)
        supervisor = Supervisor(served, ServeOptions(Path("m.onnx")), FrontState("m", None), workspace,
                                lambda event: seen.append(event + "\n"), TritonLike(plan, seen), output)
        supervisor.run(stop, on_ready, poll_s=0.001)
        output.close()
    return seen


def test_the_served_line_comes_before_tritons_start_up_output_which_has_no_harmless_line():
    seen = run_supervisor(["serve"])
    assert seen == ["serving m at http://127.0.0.1:8000\n"] + [line for line in START if line not in HARMLESS_LINES]
    assert not any("CudaDriverHelper" in line or line.startswith("E") for line in seen)


def test_a_failed_starts_log_comes_before_its_error_and_the_served_line_before_the_next_starts_log():
    seen = run_supervisor(["fail", "serve"])
    assert seen[:3] == [NOT_HARMLESS[2],
                        "tritonserver exited while starting; see its log above; starting the backend again "
                        "(start 2 of 5)\n",
                        "serving m at http://127.0.0.1:8000\n"]
    assert seen[3:] == [line for line in START if line not in HARMLESS_LINES]


def test_pytritons_server_sends_its_output_to_the_sink_of_the_thread_that_started_it():
    pytest.importorskip("sh")  # PyTriton's dependency, which the patched start imports

    printed: list = []

    class Server:
        def start(self) -> None:
            self._record_logs(b"I0 line\n")

        def _record_logs(self, line) -> None:
            printed.append(line)

    patch_server_start(Server)
    received: list = []
    with triton_output(received.append):
        Server().start()
    Server().start()
    assert received == [b"I0 line\n"] and printed == [b"I0 line\n"]


def test_grpcs_own_log_is_kept_at_errors_unless_the_user_chose_a_level(monkeypatch):
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    triton_log.quiet_grpc()
    assert triton_log.os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    triton_log.quiet_grpc()
    assert triton_log.os.environ["GRPC_VERBOSITY"] == "DEBUG"
