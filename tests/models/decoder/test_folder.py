"""``from_hf_folder`` loads transformers' names without renaming, shards included, and refuses in one line every
tensor that is missing, extra, misshapen or not floating point."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder import from_hf_folder
from tests.models.decoder.hf_bodies import hf_model, k3_site_weights, relative_l2, write_folder


@pytest.fixture(scope="module")
def reference():
    return hf_model("llama", seed=41)


def _edit_weights(folder, edit) -> None:
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


@torch.inference_mode()
def test_a_sharded_folder_loads_like_a_single_file(reference, tmp_path):
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = from_hf_folder(tmp_path / "sharded")
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(42))
    assert relative_l2(ours(ids), reference(ids).logits) <= 1e-5


@pytest.mark.parametrize(("edit", "named"), [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "missing model.layers.1.mlp.up_proj.weight"),
    (lambda t: t.update({"model.layers.0.self_attn.rotary.weight": torch.zeros(2)}), "model.layers.0.self_attn.rotary"),
    (lambda t: t.update({"model.norm.weight": torch.ones(31)}), "'model.norm.weight'] has shape [31]"),
    (lambda t: t.update({"model.norm.weight": torch.ones(32, dtype=torch.int32)}), "norm.weight is stored as int32"),
    (lambda t: t.update(k3_site_weights(hf_model("llama", seed=41), seed=1)), "model.layers.0.mlp_res_norm.weight"),
], ids=["missing", "extra", "shape", "dtype", "attn-res-weights-without-the-key"])
def test_bad_tensors_are_refused_in_one_line_naming_them(reference, tmp_path, edit, named):
    folder = write_folder(reference, tmp_path / "bad")
    _edit_weights(folder, edit)
    with pytest.raises(CheckpointError) as caught:
        from_hf_folder(folder)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_the_attn_res_key_without_its_weights_is_refused(reference, tmp_path):
    with pytest.raises(CheckpointError, match=re.escape("missing model.layers.0.mlp_res_norm.weight")):
        from_hf_folder(write_folder(reference, tmp_path / "k3", attn_res_block_size=2))


@torch.inference_mode()
def test_tied_embeddings_accept_an_equal_lm_head_and_refuse_a_different_one(tmp_path):
    tied = hf_model("qwen2", seed=43, tie_word_embeddings=True)
    folder = write_folder(tied, tmp_path / "tied")
    embedding = load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]
    _edit_weights(folder, lambda t: t.update({"lm_head.weight": embedding.clone()}))
    ours = from_hf_folder(folder)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    _edit_weights(folder, lambda t: t.update({"lm_head.weight": embedding + 1}))
    with pytest.raises(CheckpointError, match=re.escape("lm_head.weight differs from model.embed_tokens.weight")):
        from_hf_folder(folder)


@torch.inference_mode()
def test_deepseek_multi_token_prediction_layers_are_not_loaded(tmp_path):
    reference = hf_model("deepseek_v3", seed=44, num_nextn_predict_layers=1)
    folder = write_folder(reference, tmp_path / "mtp")
    _edit_weights(folder, lambda t: t.update({"model.layers.3.eh_proj.weight": torch.zeros(32, 64),
                                              "model.layers.3.enorm.weight": torch.ones(32)}))
    ours = from_hf_folder(folder)
    ids = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(45))
    assert relative_l2(ours(ids), reference(ids).logits) <= 1e-5
    _edit_weights(folder, lambda t: t.update({"model.layers.4.enorm.weight": torch.ones(32)}))
    with pytest.raises(CheckpointError, match=re.escape("model.layers.4.enorm.weight")):
        from_hf_folder(folder)


def test_a_folder_without_weights_or_config_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=re.escape("needs config.json")):
        from_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        from_hf_folder(tmp_path)
