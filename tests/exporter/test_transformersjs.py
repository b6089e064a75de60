"""``attnres-export MODEL --with-past --target portable --hf-onnx DIR`` writes a folder that transformers.js itself
(``@huggingface/transformers`` on node, the version ``tests/exporter/transformersjs/package-lock.json`` pins)
loads with ``AutoModelForCausalLM.from_pretrained`` and generates from: its greedy tokens equal transformers' own
``generate`` on the source folder for every decoder body, and ``attnres generate`` for K3 Attention Residuals
folders, for one prompt and a left-padded batch; what transformers.js cannot run is refused in one line.

The generation tests skip, saying why, only when node or the package cannot be obtained
(``tests/exporter/transformersjs_node.py``; ``.ci/run`` obtains both)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from attnres_export.decode.generate import generate, torch_decoder
from attnres_export.errors import ExportError
from attnres_export.exporter.hf_onnx import cache_renames
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import write_checkpoint
from tests.exporter import transformersjs_node

pytest.importorskip("transformers", reason="transformers is the reference of the decoder bodies")

from tests.models.decoder.hf_bodies import greedy_with_past, hf_model, k3_site_weights, write_folder

NEW_TOKENS = 32
PAD = 0
PROMPTS = ([11, 12, 13], [21, 22, 23, 24, 25, 26, 27], [31, 32, 33, 34, 35])
RUNS = [[list(PROMPTS[1])], [list(p) for p in PROMPTS]]
"""One prompt alone (a Qwen3-MoE or DeepSeek-V3 decode step takes the one-token gather branch), then a batch of
three, left-padded: each a generate() call of transformers.js and of the reference."""
VARIED = {"initializer_range": 0.3, "vocab_size": 256}
"""Weights large enough that greedy decoding does not settle on repeating one token: at hf_bodies' 0.1 and 61
tokens some rows changed token only once or twice in 32 steps, here every row at least 26 times (transformers)."""
BODIES = {
    "llama": VARIED,
    "qwen2": VARIED,
    "qwen3": VARIED,
    "qwen3_moe": VARIED | {"mlp_only_layers": [0]},
    "deepseek_v3": VARIED | {"first_k_dense_replace": 1},
}
"""hf_bodies' tiny settings; the MoE bodies route through experts on every layer but the first."""


@pytest.fixture(scope="module")
def transformers_js() -> tuple[Path, Path]:
    try:
        return transformersjs_node.obtain()
    except transformersjs_node.Unavailable as exc:
        pytest.skip(f"transformers.js unavailable: {exc}")


def export_folder(source: Path, folder: Path, *args: str) -> Path:
    """The folder, exported without the parity check unless ``args`` ask for it (the tokens compared here are the
    stronger check; ``test_a_folder_that_misses_its_parity_bar...`` runs it)."""
    args = args if "--check" in args else ("--no-check", *args)
    result = invoke("export", source, "--with-past", "--target", "portable", "--hf-onnx", folder, *args)
    assert result.exit_code == 0, result.output
    return folder


