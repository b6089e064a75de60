"""``attnres check`` reads what an export recorded of its model through the family config's own attributes: a
decoder-lm or kimi-linear checkpoint (no ``residual``, ``head_dim`` or ``max_seq_len`` in its config dict) is
compared on the keys its family has, and another model's file is still refused in one line. Cheap: tiny folders,
a described artifact, no export."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnres_export.errors import ParityError
from attnres_export.models import load_checkpoint
from attnres_export.models.registry import for_example
from attnres_export.parity.check import Artifact, refuse_other_model


@pytest.fixture(scope="module", params=["llama", "kimi-linear"])
def model(request, tmp_path_factory):
    family, hf_type = for_example(request.param)
    folder, _, _ = family.write_example_folder(hf_type, tmp_path_factory.mktemp(request.param) / "m", 0, 1, 2)
    return load_checkpoint(folder)[0]


def artifact(model, **recorded) -> Artifact:
    from attnres_export.models.base import step_input_axes

    cache = model.with_past().cache_inputs()
    facts = {"arch": model.config.arch, "vocab_size": model.config.vocab_size,
             "max_seq_len": model.config.max_seq_len} | recorded
    return Artifact(Path("m.with-past.onnx"), "float32", True, {}, step_input_axes(cache), {}, facts, "portable",
                    lambda: None)


def test_a_with_past_export_of_the_folders_own_model_is_accepted(model):
    refuse_other_model(artifact(model), model, Path("m"))


@pytest.mark.parametrize("key", ["max_seq_len", "vocab_size"])
def test_an_export_of_another_size_is_refused_naming_the_key(model, key):
    other = getattr(model.config, key) + 1
    with pytest.raises(ParityError, match=f"exported from another model [(]{key} {other};"):
        refuse_other_model(artifact(model, **{key: other}), model, Path("m"))
