"""``genai_config.json`` for a with-past ONNX (docs/genai.md#genai_configjson).

Everything comes from the exported file itself: the graph's inputs and outputs, its ``attnres.export`` metadata
(the cache entries the model's ``with_past().cache_inputs()`` declared, the family's ``metadata()``, the recorded dim
ranges) and the embedding table's shape; the token ids and search defaults come from the checkpoint's files
(``genai_tokens.py``). The keys and their meaning are those of onnxruntime-genai's ``src/config.cpp`` and of the
builder that writes them (``src/python/py/models/builders/base.py``: ``make_genai_config``).
"""

from __future__ import annotations

import re
from typing import Any

import onnx

from attnres_export.errors import ExportError
from attnres_export.exporter.genai_tokens import GenerationDefaults
from attnres_export.graphs.metadata import export_info
from attnres_export.models.base import STEP_INPUTS

LLM_TYPES = ("llama", "qwen2", "qwen3")
"""onnxruntime-genai model types (``src/models/model_type.h``, ``IsLLM``) that name a Hugging Face ``model_type`` of
the same spelling and that it runs as a plain decoder-only model; every other with-past model is ``decoder``, the
generic decoder-only type."""
GENERIC_TYPE = "decoder"
KEY_NAME, VALUE_NAME = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"
_CACHE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


def genai_config(model: onnx.ModelProto, filename: str, defaults: GenerationDefaults,
                 hf_config: dict | None = None) -> dict[str, Any]:
    """The ``genai_config.json`` of the with-past ``model`` (weightless is enough) saved as ``filename``;
    ``hf_config`` is the checkpoint folder's ``config.json`` (the query head count of a grouped-query body, which
    the export metadata leaves out)."""
    info = export_info(model)
    if not info.get("with_past"):
        raise ExportError("--genai: the ONNX is not a with-past export (no attnres.export with_past metadata); "
                          "export it with --with-past")
    layers, kv_heads, head_size = cache_layout(info.get("cache", []))
    _check_names(model, layers)
    context = min(int(info["max_seq_len"]), int(info["dims"]["total"][2]))
    vocab = int(info["vocab_size"])
    heads = info.get("num_attention_heads", info.get("n_heads", (hf_config or {}).get("num_attention_heads")))
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": head_size,
        "hidden_size": embedding_width(model),
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                   "past_key_names": KEY_NAME, "past_value_names": VALUE_NAME},
        "outputs": {"logits": "logits", "present_key_names": PRESENT_KEY, "present_value_names": PRESENT_VALUE},
        "num_attention_heads": int(heads) if isinstance(heads, int) and heads > 0 else kv_heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
    }
    search = {**defaults.search, "max_length": context, "past_present_share_buffer": False}
    return {
        "model": {
            "bos_token_id": defaults.bos_token_id,
            "context_length": context,
            "decoder": decoder,
            "eos_token_id": defaults.eos_token_ids if len(defaults.eos_token_ids) > 1 else defaults.eos_token_ids[0],
            "pad_token_id": defaults.pad_token_id,
            "type": model_type(info),
            "vocab_size": vocab,
        },
        "search": dict(sorted(search.items())),
    }


def model_type(info: dict) -> str:
    """The onnxruntime-genai type of a with-past export: its Hugging Face body's when onnxruntime-genai knows it
    as a plain decoder, else the generic ``decoder``."""
    hf_type = info.get("model_type")
    return hf_type if hf_type in LLM_TYPES else GENERIC_TYPE


def cache_layout(cache: list[dict]) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_size)`` of a cache that onnxruntime-genai's key/value cache can hold: per layer
    ``past_key_values.{i}.key`` and ``.value`` of ``[batch, kv_heads, past, head_size]``, one size for every
    layer. Any other state (a compressed latent, a recurrent state) is refused in one line naming it."""
    layers: dict[int, set[str]] = {}
    sizes = set()
    for entry in cache:
        name, axes = entry.get("name", ""), list(entry.get("axes", []))
        found = _CACHE.match(name)
        shaped = (len(axes) == 4 and axes[0] == "batch" and axes[2] == "past"
                  and all(isinstance(a, int) and a > 0 for a in (axes[1], axes[3])))
        if found is None or not shaped:
            raise ExportError(f"--genai: the cache entry {name} {axes} is not a layout onnxruntime-genai allocates "
                              "(per layer past_key_values.{i}.key/.value of [batch, kv_heads, past, head_size]); "
                              "this model cannot run there")
        layers.setdefault(int(found.group(1)), set()).add(found.group(2))
        sizes.add((axes[1], axes[3]))
    if not layers or sorted(layers) != list(range(len(layers))) or any(kv != {"key", "value"}
                                                                        for kv in layers.values()):
        raise ExportError("--genai: the cache is not one key and one value per layer 0..N-1; this model cannot run "
                          "under onnxruntime-genai")
    if len(sizes) != 1:
        raise ExportError(f"--genai: the layers cache different sizes {sorted(sizes)}; onnxruntime-genai holds one "
                          "kv_heads x head_size for every layer")
    (kv_heads, head_size), = sizes
    return len(layers), kv_heads, head_size


def _check_names(model: onnx.ModelProto, layers: int) -> None:
    """The graph's inputs and outputs are the names the config gives onnxruntime-genai."""
    inputs = {v.name for v in model.graph.input}
    outputs = {v.name for v in model.graph.output}
    wanted_in = {*STEP_INPUTS, *(p % i for i in range(layers) for p in (KEY_NAME, VALUE_NAME))}
    wanted_out = {"logits", *(p % i for i in range(layers) for p in (PRESENT_KEY, PRESENT_VALUE))}
    missing = sorted(wanted_in - inputs) + sorted(wanted_out - outputs)
    if missing:
        raise ExportError(f"--genai: the with-past ONNX lacks {', '.join(missing[:3])}; re-export it with --with-past")


def embedding_width(model: onnx.ModelProto) -> int:
    """The hidden size: the width of the table that ``input_ids`` index."""
    tables = {init.name: list(init.dims) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            dims = tables.get(node.input[0], [])
            if len(dims) == 2:
                return int(dims[1])
    raise ExportError("--genai: no embedding table indexed by input_ids in the ONNX; cannot tell its hidden size")