def js_tokens(transformers_js, folder: Path) -> list[list[list[int]]]:
    tokens = transformersjs_node.generate(*transformers_js, folder, RUNS, NEW_TOKENS, PAD)
    assert [len(row) for run in tokens for row in run] == [NEW_TOKENS] * 4
    return tokens


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@torch.inference_mode()
def transformers_tokens(model, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy ``generate`` (hf_model: no end-of-sequence id, pad 0) on the left-padded prompts."""
    ids, mask = left_padded(prompts)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[:, ids.shape[1]:].tolist()


def assert_laid_out_for_transformers_js(folder: Path, source: Path, renamed_cache: bool) -> None:
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "config.json", "generation_config.json", "onnx/model.onnx"]
    config = json.loads((folder / "config.json").read_text())
    assert config == {**json.loads((source / "config.json").read_text()), "transformers.js_config": {"dtype": "fp32"}}
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    inputs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    layers = config["num_hidden_layers"]
    assert [n for n in inputs if n.startswith("past_key_values.")] == [
        f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    assert all(axes[0] == "batch_size" and axes[-2] == "past" for name, axes in inputs.items()
               if name.startswith("past_key_values."))
    assert [o.name for o in graph.output][1:3] == ["present.0.key", "present.0.value"]
    recorded = json.loads({p.key: p.value for p in onnx.load(
        str(folder / "onnx" / "model.onnx"), load_external_data=False).metadata_props}["attnres.export"])
    assert recorded["transformers_js"]["dims"] == {"batch": "batch_size"}
    assert bool(recorded["transformers_js"]["cache"]) is renamed_cache


@pytest.mark.slow
@pytest.mark.parametrize("family", list(BODIES))
def test_transformers_js_greedy_tokens_equal_transformers_generate(tmp_path, transformers_js, family):
    reference = hf_model(family, seed=7, **BODIES[family])
    source = write_folder(reference, tmp_path / family)
    folder = export_folder(source, tmp_path / "folder")
    assert_laid_out_for_transformers_js(folder, source, renamed_cache=family == "deepseek_v3")
    assert js_tokens(transformers_js, folder) == [transformers_tokens(reference, run) for run in RUNS]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "block"), [("qwen3", 1)])
def test_k3_attention_residual_folders_run_under_transformers_js_as_under_attnres_generate(tmp_path, transformers_js,
                                                                                         family, block):
    from attnres_export.models.decoder import from_hf_folder

    reference = hf_model(family, seed=8, **BODIES[family])
    source = write_folder(reference, tmp_path / family, attn_res=k3_site_weights(reference, seed=9),
                          attn_res_block_size=block)
    folder = export_folder(source, tmp_path / "folder")
    ours = from_hf_folder(source)
    alone, batch = js_tokens(transformers_js, folder)
    assert alone == [generate(torch_decoder(ours), RUNS[0][0], NEW_TOKENS).tokens]  # attnres generate's loop
    ids, mask = left_padded(RUNS[1])
    with torch.inference_mode():
        assert batch == greedy_with_past(ours, ids, mask, NEW_TOKENS).tolist()


def _onnx_runtime_tokens(path: Path, prompt: list[int]) -> list[int]:
    """Greedy tokens of ONNX Runtime on the folder's model, fed by hand (batch 1, the cache as transformers.js makes
    it: from each input's declared shape, batch_size 1 and every other name 0)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    past = {i.name: np.zeros([1 if d == "batch_size" else d if isinstance(d, int) else 0 for d in i.shape],
                             types[i.type]) for i in session.get_inputs() if i.name.startswith("past_key_values.")}
    ids, tokens = list(prompt), []
    for _ in range(NEW_TOKENS):
        new = ids if not tokens else ids[-1:]
        length = len(ids)
        outputs = session.run(None, {"input_ids": np.array([new], np.int64),
                                     "attention_mask": np.ones((1, length), np.int64),
                                     "position_ids": np.arange(length - len(new), length, dtype=np.int64)[None],
                                     **past})
        named = dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))
        past = {name: named["present." + name.removeprefix("past_key_values.")] for name in past}
        tokens.append(int(named["logits"][0, -1].argmax()))
        ids.append(tokens[-1])
    return tokens


@pytest.mark.slow
def test_a_float16_folder_with_its_weights_in_an_external_data_file_loads_as_transformers_js_reads_it(
        tmp_path, transformers_js, monkeypatch):
    from attnres_export.exporter import staging

    monkeypatch.setattr(staging, "fits_in_one_file", lambda size: False)  # as a model over protobuf's limit
    source = write_folder(hf_model("llama", seed=10, **VARIED), tmp_path / "llama")
    folder = export_folder(source, tmp_path / "folder", "--dtype", "float16")
    assert sorted(str(p.relative_to(folder)) for p in (folder / "onnx").iterdir()) == [
        "onnx/model_fp16.onnx", "onnx/model_fp16.onnx_data"]
    assert json.loads((folder / "config.json").read_text())["transformers.js_config"] == {
        "dtype": "fp16", "use_external_data_format": {"model_fp16.onnx": 1}}
    alone, _ = js_tokens(transformers_js, folder)
    assert alone == [_onnx_runtime_tokens(folder / "onnx" / "model_fp16.onnx", RUNS[0][0])]


