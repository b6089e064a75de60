"""``attnres generate`` prints no tokens it cannot stand behind: logits that are NaN or infinite stop it in one line
naming the step, on every runner; a with-past ONNX of another model is refused by its weights even when its
metadata was stripped or copied, and where the pairing cannot be checked a warning says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from attnres_export.backends.base import Runner
from attnres_export.decode.generate import engine_decoder, generate, torch_decoder
from attnres_export.errors import GenerationError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.models import load_checkpoint, save_checkpoint
from attnres_export.models.base import fingerprint
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import write_checkpoint


@dataclass(frozen=True)
class Models:
    """Two checkpoints of one config (other seeds) and the with-past ONNX of the second."""

    mine: Path
    other: Path
    other_onnx: Path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pairing")
    return (write_checkpoint(root / "mine.pt", seed=1, n_layers=1, max_seq_len=16),
            write_checkpoint(root / "other.pt", seed=2, n_layers=1, max_seq_len=16))


@pytest.fixture(scope="module")
def models(checkpoints) -> Models:
    mine, other = checkpoints
    out = export_checkpoint(ExportOptions(other, output=other.with_name("other.onnx"), with_past=True,
                                          check=False)).path
    return Models(mine, other, out)


def rewritten(source: Path, out: Path, metadata: dict | None = None, rename: bool = False,
              edit: tuple[str, Callable[[np.ndarray], np.ndarray]] | None = None) -> Path:
    """A copy of ``source`` whose attnres metadata is ``metadata`` (None: stripped), whose initializers are renamed
    (``rename``: none carries a state_dict name) or whose initializer ``edit[0]`` holds ``edit[1](its values)``."""
    model = onnx.load(str(source))
    del model.metadata_props[:]
    if metadata is not None:
        onnx.helper.set_model_props(model, {EXPORT_KEY: json.dumps(metadata)})
    if rename:
        names = {init.name: f"w{i}" for i, init in enumerate(model.graph.initializer)}
        for init in model.graph.initializer:
            init.name = names[init.name]
        for node in model.graph.node:
            node.input[:] = [names.get(name, name) for name in node.input]
    if edit is not None:
        init = next(i for i in model.graph.initializer if i.name == edit[0])
        init.CopyFrom(numpy_helper.from_array(edit[1](numpy_helper.to_array(init)), init.name))
    onnx.save(model, str(out))
    return out


def test_generate_refuses_another_models_onnx_whose_metadata_was_stripped(models, tmp_path):
    stripped = rewritten(models.other_onnx, tmp_path / "stripped.onnx")
    result = invoke("generate", models.mine, "--ids", "1,2", "--max-new-tokens", "4", "--onnx", stripped)
    assert_one_line_error(result, "stripped.onnx: exported from another model than")
    assert "embed.weight holds other weights" in result.output


def test_generate_refuses_another_models_onnx_that_carries_this_models_identity(models, tmp_path):
    """Metadata is a claim: copied from this model's export, the weights still tell the files apart."""
    info = json.loads(onnx.load(str(models.other_onnx), load_external_data=False).metadata_props[0].value)
    forged = rewritten(models.other_onnx, tmp_path / "forged.onnx",
                       info | {"model_id": fingerprint(load_checkpoint(models.mine)[0])})
    assert_one_line_error(invoke("generate", models.mine, "--ids", "1,2", "--max-new-tokens", "4", "--onnx", forged),
                          "another model")


def test_generate_runs_its_own_stripped_onnx_without_a_warning(models, tmp_path):
    stripped = rewritten(models.other_onnx, tmp_path / "stripped.onnx")
    result = invoke("generate", models.other, "--ids", "1,2,3", "--max-new-tokens", "6", "--onnx", stripped, "--json")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    tokens = json.loads(result.output.strip().splitlines()[-1])["tokens"]
    assert tokens == generate(torch_decoder(load_checkpoint(models.other)[0]), [1, 2, 3], 6).tokens


