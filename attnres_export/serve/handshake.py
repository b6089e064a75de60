"""A longer handshake wait in the proxy files PyTriton sends Triton.

PyTriton's Python-backend proxy (0.7.0, and the releases before it) has every model instance after the first
wait 1 s for the first instance's handshake socket (``get_config_from_handshake_server``, ``timeout_s=1.0``); the
first instance makes that socket only after it has spawned its tensor-store process, a fresh Python interpreter.
On a loaded machine that takes longer, and the model fails to load: measured, five starts of ``attnres serve
--instances 2`` failed in a row at load average 10 on two cores. The copies of the proxy files that Triton loads
get a 60 s wait instead; the text is matched exactly, so a PyTriton whose proxy reads differently is left alone
(the supervisor's start retries remain).
"""

from __future__ import annotations

from functools import wraps

PROXY_FILE = "communication.py"
ONE_SECOND = b"def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 1.0) -> dict:"
PATIENT = b"def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 60.0) -> dict:"


def patient_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` (PyTriton's ``{"file:VERSION/NAME": content}``) with the handshake wait of the proxy's
    communication module raised to 60 s."""
    return {key: content.replace(ONE_SECOND, PATIENT) if key.endswith(f"/{PROXY_FILE}") else content
            for key, content in files.items()}


def make_handshake_patient(model_class: type) -> None:
    """Wrap ``model_class.get_proxy_model_files`` (PyTriton's ``Model``) once so it returns ``patient_files``."""
    original = model_class.get_proxy_model_files
    if getattr(original, "patient_handshake", False):
        return

    @wraps(original)
    def get_proxy_model_files(self) -> dict[str, bytes]:
        return patient_files(original(self))

    get_proxy_model_files.patient_handshake = True
    model_class.get_proxy_model_files = get_proxy_model_files
