"""``attnres-export MODEL --with-past --target onnxruntime --genai DIR`` writes a folder that onnxruntime-genai itself
loads and runs: its greedy tokens equal ``attnres generate`` (ONNX Runtime and PyTorch), alone and in a batch of
prompts of different lengths; the config says what the model is; what cannot run there is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_genai as og
import pytest

from attnres_export.decode.generate import onnx_decoder, torch_decoder
from attnres_export.errors import ExportError
from attnres_export.exporter.genai_config import cache_layout, model_type
from attnres_export.exporter.genai_tokens import generation_defaults
from attnres_export.models import load_checkpoint
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import write_checkpoint
from tests.exporter.genai_helpers import (
    NEW_TOKENS,
    PROMPTS,
    genai_generate,
    padded_batch_tokens,
    reference_tokens,
    write_family_folder,
    write_genai_checkpoint,
)


def export_genai_folder(checkpoint: Path, folder: Path, *args: str) -> Path:
    result = invoke("export", checkpoint, "--with-past", "--target", "onnxruntime", "--genai", folder, *args)
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture(scope="module")
def block_checkpoint(tmp_path_factory) -> Path:
    """Block AttnRes (S = 2), two layers, with a tokenizer and a generation config."""
    return write_genai_checkpoint(tmp_path_factory.mktemp("genai") / "block2", seed=3, n_layers=2, block_size=2)


@pytest.fixture(scope="module")
def block_folder(block_checkpoint, tmp_path_factory) -> Path:
    return export_genai_folder(block_checkpoint, tmp_path_factory.mktemp("genai-out") / "folder")


def _cli_tokens(checkpoint: Path, prompt: list[int], *args) -> list[int]:
    out = invoke("generate", checkpoint, "--ids", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS),
                 "--json", *args)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["tokens"]


@pytest.mark.slow
def test_the_folder_holds_the_model_its_config_and_the_tokenizer_files(block_checkpoint, block_folder):
    assert sorted(p.name for p in block_folder.iterdir()) == [
        "genai_config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((block_folder / "genai_config.json").read_text())
    eos = json.loads((block_checkpoint / "generation_config.json").read_text())["eos_token_id"]
    model, decoder = config["model"], config["model"]["decoder"]
    assert (model["type"], model["vocab_size"], model["context_length"]) == ("decoder", 97, 64)
    assert (model["eos_token_id"], model["bos_token_id"], model["pad_token_id"]) == (eos, 1, 0)
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["num_attention_heads"],
            decoder["head_size"], decoder["hidden_size"]) == (2, 4, 4, 8, 32)
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert config["search"]["past_present_share_buffer"] is True
    graph = onnx.load(str(block_folder / "model.onnx"), load_external_data=False).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2 and {n.domain for n in attention} == {"com.microsoft"}
    assert not any(i.startswith("past_key_values.") for n in graph.node if n.op_type == "Concat" for i in n.input)
    norms = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
    assert sum(n.op_type in norms for n in graph.node) == 5  # 2 per layer, the final one
    assert config["search"]["max_length"] == 64 and config["search"]["do_sample"] is False
    tokenizer = og.Tokenizer(og.Model(str(block_folder)))
    from tokenizers import Tokenizer

    text = "the lazy fox"
    assert list(tokenizer.encode(text)) == Tokenizer.from_file(str(block_checkpoint / "tokenizer.json")).encode(
        text).ids


@pytest.mark.slow
def test_onnxruntime_genai_greedy_tokens_equal_attnres_generate_on_onnx_runtime_and_pytorch(block_checkpoint,
                                                                                           block_folder):
    prompt = PROMPTS[1]
    (genai,) = genai_generate(block_folder, [prompt])
    assert len(genai) == NEW_TOKENS
    assert genai == _cli_tokens(block_checkpoint, prompt, "--onnx", block_folder / "model.onnx")
    assert genai == _cli_tokens(block_checkpoint, prompt)


@pytest.mark.slow
def test_a_batch_of_prompts_of_different_lengths_gives_each_prompt_its_own_tokens(block_checkpoint, block_folder):
    prompts = [list(p) for p in PROMPTS]
    genai = genai_generate(block_folder, prompts)
    model, _ = load_checkpoint(block_checkpoint)
    onnx = onnx_decoder(block_folder / "model.onnx")
    try:
        assert genai == padded_batch_tokens(onnx, prompts)
    finally:
        onnx.close()
    assert genai == padded_batch_tokens(torch_decoder(model), prompts)
    assert genai == [reference_tokens(block_checkpoint, p) for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "dtype"), [
    ({"n_layers": 3, "block_size": 0}, "float32"),
    ({"n_layers": 2, "residual": "standard"}, "float32"),
    ({"n_layers": 2, "block_size": 2}, "float16"),
])
def test_other_models_and_float16_run_under_onnxruntime_genai_as_under_attnres_generate(tmp_path, overrides, dtype):
    checkpoint = write_genai_checkpoint(tmp_path / "ckpt", seed=5, **overrides)
    folder = export_genai_folder(checkpoint, tmp_path / "folder", "--dtype", dtype)
    genai = genai_generate(folder, [list(p) for p in PROMPTS])
    ours = [_cli_tokens(checkpoint, p, "--onnx", folder / "model.onnx") for p in PROMPTS]
    assert genai == ours
    if dtype == "float32":
        assert genai == [reference_tokens(checkpoint, p) for p in PROMPTS]


def _same_tokens_everywhere(checkpoint: Path, folder: Path, prompts=PROMPTS) -> None:
    """onnxruntime-genai on the batch of ``prompts`` = ``attnres generate`` per prompt, on the folder's ONNX and on
    PyTorch."""
    genai = genai_generate(folder, [list(p) for p in prompts])
    assert genai == [_cli_tokens(checkpoint, p, "--onnx", folder / "model.onnx") for p in prompts]
    assert genai == [_cli_tokens(checkpoint, p) for p in prompts]


@pytest.mark.slow
def test_a_qwen3_body_with_attention_residuals_and_grouped_heads_runs_as_under_attnres_generate(tmp_path):
    checkpoint = write_family_folder(tmp_path / "qwen3", "qwen3", seed=2, block_size=1)
    folder = export_genai_folder(checkpoint, tmp_path / "folder")
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert (config["type"], config["decoder"]["num_attention_heads"], config["decoder"]["num_key_value_heads"],
            config["decoder"]["head_size"], config["decoder"]["hidden_size"]) == ("qwen3", 4, 2, 16, 64)
    ops = [n.op_type for n in onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node]
    norms = ops.count("SimplifiedLayerNormalization") + ops.count("SkipSimplifiedLayerNormalization")
    assert (ops.count("GroupQueryAttention"), norms) == (2, 9)  # q/k norms too
    _same_tokens_everywhere(checkpoint, folder)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "block_size", "dtype"), [
    ("llama", None, "float32"), ("qwen2", None, "float32"), ("qwen2", 1, "float32"), ("llama", 1, "float16"),
    ("qwen3-moe", 1, "float32"),
])
def test_decoder_bodies_run_under_onnxruntime_genai_as_under_attnres_generate(tmp_path, family, block_size, dtype):
    checkpoint = write_family_folder(tmp_path / family, family, seed=4, block_size=block_size)
    folder = export_genai_folder(checkpoint, tmp_path / "folder", "--dtype", dtype)
    expected_type = "decoder" if family == "qwen3-moe" else family  # the expert routing exports as an If
    assert json.loads((folder / "genai_config.json").read_text())["model"]["type"] == expected_type
    ops = [n.op_type for n in onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count("MoE") == (2 if family == "qwen3-moe" else 0)  # the experts read in place, one node a layer
    if dtype == "float32":
        _same_tokens_everywhere(checkpoint, folder)
    else:
        genai = genai_generate(folder, [list(p) for p in PROMPTS])
        assert genai == [_cli_tokens(checkpoint, p, "--onnx", folder / "model.onnx") for p in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "entry"), [("deepseek-v3", "past_key_values.0.latent ['batch', 'past', 32]"),
                                               ("kimi-linear", "past_key_values.0.recurrent")])
def test_a_cache_onnxruntime_genai_does_not_allocate_is_refused_in_one_line_and_nothing_is_written(tmp_path, family,
                                                                                                 entry):
    checkpoint = tmp_path / family
    assert invoke("example", checkpoint, "--arch", family).exit_code == 0
    out = invoke("export", checkpoint, "--with-past", "--target", "portable", "--genai", tmp_path / "folder")
    assert_one_line_error(out, f"--genai: the cache entry {entry}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [family]


@pytest.mark.slow
def test_a_layer_whose_attention_does_not_match_stays_standard_and_the_cache_is_not_shared(block_checkpoint,
                                                                                        tmp_path):
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions
    from attnres_export.graphs.onnxruntime_ops.attention import group_query_attention

    plain = export_checkpoint(ExportOptions(block_checkpoint, tmp_path / "m.onnx", target="portable",
                                            with_past=True, check=False)).path
    model = onnx.load(str(plain))
    softmax = [n for n in model.graph.node if n.op_type == "Softmax" and "masked" in n.input[0]][1]
    model.graph.output.append(onnx.helper.make_tensor_value_info(softmax.output[0], onnx.TensorProto.FLOAT, None))
    rewrite = group_query_attention(model, heads=4, kv_heads=4)
    assert (rewrite.layers, rewrite.of) == (1, 2)
    concats = [n for n in model.graph.node if n.op_type == "Concat" and n.input[0].startswith("past_key_values.")]
    assert sorted(n.output[0] for n in concats) == ["present.1.key", "present.1.value"]


@pytest.mark.slow
def test_a_folder_that_misses_its_parity_bar_is_kept_beside_as_failed_and_replaces_nothing(block_checkpoint,
                                                                                         block_folder, tmp_path):
    folder = tmp_path / "folder"
    export_genai_folder(block_checkpoint, folder)
    before = (folder / "model.onnx").read_bytes()
    out = invoke("export", block_checkpoint, "--with-past", "--target", "onnxruntime", "--genai", folder,
                 "--tol", "float32:1e-30:1.0")
    assert out.exit_code == 1
    assert (folder / "model.onnx").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "folder.failed").iterdir()) == sorted(p.name for p in folder.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "folder.failed"]
    export_genai_folder(block_checkpoint, folder)  # an earlier onnxruntime-genai folder is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "folder.failed"]


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "onnxruntime"], "--genai needs --with-past"),
    (["--with-past"], "--genai needs --target onnxruntime: the tensorrt target keeps fused attnres nodes"),
    (["--with-past", "--target", "onnxruntime", "--dtype", "bfloat16"], "--dtype bfloat16 has no kernels"),
    (["--with-past", "--target", "onnxruntime", "-o", "x.onnx"], "-o and --genai"),
])
def test_what_onnxruntime_genai_cannot_run_is_refused_in_one_line(tmp_path, args, message):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    assert_one_line_error(invoke("export", ckpt, "--genai", tmp_path / "out", *args), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_a_folder_that_is_not_an_onnxruntime_genai_folder_or_holds_the_model_is_refused(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    common = ("--with-past", "--target", "onnxruntime")
    assert_one_line_error(invoke("export", ckpt, *common, "--genai", busy), "is not an onnxruntime-genai folder")
    assert_one_line_error(invoke("export", ckpt, *common, "--genai", tmp_path), "holds MODEL")
    (tmp_path / "file").write_text("")
    assert_one_line_error(invoke("export", ckpt, *common, "--genai", tmp_path / "file"), "is not a folder")


def test_a_checkpoint_without_an_end_of_sequence_id_is_refused_before_the_export(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    out = invoke("export", ckpt, "--with-past", "--target", "portable", "--genai", tmp_path / "out")
    assert_one_line_error(out, "--genai: no end-of-sequence token id")
    assert not (tmp_path / "out").exists()


def _write(folder: Path, name: str, content: dict) -> None:
    (folder / name).write_text(json.dumps(content))


def test_token_ids_come_from_generation_config_then_config_then_the_tokenizer_as_the_builder_reads_them(tmp_path):
    from tests.exporter.genai_helpers import write_tokenizer

    write_tokenizer(tmp_path, 97, eos_id=2)
    _write(tmp_path, "tokenizer_config.json", {"eos_token": "</s>", "bos_token": "<s>"})
    only_tokenizer = generation_defaults(tmp_path, 97)
    assert (only_tokenizer.eos_token_ids, only_tokenizer.bos_token_id, only_tokenizer.pad_token_id) == ([2], 1, 2)
    _write(tmp_path, "config.json", {"eos_token_id": [5, 6], "pad_token_id": 7})
    from_config = generation_defaults(tmp_path, 97)
    assert (from_config.eos_token_ids, from_config.pad_token_id) == ([2, 5, 6], 7)  # the turn end joins them
    assert generation_defaults(tmp_path, 97, hf_config_file=False).eos_token_ids == [2]
    _write(tmp_path, "generation_config.json", {"eos_token_id": 2, "pad_token_id": 3, "do_sample": True,
                                                "temperature": 0.7, "top_k": 5, "typical_p": 1.0})
    generation = generation_defaults(tmp_path, 97)
    assert (generation.eos_token_ids, generation.pad_token_id) == ([2], 3)
    assert (generation.search["do_sample"], generation.search["temperature"], generation.search["top_k"]) == (
        True, 0.7, 5)


@pytest.mark.parametrize(("content", "message"), [
    ({"eos_token_id": 2, "min_p": 0.1}, "sets 'min_p' = 0.1, which onnxruntime-genai has no search option for"),
    ({"eos_token_id": 200}, "eos_token_id must be a token id (or a list of them) in 0..96"),
    ({"eos_token_id": 2, "top_k": 2.5}, "top_k must be a int"),
    ({"eos_token_id": 2, "do_sample": "yes"}, "do_sample must be true or false"),
    ({"eos_token_id": 2, "pad_token_id": [1, 2]}, "pad_token_id must be one token id"),
])
def test_generation_settings_onnxruntime_genai_cannot_honour_are_refused_naming_the_key(tmp_path, content,
                                                                                      message):
    _write(tmp_path, "generation_config.json", content)
    with pytest.raises(ExportError) as raised:
        generation_defaults(tmp_path, 97)
    assert message in str(raised.value)


def test_caches_other_than_per_layer_keys_and_values_are_refused_naming_the_entry():
    kv = [{"name": f"past_key_values.{i}.{kv}", "axes": ["batch", 2, "past", 16]} for i in range(3)
          for kv in ("key", "value")]
    assert cache_layout(kv) == (3, 2, 16)
    latent = [{"name": "past_key_values.0.latent", "axes": ["batch", "past", 512]},
              {"name": "past_key_values.0.rope_key", "axes": ["batch", "past", 64]}]
    with pytest.raises(ExportError, match=r"past_key_values.0.latent \['batch', 'past', 512\] is not a layout"):
        cache_layout(latent)
    with pytest.raises(ExportError, match="one key and one value per layer"):
        cache_layout(kv[:-1])
    uneven = [*kv[:4], *({**e, "axes": ["batch", 4, "past", 16]} for e in kv[4:])]
    with pytest.raises(ExportError, match="different sizes"):
        cache_layout(uneven)


def test_the_model_type_is_the_body_s_when_onnxruntime_genai_runs_it_as_a_plain_decoder():
    assert model_type({"model_type": "qwen3"}) == "qwen3"
    assert model_type({"model_type": "qwen3_moe"}) == "decoder"
    assert model_type({"arch": "attnres-lm"}) == "decoder"


def _rms_norm_model(exponent: float) -> onnx.ModelProto:
    """``Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, e), [-1]), eps)))), w)`` as the exporter spells an
    RMSNorm (e = 2)."""
    from onnx import TensorProto, numpy_helper
    from onnx import helper as oh

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(exponent, np.float32), "e"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "w")]
    nodes = [oh.make_node("Pow", ["x", "e"], ["p"]), oh.make_node("ReduceMean", ["p", "axes"], ["m"]),
             oh.make_node("Add", ["m", "eps"], ["a"]), oh.make_node("Sqrt", ["a"], ["s"]),
             oh.make_node("Reciprocal", ["s"], ["r"]), oh.make_node("Mul", ["x", "r"], ["n"]),
             oh.make_node("Mul", ["n", "w"], ["y"])]
    graph = oh.make_graph(nodes, "rms", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 8])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 8])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_an_rms_norm_becomes_one_simplified_layer_normalization_computing_the_numpy_rms_norm():
    import onnxruntime as ort

    from attnres_export.graphs.onnxruntime_ops.norms import simplified_layer_norms

    model = _rms_norm_model(2.0)
    assert simplified_layer_norms(model) == 1
    assert [n.op_type for n in model.graph.node] == ["SimplifiedLayerNormalization"]
    x = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    w = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    other = _rms_norm_model(3.0)
    assert simplified_layer_norms(other) == 0 and len(other.graph.node) == 7