@pytest.mark.slow
def test_a_folder_that_misses_its_parity_bar_is_kept_beside_as_failed_and_replaces_nothing(tmp_path):
    source = write_folder(hf_model("qwen3", seed=11), tmp_path / "qwen3")
    (source / "tokenizer.json").write_text("{}")
    folder = export_folder(source, tmp_path / "folder", "--check")
    assert (folder / "tokenizer.json").read_text() == "{}"
    before = (folder / "onnx" / "model.onnx").read_bytes()
    out = invoke("export", source, "--with-past", "--target", "portable", "--hf-onnx", folder,
                 "--tol", "float32:1e-30:1.0")
    assert out.exit_code == 1
    assert (folder / "onnx" / "model.onnx").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "folder.failed").iterdir()) == sorted(p.name for p in folder.iterdir())
    export_folder(source, folder)  # an earlier transformers.js folder is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "folder.failed", "qwen3"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "llama"
    assert invoke("example", folder, "--arch", "llama", "--layers", "1").exit_code == 0
    return folder


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "portable"], "--hf-onnx needs --with-past"),
    (["--with-past"], "--hf-onnx needs --target portable: the tensorrt target keeps fused attnres nodes"),
    (["--with-past", "--target", "portable", "--dtype", "bfloat16"], "--dtype bfloat16 has no kernels"),
    (["--with-past", "--target", "portable", "-o", "x.onnx"], "-o and --hf-onnx"),
])
def test_what_transformers_js_cannot_run_is_refused_in_one_line(llama_folder, tmp_path, args, message):
    assert_one_line_error(invoke("export", llama_folder, "--hf-onnx", tmp_path / "out", *args), message)
    assert not (tmp_path / "out").exists()


def test_models_transformers_js_has_no_model_for_are_refused_in_one_line(tmp_path):
    common = ("--with-past", "--target", "portable", "--hf-onnx", tmp_path / "out")
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    assert_one_line_error(invoke("export", ckpt, *common), "m.pt is an attnres checkpoint file")
    kimi = tmp_path / "kimi"
    assert invoke("example", kimi, "--arch", "kimi-linear").exit_code == 0
    assert_one_line_error(invoke("export", kimi, *common), "transformers.js cannot run a kimi_linear model")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_transformers_js_folder_or_holds_the_model_is_refused(llama_folder, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    common = ("--with-past", "--target", "portable")
    out = invoke("export", llama_folder, *common, "--hf-onnx", busy)
    assert_one_line_error(out, "is not a transformers.js folder attnres-export wrote (it holds notes.txt)")
    assert_one_line_error(invoke("export", llama_folder, *common, "--hf-onnx", llama_folder.parent), "holds MODEL")
    out = invoke("export", llama_folder, *common, "--hf-onnx", tmp_path / "a", "--genai", tmp_path / "b")
    assert out.exit_code == 2 and "--genai and --hf-onnx" in out.output
    out = invoke("export", llama_folder, *common, "--hf-onnx", tmp_path / "out", "--report", tmp_path / "out/r.json")
    assert_one_line_error(out, "is inside --hf-onnx")


def test_a_tokenizer_file_linked_from_outside_the_model_folder_is_refused_and_nothing_is_written(llama_folder,
                                                                                               tmp_path):
    import shutil

    model = shutil.copytree(llama_folder, tmp_path / "model")
    (tmp_path / "secret.json").write_text("{}")
    (model / "tokenizer.json").symlink_to(tmp_path / "secret.json")
    out = invoke("export", model, "--with-past", "--target", "portable", "--hf-onnx", tmp_path / "out")
    assert_one_line_error(out, "MODEL's tokenizer.json is a link to")
    assert not (tmp_path / "out").exists()


def test_caches_are_renamed_to_one_key_and_one_value_per_layer_or_refused_naming_the_entry():
    kv = [{"name": f"past_key_values.{i}.{kind}", "present": f"present.{i}.{kind}", "axes": ["batch", 2, "past", 16]}
          for i in range(2) for kind in ("key", "value")]
    assert cache_renames(kv) == {}
    latent = [{"name": "past_key_values.0.latent", "present": "present.0.latent", "axes": ["batch", "past", 512]},
              {"name": "past_key_values.0.rope_key", "present": "present.0.rope_key", "axes": ["batch", "past", 64]}]
    assert cache_renames(latent) == {"past_key_values.0.latent": "past_key_values.0.key",
                                     "present.0.latent": "present.0.key",
                                     "past_key_values.0.rope_key": "past_key_values.0.value",
                                     "present.0.rope_key": "present.0.value"}
    recurrent = [{"name": "past_key_values.1.recurrent", "present": "present.1.recurrent",
                  "axes": ["batch", 4, 16, 16]}]
    with pytest.raises(ExportError, match=r"past_key_values.1.recurrent \['batch', 4, 16, 16\] is not a layout"):
        cache_renames(recurrent)
    with pytest.raises(ExportError, match=r"past_key_values\.0\.key"):
        cache_renames(kv[:1])
