"""``attnres serve`` of with-past exports on a real Triton server (PyTriton, CPU): a family with a grouped KV cache
(Llama, 2 of 4 heads) and Kimi Linear (KDA recurrent and conv states beside latent layers) generate, through HTTP,
the same greedy tokens as ``attnres generate --onnx`` on the same file, the prefill's empty past included. The
client is the library's own decode loop with a runner that sends each step to the server. Slow."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from attnres_export.decode.generate import Decoder, onnx_decoder
from attnres_export.decode.generate import generate as greedy
from tests.serve.conftest import NEEDS_SERVER
from tests.serve.family_exports import example_folder, export
from tests.serve.server_process import start_server

pytestmark = [NEEDS_SERVER, pytest.mark.slow]
WIRE = {np.dtype("int64"): "INT64", np.dtype("float32"): "FP32", np.dtype("float16"): "FP16"}


class ServedRunner:
    """A runner whose ``infer`` is one HTTP inference on the served model (tritonclient)."""

    backend = "attnres serve"

    def __init__(self, address: str, model: str) -> None:
        self.address, self.model, self.artifact, self.client = address, model, model, None

    def activate(self) -> None:
        import tritonclient.http as http

        self.client = http.InferenceServerClient(self.address)

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tritonclient.http as http

        inputs = []
        for name, array in feeds.items():
            tensor = http.InferInput(name, list(array.shape), WIRE[array.dtype])
            tensor.set_data_from_numpy(np.ascontiguousarray(array), binary_data=True)
            inputs.append(tensor)
        result = self.client.infer(self.model, inputs)
        return {out["name"]: result.as_numpy(out["name"]) for out in result.get_response()["outputs"]}

    def deactivate(self) -> None:
        self.client.close()


@pytest.mark.parametrize("family", ["llama", "kimi-linear"])
@pytest.mark.parametrize("dtype", ["float32"])
def test_greedy_tokens_through_the_server_equal_attnres_generate_on_the_same_file(family, dtype, tmp_path):
    folder = example_folder(family, tmp_path / "folder")
    path = export(folder, tmp_path / "m.onnx", with_past=True, target="tensorrt", dtype=dtype)
    local = onnx_decoder(path)
    try:
        expected = greedy(local, [3, 1, 4, 1, 5], 12).tokens
    finally:
        local.close()
    server = start_server(path, tmp_path / "serve.log")
    try:
        remote = Decoder(ServedRunner(server.http, server.model), local.axes, "attnres serve", local.info,
                         local.past_dtypes)
        try:
            served = greedy(remote, [3, 1, 4, 1, 5], 12).tokens
        finally:
            remote.close()
    finally:
        code, left = server.stop(signal.SIGTERM)
    assert served == expected, server.output()[-2000:]
    assert code == 0 and not left
