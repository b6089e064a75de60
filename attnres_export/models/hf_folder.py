"""Checkpoint folders in the Hugging Face layout (docs/models.md#checkpoint-folders), read without unpickling.

A folder holds ``config.json`` and ``model.safetensors`` (or shards listed by ``model.safetensors.index.json``).
Two conventions are read:

- **attnres** (written by ``attnres convert-checkpoint``): ``config.json`` carries ``attnres_format`` /
  ``attnres_version`` and our config under ``attnres_config``; the tensors have our state_dict names.
- **K3** (the AttnRes conventions of Kimi K3): a Llama-style body (``model.layers.{i}.self_attn.q_proj`` ...)
  with per-layer ``self_attention_res_norm/proj`` and ``mlp_res_norm/proj``, model-level
  ``output_attn_res_norm/proj``, and ``attn_res_block_size`` counting decoder layers. It maps onto
  ``AttnResLM`` exactly (block_size = 2 * attn_res_block_size, gain = norm weight, query = proj weight,
  eps = rms_norm_eps); anything AttnResLM cannot compute (MLA, KDA, MoE, grouped KV heads, other rotary
  settings) is refused in one line naming it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from attnres_export.atomic import temporary_dir_beside
from attnres_export.errors import CheckpointError
from attnres_export.models.registry import architecture

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FORMAT = "attnres-checkpoint"
VERSION = 1
MAX_CONFIG_BYTES = 1 << 20
MAX_INDEX_BYTES = 64 << 20
"""A safetensors index lists one line per tensor: a few MB for the largest published models."""


def save_folder(state: dict[str, torch.Tensor], cfg, out_dir: Path,
                max_shard_bytes: int | None = None) -> list[Path]:
    """Write ``config.json`` and the weights (one file, or shards of at most ``max_shard_bytes`` plus an index)
    into ``out_dir``: everything is written into a temporary folder beside it and renamed into place last."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir} exists and is not an empty folder; choose a new output folder")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    config = {"architectures": [architecture(cfg.arch).hf_architecture], "model_type": cfg.arch,
              "attnres_format": FORMAT, "attnres_version": VERSION, "attnres_config": cfg.to_dict()}
    shards = _shards(tensors, max_shard_bytes)
    with temporary_dir_beside(out_dir) as tmp:
        folder = tmp / "out"
        folder.mkdir()
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(folder / name), metadata={"format": "pt"})
                weight_map |= dict.fromkeys(shard, name)
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(folder, out_dir)
    return sorted(out_dir.iterdir())


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    if not max_bytes:
        return [tensors]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def read_folder(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a checkpoint folder in our own naming (K3 folders are translated)."""
    config = _read_config(path)
    if "attnres_format" in config:
        if config["attnres_format"] != FORMAT:
            raise CheckpointError(f"{path}: attnres_format is {config['attnres_format']!r}, expected {FORMAT!r}")
        if config.get("attnres_version") != VERSION:
            raise CheckpointError(f"{path}: checkpoint version {config.get('attnres_version')!r} is not supported "
                                  f"(this attnres reads {VERSION})")
        if "attnres_config" not in config:
            raise CheckpointError(f"{path}/{CONFIG_FILE} has no 'attnres_config' entry")
        return config["attnres_config"], _read_tensors(path)
    if "attn_res_block_size" in config:
        return from_k3(config, _read_tensors(path), path)
    raise CheckpointError(
        f"{path}: {CONFIG_FILE} describes neither an attnres checkpoint (no attnres_format) nor an AttnRes model "
        "with K3 conventions (no attn_res_block_size); write one with `attnres convert-checkpoint IN.pt OUT_DIR`")


def _read_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: a checkpoint folder needs {CONFIG_FILE} (and {WEIGHTS_FILE} or {INDEX_FILE})")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{file}: over {MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return config


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of ``model.safetensors`` or of the shards an index lists (file names confined to the folder)."""
    if (path / INDEX_FILE).is_file():
        if (path / INDEX_FILE).stat().st_size > MAX_INDEX_BYTES:
            raise CheckpointError(f"{path / INDEX_FILE}: over {MAX_INDEX_BYTES >> 20} MB; not a safetensors index")
        try:
            index = json.loads((path / INDEX_FILE).read_text())
            weight_map = index["weight_map"]
            files = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{path / INDEX_FILE}: not a safetensors index ({exc})") from exc
        for name in files:
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise CheckpointError(f"{path / INDEX_FILE}: shard {name!r} is not a file name inside the folder")
        tensors: dict[str, torch.Tensor] = {}
        for name in files:
            part = _load_file(path / name)
            wanted = {k for k, v in weight_map.items() if v == name}
            if set(part) != wanted:
                extra = sorted(set(part) ^ wanted)[:3]
                raise CheckpointError(f"{path / name}: its tensors differ from what {INDEX_FILE} lists ({extra})")
            tensors |= part
        return tensors
    if (path / WEIGHTS_FILE).is_file():
        return _load_file(path / WEIGHTS_FILE)
    raise CheckpointError(f"{path}: no {WEIGHTS_FILE} and no {INDEX_FILE}")


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"{file}: no such shard")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0][:200]})") from exc


