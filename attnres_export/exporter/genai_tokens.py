"""The special token ids and search defaults of an onnxruntime-genai folder, read from the files a checkpoint
folder carries beside its weights (docs/genai.md#special-tokens-and-search-defaults).

onnxruntime-genai reads none of these files itself: its ``genai_config.json`` holds the ids and the search block.
They are resolved the way onnxruntime-genai's model builder resolves them (``builders/base.py``:
``make_genai_config``, ``resolve_special_token_ids``): ``generation_config.json`` first, then ``config.json``, then
the tokenizer's named tokens; the tokenizer's ``eos_token`` joins the end-of-sequence ids when the configs name
another one (chat models end a turn with it); the padding and beginning-of-sequence ids default to the first
end-of-sequence id. A folder that names no end-of-sequence id at all is refused, as the builder refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnres_export.errors import ExportError
from attnres_export.exporter.output_folders import json_object

GENERATION_CONFIG = "generation_config.json"
HF_CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER = "tokenizer.json"
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 128 << 20
"""The largest published tokenizer.json files are tens of MB; a larger one is not read."""

SEARCH_KEYS: dict[str, type] = {
    "do_sample": bool, "temperature": float, "top_k": int, "top_p": float, "repetition_penalty": float,
    "num_beams": int, "num_return_sequences": int, "length_penalty": float, "no_repeat_ngram_size": int,
    "diversity_penalty": float,
}
"""generation_config.json keys that are onnxruntime-genai search options of the same name and meaning."""
SEARCH_DEFAULTS: dict[str, Any] = {
    "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0, "num_beams": 1,
    "num_return_sequences": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0,
    "min_length": 0, "early_stopping": True,
}
"""The builder's search block when the checkpoint says nothing (transformers' generation defaults)."""
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
NOT_SEARCH_KEYS = frozenset({
    *TOKEN_KEYS, "transformers_version", "_from_model_config", "max_length", "max_new_tokens", "use_cache",
    "decoder_start_token_id", "cache_implementation", "return_dict_in_generate", "output_scores",
    "output_attentions", "output_hidden_states", "output_logits",
})
"""generation_config.json keys that change no token: ids (read above), the length (``max_length`` of the folder
is the model's context length, as the builder writes it), and output or cache bookkeeping."""
NEUTRAL: dict[str, Any] = {
    "typical_p": 1.0, "min_p": 0.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "encoder_repetition_penalty": 1.0,
    "num_beam_groups": 1, "renormalize_logits": False, "remove_invalid_values": False, "min_new_tokens": 0,
    "guidance_scale": 1.0, "low_memory": False, "encoder_no_repeat_ngram_size": 0,
}
"""Values with which a transformers generation key that onnxruntime-genai has no option for changes nothing;
``null`` is neutral for every key."""


@dataclass
class GenerationDefaults:
    eos_token_ids: list[int]
    bos_token_id: int
    pad_token_id: int
    search: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    """The files the values came from (for the command's summary)."""


def generation_defaults(folder: Path, vocab_size: int | None = None, hf_config_file: bool = True
                        ) -> GenerationDefaults:
    """Special token ids and search defaults from the checkpoint files in ``folder`` (ids checked against
    ``vocab_size`` when it is given); ``hf_config_file`` False skips ``config.json`` (a ``.pt`` checkpoint's folder:
    a config.json beside it describes another model)."""
    generation = json_file(folder / GENERATION_CONFIG)
    hf_config = json_file(folder / HF_CONFIG) if hf_config_file else {}
    tokenizer_config = json_file(folder / TOKENIZER_CONFIG)
    named = _named_tokens(folder, tokenizer_config) if tokenizer_config else {}
    for key, token_id in named.items():
        _ids(token_id, f"{TOKENIZER_CONFIG}: the {key.removesuffix('_id')}", vocab_size)
    found: dict[str, list[int] | int | None] = {}
    for key in TOKEN_KEYS:
        for source, values in ((GENERATION_CONFIG, generation), (HF_CONFIG, hf_config)):
            if values.get(key) is not None:
                found[key] = _ids(values[key], f"{source}: {key}", vocab_size)
                break
        else:
            found[key] = named.get(key)
    eos = found["eos_token_id"]
    if eos is None:
        raise ExportError(f"--genai: no end-of-sequence token id in {folder} (none of {GENERATION_CONFIG}, "
                          f"{HF_CONFIG} or {TOKENIZER_CONFIG} names one); add {GENERATION_CONFIG} with "
                          '{"eos_token_id": ID} beside the model')
    eos_ids = list(eos) if isinstance(eos, list) else [eos]
    turn_end = named.get("eos_token_id")
    if isinstance(turn_end, int) and turn_end not in eos_ids:
        eos_ids.insert(0, turn_end)
    sources = [name for name, values in ((GENERATION_CONFIG, generation), (HF_CONFIG, hf_config),
                                         (TOKENIZER_CONFIG, tokenizer_config)) if values]
    return GenerationDefaults(eos_ids, _single(found["bos_token_id"], eos_ids[0], "bos_token_id"),
                              _single(found["pad_token_id"], eos_ids[0], "pad_token_id"),
                              _search(generation), sources)


def _search(generation: dict) -> dict[str, Any]:
    """The search block: the builder's defaults, overridden by generation_config.json; a sampling key that
    onnxruntime-genai has no option for is refused unless its value disables it."""
    search = dict(SEARCH_DEFAULTS)
    for key, value in generation.items():
        if key in SEARCH_KEYS:
            search[key] = _typed(value, SEARCH_KEYS[key], key)
        elif key not in NOT_SEARCH_KEYS and value is not None and (key not in NEUTRAL or value != NEUTRAL[key]):
            raise ExportError(f"--genai: {GENERATION_CONFIG} sets {key!r} = {value!r}, which onnxruntime-genai has "
                              "no search option for (its generation would differ); remove the key, or set it "
                              "in the folder's genai_config.json yourself")
    return search


def _typed(value: Any, kind: type, key: str) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ExportError(f"--genai: {GENERATION_CONFIG}: {key} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise ExportError(f"--genai: {GENERATION_CONFIG}: {key} must be a {kind.__name__}, got {value!r}")
    return kind(value)


def _ids(value: Any, what: str, vocab_size: int | None) -> list[int] | int:
    values = value if isinstance(value, list) else [value]
    limit = vocab_size if vocab_size is not None else 2**31
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit for v in values):
        raise ExportError(f"--genai: {what} must be a token id (or a list of them) in 0..{limit - 1}, "
                          f"got {value!r}")
    return list(values) if isinstance(value, list) else value


def _single(value: list[int] | int | None, default: int, key: str) -> int:
    if value is None:
        return default
    if isinstance(value, list):
        if len(value) != 1:
            raise ExportError(f"--genai: {key} must be one token id, got {value}")
        return value[0]
    return value


def _named_tokens(folder: Path, tokenizer_config: dict) -> dict[str, int]:
    """``{bos,eos,pad}_token_id`` of the tokens ``tokenizer_config.json`` names, looked up in ``tokenizer.json``."""
    wanted = {f"{kind}_token_id": _content(tokenizer_config.get(f"{kind}_token")) for kind in ("bos", "eos", "pad")}
    wanted = {key: token for key, token in wanted.items() if token is not None}
    if not wanted:
        return {}
    vocab = _tokenizer_vocab(folder / TOKENIZER)
    missing = [token for token in wanted.values() if token not in vocab]
    if missing:
        raise ExportError(f"--genai: {folder / TOKENIZER_CONFIG} names {missing[0]!r}, which "
                          f"{TOKENIZER} does not define; fix the tokenizer files")
    return {key: vocab[token] for key, token in wanted.items()}


def _content(entry: Any) -> str | None:
    """A named token: a string, or transformers' ``{"content": ...}`` form."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


def _tokenizer_vocab(path: Path) -> dict[str, int]:
    """Token -> id of a Hugging Face ``tokenizer.json``: its added tokens and its model's vocabulary."""
    if not path.is_file():
        raise ExportError(f"--genai: {path.parent / TOKENIZER_CONFIG} names special tokens but there is no "
                          f"{TOKENIZER} to look their ids up in; add it or give the ids in {GENERATION_CONFIG}")
    data = json_file(path, MAX_TOKENIZER_BYTES)
    vocab = data.get("model", {}).get("vocab", {}) if isinstance(data.get("model"), dict) else {}
    table = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
    for added in data.get("added_tokens", []):
        if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
            table[added["content"]] = added["id"]
    return table


def json_file(path: Path, limit: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON object file, or {} when there is none."""
    return json_object(path, "--genai", limit)
