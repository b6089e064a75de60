"""Helpers of the onnxruntime-genai tests: tiny checkpoint folders with a tokenizer, generation through
onnxruntime-genai itself, and our decoders driven with the inputs onnxruntime-genai builds for a padded batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from attnres_export.decode.generate import Decoder, generate, torch_decoder
from attnres_export.models import load_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from attnres_export.models.hf_folder import save_folder
from tests.cli.test_cli import invoke
from tests.conftest import SMALL

PAD_ID = 0
"""The test tokenizer's ``<pad>``; prompts never hold it (onnxruntime-genai finds right padding by the pad id)."""
PROMPTS = ([11, 12, 13], [21, 22, 23, 24, 25, 26, 27], [31, 32, 33, 34, 35])
NEW_TOKENS = 40


def write_tokenizer(folder: Path, vocab_size: int, eos_id: int) -> None:
    """A byte-level BPE ``tokenizer.json`` of ``vocab_size`` tokens (``<pad>`` 0, ``<s>`` 1) and a
    ``tokenizer_config.json`` naming ``eos_id``'s token as the end of sequence."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60])
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    assert tokenizer.get_vocab_size() == vocab_size
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "pad_token": "<pad>",
              "eos_token": tokenizer.id_to_token(eos_id), "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def write_genai_checkpoint(folder: Path, seed: int = 0, **overrides) -> Path:
    """A checkpoint folder (config.json, safetensors, tokenizer, generation_config.json) of a tiny AttnResLM."""
    cfg = AttnResLMConfig(**{**SMALL, **overrides})
    save_folder(make_example(cfg, seed).state_dict(), cfg, folder)
    eos = write_generation_config(folder)
    write_tokenizer(folder, cfg.vocab_size, eos)
    return folder


def write_family_folder(folder: Path, family: str, seed: int = 0, block_size: int | None = None) -> Path:
    """A tiny Hugging Face folder of a decoder family (``attnres example --arch FAMILY``; K3's Attention
    Residuals with ``block_size``), with a generation_config.json."""
    args = ["--block-size", str(block_size)] if block_size is not None else []
    result = invoke("example", folder, "--arch", family, "--seed", str(seed), *args)
    assert result.exit_code == 0, result.output
    write_generation_config(folder)
    return folder


def write_generation_config(folder: Path) -> int:
    """Write a generation_config.json whose end-of-sequence id is a token the model's greedy continuation of
    ``PROMPTS`` never emits (so that every comparison runs ``NEW_TOKENS`` tokens); return that id."""
    model, cfg = load_checkpoint(folder)
    decoder = torch_decoder(model)
    emitted = set().union(*(generate(decoder, prompt, NEW_TOKENS).tokens for prompt in PROMPTS), *PROMPTS)
    eos = next(i for i in range(cfg.vocab_size - 1, 3, -1) if i not in emitted)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": eos, "transformers_version": "5.23.0", "_from_model_config": True}))
    return eos


def reference_tokens(checkpoint: Path, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    """Greedy tokens of the PyTorch model (float32, KV cache), batch 1."""
    model, _ = load_checkpoint(checkpoint)
    return generate(torch_decoder(model), prompt, n).tokens


def genai_generate(folder: Path, prompts: list[list[int]], n: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens of onnxruntime-genai on ``folder``: the prompts right-padded with the folder's pad id into one
    batch (onnxruntime-genai's convention), ``n`` new tokens each."""
    model = og.Model(str(folder))
    pad = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["pad_token_id"]
    width = max(len(p) for p in prompts)
    batch = np.array([p + [pad] * (width - len(p)) for p in prompts], dtype=np.int32)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=width + n, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(batch)
    while not generator.is_done():
        generator.generate_next_token()
    return [list(generator.get_sequence(i))[width:] for i in range(len(prompts))]


def padded_batch_tokens(decoder: Decoder, prompts: list[list[int]], n: int = NEW_TOKENS, pad: int = PAD_ID
                        ) -> list[list[int]]:
    """Greedy tokens of our ``decoder`` fed the inputs onnxruntime-genai builds for right-padded prompts
    (``src/models/position_inputs.cpp``, ``logits.cpp``): the mask is 0 on the padding, each row's positions count
    its own tokens, the first token of each row is read at its last prompt token, and every step appends a 1 to
    the mask and advances each row's position by one."""
    width = max(len(p) for p in prompts)
    lengths = np.array([len(p) for p in prompts])
    ids = np.array([p + [pad] * (width - len(p)) for p in prompts], dtype=np.int64)
    columns = np.arange(width)[None, :]
    mask = (columns < lengths[:, None]).astype(np.int64)
    positions = np.where(mask == 1, columns, 0).astype(np.int64)
    logits, past = decoder.step(ids, mask, positions, decoder.empty_past(len(prompts)))
    token = logits[np.arange(len(prompts)), lengths - 1].argmax(-1).astype(np.int64)
    tokens = [token]
    position = lengths - 1
    for _ in range(n - 1):
        position = position + 1
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
        logits, past = decoder.step(token[:, None], mask, position[:, None].astype(np.int64), past)
        token = logits[:, -1].argmax(-1).astype(np.int64)
        tokens.append(token)
    return np.stack(tokens, axis=1).tolist()


def int4_qwen3_genai_folder(tmp_path: Path, *options: str) -> tuple[Path, Path]:
    """(a tiny Qwen3 folder, its ``--genai`` folder exported with ``--quantize int4`` and ``options``)."""
    folder = write_family_folder(tmp_path / "qwen3", "qwen3", seed=2)
    out = tmp_path / "genai"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "--genai", out, "--quantize", "int4",
                    *options)
    assert result.exit_code == 0, result.output
    return folder, out


def assert_genai_generates_as(out: Path, model) -> None:
    """onnxruntime-genai on ``out`` gives ``model``'s greedy tokens (our PyTorch decoder) for two prompts."""
    expected = [generate(torch_decoder(model), prompt, NEW_TOKENS).tokens for prompt in PROMPTS[:2]]
    assert genai_generate(out, [PROMPTS[0]]) + genai_generate(out, [PROMPTS[1]]) == expected
