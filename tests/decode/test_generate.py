"""``attnres generate``: greedy tokens of the with-past ONNX on ONNX Runtime equal PyTorch's, sampling is seeded,
--prompt goes through a tokenizer.json beside the checkpoint, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnres_export.decode.generate import Sampling, generate, onnx_decoder, torch_decoder
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models import load_checkpoint
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import write_checkpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-block-attnres.pt"


def _greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """Independent reference: the full forward over the whole sequence for every new token (no cache)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.slow
def test_pytorch_greedy_generation_equals_argmax_of_the_full_forward(tmp_path):
    model, _ = load_checkpoint(write_checkpoint(tmp_path / "m.pt", seed=2, n_layers=2, block_size=2))
    got = generate(torch_decoder(model), [5, 6, 7], 12)
    assert got.tokens == _greedy_without_cache(model, [5, 6, 7], 12)


@pytest.mark.slow
def test_onnx_greedy_tokens_equal_pytorch_for_64_new_tokens_on_the_bundled_example(tmp_path):
    result = export_checkpoint(ExportOptions(EXAMPLE, output=tmp_path / "ex.onnx", with_past=True))
    assert result.report.ok
    model, _ = load_checkpoint(EXAMPLE)
    prompt = [1, 2, 3, 4, 5]
    torch_tokens = generate(torch_decoder(model), prompt, 64).tokens
    decoder = onnx_decoder(result.path)
    try:
        onnx_tokens = generate(decoder, prompt, 64).tokens
    finally:
        decoder.close()
    assert onnx_tokens == torch_tokens == _greedy_without_cache(model, prompt, 64)
    out = invoke("generate", EXAMPLE, "--ids", "1,2,3,4,5", "--max-new-tokens", "64", "--onnx", result.path, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["tokens"] == torch_tokens


@pytest.mark.slow
def test_sampling_is_reproducible_with_a_seed_and_respects_top_k(tmp_path):
    model, _ = load_checkpoint(write_checkpoint(tmp_path / "m.pt", seed=2, n_layers=1))
    decoder = torch_decoder(model)
    a = generate(decoder, [1, 2], 10, Sampling(temperature=1.5, top_k=3, seed=7)).tokens
    b = generate(decoder, [1, 2], 10, Sampling(temperature=1.5, top_k=3, seed=7)).tokens
    assert a == b
    ids = [1, 2]
    with torch.inference_mode():
        for token in a:
            top3 = model(torch.tensor([ids]))[0, -1].topk(3).indices.tolist()
            assert token in top3
            ids.append(token)


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


def test_prompt_text_is_encoded_by_the_tokenizer_beside_the_checkpoint(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", seed=2, n_layers=1)
    _write_tokenizer(tmp_path, 97)
    out = invoke("generate", ckpt, "--prompt", "w5 w9 w3", "--max-new-tokens", "4", "--json")
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    model, _ = load_checkpoint(ckpt)
    assert payload["prompt"] == [5, 9, 3]
    assert payload["tokens"] == _greedy_without_cache(model, [5, 9, 3], 4)
    assert payload["text"].split() == [f"w{t}" if t else "[UNK]" for t in payload["tokens"]]


@pytest.mark.parametrize(("args", "message"), [
    (["--ids", "1,x"], "--ids '1,x': expected comma-separated whole numbers"),
    (["--ids", "1,400"], "--ids: every token id must be in 0..96"),
    (["--prompt", "hello"], "--prompt needs a tokenizer"),
    (["--ids", "1", "--max-new-tokens", "70"], "exceeds the model's max_seq_len 64"),
    (["--ids", "1", "--temperature", "-1"], "--temperature -1.0: need a finite number >= 0"),
])
def test_bad_generate_input_is_one_line(tmp_path, args, message):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    assert_one_line_error(invoke("generate", ckpt, *args), message)


@pytest.mark.slow
def test_generate_refuses_an_onnx_without_past_inputs(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    out = tmp_path / "plain.onnx"
    export_checkpoint(ExportOptions(ckpt, output=out, seq=None, check=False))
    assert_one_line_error(invoke("generate", ckpt, "--ids", "1,2", "--onnx", out), "not a with-past model")