def test_the_weights_are_compared_from_an_external_data_file_too(models, tmp_path):
    """Large models keep their weights beside the graph: only the leading bytes of each compared tensor are read."""
    folder = tmp_path / "external"
    folder.mkdir()
    onnx.save(onnx.load(str(rewritten(models.other_onnx, tmp_path / "stripped.onnx"))), str(folder / "m.onnx"),
              save_as_external_data=True, location="m.onnx.data", size_threshold=256)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL and i.name == "embed.weight"
               for i in onnx.load(str(folder / "m.onnx"), load_external_data=False).graph.initializer)
    assert invoke("generate", models.other, "--ids", "1,2", "--max-new-tokens", "4", "--onnx", folder / "m.onnx"
                  ).exit_code == 0
    assert_one_line_error(invoke("generate", models.mine, "--ids", "1,2", "--max-new-tokens", "4", "--onnx",
                                 folder / "m.onnx"), "m.onnx: exported from another model than")


def test_generate_warns_in_one_line_when_the_onnx_can_not_be_paired_with_the_model(models, tmp_path):
    """No metadata and no initializer named like a state_dict entry: nothing to compare, so it runs and says so."""
    anonymous = rewritten(models.other_onnx, tmp_path / "anonymous.onnx", rename=True)
    result = invoke("generate", models.other, "--ids", "1,2", "--max-new-tokens", "4", "--onnx", anonymous, "--json")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "anonymous.onnx: cannot check that it was exported from" in warnings[0], warnings


def test_generate_stops_in_one_line_at_the_prefill_when_pytorch_logits_are_infinite(tmp_path):
    """A finite checkpoint (the loader refuses NaN weights) whose lm_head overflows float32: before, greedy printed
    token 0 for every step with exit 0."""
    path = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    model, cfg = load_checkpoint(path)
    with torch.no_grad():
        model.lm_head.weight.fill_(3e38)
    save_checkpoint(model, cfg, path)
    assert_one_line_error(invoke("generate", path, "--ids", "1,2,3"), "pytorch logits of step 0 (the prefill)")


def test_generate_stops_in_one_line_when_onnx_runtime_logits_are_not_finite(models, tmp_path):
    """Finite weights of +-3e38 in the lm_head: their dot products overflow float32."""
    huge = ("lm_head.weight.transpose", lambda w: np.sign(w).astype(np.float32) * np.float32(3e38))
    broken = rewritten(models.other_onnx, tmp_path / "broken.onnx", edit=huge)
    assert_one_line_error(invoke("generate", models.other, "--ids", "1,2", "--max-new-tokens", "4", "--onnx", broken),
                          "logits of step 0 (the prefill) are NaN or infinite")


class NanFrom(Runner):
    """An engine stand-in: the PyTorch with-past model's outputs, with NaN logits from call ``bad`` on."""

    backend = "tensorrt"

    def __init__(self, inner: Runner, axes: dict, bad: int) -> None:
        self.inner, self.axes, self.bad, self.calls, self.artifact = inner, axes, bad, 0, "fake.engine"

    def input_axes(self) -> dict:
        return self.axes

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.inner.infer(feeds)
        self.calls += 1
        if self.calls > self.bad:
            out["logits"] = np.full_like(out["logits"], np.nan)
        return out


def test_an_engine_decoder_stops_at_the_decode_step_whose_logits_are_nan_and_warns_it_is_unpaired(checkpoints,
                                                                                                  monkeypatch):
    from attnres_export.backends.tensorrt import runner as tensorrt_runner

    reference = torch_decoder(load_checkpoint(checkpoints[1])[0])
    monkeypatch.setattr(tensorrt_runner, "TensorRTRunner",
                        lambda *_, **__: NanFrom(reference.runner, reference.axes, bad=3))
    decoder = engine_decoder(Path("fake.engine"))
    assert len(decoder.warnings) == 1 and "records no model identity" in decoder.warnings[0]
    with pytest.raises(GenerationError, match=r"tensorrt logits of step 3 \(decode of new token 4\)"):
        generate(decoder, [1, 2], 8)