# --- K3 conventions --------------------------------------------------------------------------------------------

K3_UNSUPPORTED = {
    "linear_attn_config": "Kimi Delta Attention (linear_attn_config)",
    "q_lora_rank": "multi-head latent attention (q_lora_rank)",
    "kv_lora_rank": "multi-head latent attention (kv_lora_rank)",
    "num_experts": "mixture-of-experts MLPs (num_experts)",
    "n_routed_experts": "mixture-of-experts MLPs (n_routed_experts)",
    "rope_scaling": "scaled rotary embeddings (rope_scaling)",
    "hc_mult": "hyper-connections (hc_mult)",
}
"""Config keys of architectures AttnResLM does not compute (a null/empty value is accepted as absent)."""

K3_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn.wq.weight",
    "self_attn.k_proj.weight": "attn.wk.weight",
    "self_attn.v_proj.weight": "attn.wv.weight",
    "self_attn.o_proj.weight": "attn.wo.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "mlp.gate_proj.weight": "mlp.w1.weight",
    "mlp.up_proj.weight": "mlp.w3.weight",
    "mlp.down_proj.weight": "mlp.w2.weight",
    "self_attention_res_norm.weight": "attn_res.norm.weight",
    "mlp_res_norm.weight": "mlp_res.norm.weight",
}
K3_PROJ = {"self_attention_res_proj.weight": "attn_res.query", "mlp_res_proj.weight": "mlp_res.query"}


def from_k3(config: dict, tensors: dict[str, torch.Tensor], path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Our config and state_dict for a K3-convention AttnRes model on a Llama-style body; refuses the rest."""
    for key, what in K3_UNSUPPORTED.items():
        if config.get(key):
            raise CheckpointError(f"{path}: {what} is not supported: AttnResLM has dense softmax attention and "
                                  "SwiGLU MLPs only")
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "rms_norm_eps", "attn_res_block_size")
    missing = [k for k in required if k not in config]
    if missing:
        raise CheckpointError(f"{path}/{CONFIG_FILE}: missing {', '.join(missing)}")
    heads = config["num_attention_heads"]
    if config.get("num_key_value_heads", heads) != heads:
        raise CheckpointError(f"{path}: grouped-query attention (num_key_value_heads {config['num_key_value_heads']} "
                              f"!= num_attention_heads {heads}) is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act {config['hidden_act']!r} is not supported (SwiGLU with silu only)")
    if float(config.get("rope_theta", 10000.0)) != 10000.0:
        raise CheckpointError(f"{path}: rope_theta {config['rope_theta']} is not supported (AttnResLM uses 10000)")
    if any(config.get(k) for k in ("attention_bias", "mlp_bias")):
        raise CheckpointError(f"{path}: attention/MLP biases are not supported")
    block = config["attn_res_block_size"]
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise CheckpointError(f"{path}: attn_res_block_size must be a whole number >= 1, got {block!r}")
    ours = {
        "arch": "attnres-lm", "vocab_size": config["vocab_size"], "d_model": config["hidden_size"],
        "n_layers": config["num_hidden_layers"], "n_heads": heads, "d_ff": config["intermediate_size"],
        "residual": "attnres", "block_size": 2 * block, "eps": config["rms_norm_eps"],
        "max_seq_len": config.get("max_position_embeddings", 4096),
    }
    state: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    prefix = "model."
    tied = bool(config.get("tie_word_embeddings", False))
    for name, tensor in tensors.items():
        if name == "lm_head.weight":
            state["lm_head.weight"] = tensor
            continue
        if not name.startswith(prefix):
            unknown.append(name)
            continue
        rest = name[len(prefix):]
        if rest == "embed_tokens.weight":
            state["embed.weight"] = tensor
        elif rest == "norm.weight":
            state["norm.weight"] = tensor
        elif rest == "output_attn_res_norm.weight":
            state["out_res.norm.weight"] = tensor
        elif rest == "output_attn_res_proj.weight":
            state["out_res.query"] = _proj(tensor, name, path)
        elif rest.startswith("layers.") and rest.count(".") >= 2:
            _, index, leaf = rest.split(".", 2)
            if leaf in K3_LAYER:
                state[f"layers.{index}.{K3_LAYER[leaf]}"] = tensor
            elif leaf in K3_PROJ:
                state[f"layers.{index}.{K3_PROJ[leaf]}"] = _proj(tensor, name, path)
            else:
                unknown.append(name)
        else:
            unknown.append(name)
    if unknown:
        shown = ", ".join(sorted(unknown)[:3])
        raise CheckpointError(f"{path}: weights AttnResLM has no place for ({shown}"
                              f"{f' and {len(unknown) - 3} more' if len(unknown) > 3 else ''}); this architecture "
                              "is not supported")
    if tied and "lm_head.weight" not in state and "embed.weight" in state:
        state["lm_head.weight"] = state["embed.weight"]
    return ours, state


def _proj(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """A score projection ``[1, D]`` as our pseudo-query ``[D]``."""
    if tensor.dim() != 2 or tensor.shape[0] != 1:
        raise CheckpointError(f"{path}: {name} has shape {list(tensor.shape)}, expected [1, hidden_size]")
    return tensor[0]
