"""``from_hf_folder``: a ``DecoderLM`` from a Hugging Face folder (``config.json`` plus safetensors), without renaming.

The tensors must be exactly the model's state_dict (docs/models.md#decoderlm): transformers' names, plus with
AttnRes the K3 site weights. Two things transformers also accepts are handled the same way: with
``tie_word_embeddings`` the folder may leave out ``lm_head.weight`` (one that is given must equal the
embedding), and DeepSeek's multi-token-prediction layers stored after the body (``model.layers.{N}..``) are
not loaded. Everything else missing, extra or misshapen is refused in one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.hf_config import parse_hf_config
from attnres_export.models.decoder.model import DecoderLM
from attnres_export.models.decoder.residual import ResidualNorm, ResidualProjection

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 1 << 20
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def from_hf_folder(path: Path | str, dtype: torch.dtype | None = None) -> DecoderLM:
    """The model of a folder, its weights in ``dtype`` (default: the stored type of the embedding); the AttnRes
    site weights are always float32 (they are folded in float32)."""
    path = Path(path)
    cfg = parse_hf_config(read_config(path), where=str(path / CONFIG_FILE))
    return load_weights(cfg, read_tensors(path), str(path), dtype)


def read_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: a model folder needs {CONFIG_FILE} (and {WEIGHTS_FILE} or {INDEX_FILE})")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{file}: over {MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from exc


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` or of the shards ``model.safetensors.index.json`` lists (shard names
    must be plain file names inside the folder)."""
    index_file = path / INDEX_FILE
    if not index_file.is_file():
        if not (path / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"{path}: no {WEIGHTS_FILE} and no {INDEX_FILE}")
        return _load_file(path / WEIGHTS_FILE)
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index_file}: not a safetensors index ({exc})") from exc
    tensors: dict[str, torch.Tensor] = {}
    for name in shards:
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{index_file}: shard {name!r} is not a file name inside the folder")
        part = _load_file(path / name)
        listed = {k for k, v in weight_map.items() if v == name}
        if set(part) != listed:
            raise CheckpointError(f"{path / name}: its tensors differ from what {INDEX_FILE} lists "
                                  f"({sorted(set(part) ^ listed)[:3]})")
        tensors |= part
    return tensors


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"{file}: no such shard")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0][:200]})") from exc


def load_weights(cfg: DecoderConfig, tensors: dict[str, torch.Tensor], where: str,
                 dtype: torch.dtype | None = None) -> DecoderLM:
    """A ``DecoderLM`` of ``cfg`` holding ``tensors`` (transformers' names), built without allocating twice."""
    with torch.device("meta"):
        model = DecoderLM(cfg)
    expected = model.state_dict()
    state = _without_mtp_layers(cfg, dict(tensors))
    embed_name, head_name = "model.embed_tokens.weight", "lm_head.weight"
    if cfg.tie_word_embeddings and embed_name in state:
        if head_name in state and not torch.equal(state[head_name], state[embed_name]):
            raise CheckpointError(f"{where}: tie_word_embeddings is true but {head_name} differs from {embed_name}")
        state[head_name] = state[embed_name]
    missing, unknown = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    for names, what in ((missing, "missing weights"), (unknown, f"weights a {cfg.model_type} body has no place for")):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise CheckpointError(f"{where}: {what}: {', '.join(names[:3])}{more}")
    float32_names = {f"{prefix}.weight" for prefix, module in model.named_modules()
                     if isinstance(module, ResidualNorm | ResidualProjection)}
    target = dtype or state[embed_name].dtype
    if target not in FLOAT_TYPES:
        raise CheckpointError(f"{where}: {embed_name} is {state[embed_name].dtype}; weights must be float32, "
                              "float16 or bfloat16")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"{where}: {name} has shape {list(tensor.shape)}, the config implies "
                                  f"{list(expected[name].shape)}")
        if tensor.dtype not in FLOAT_TYPES:
            raise CheckpointError(f"{where}: {name} is {tensor.dtype}; weights must be float32, float16 or bfloat16")
        state[name] = tensor.to(torch.float32 if name in float32_names else target)
    model.load_state_dict(state, assign=True, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def _without_mtp_layers(cfg: DecoderConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without DeepSeek's multi-token-prediction layers (indices ``N .. N + mtp_layers - 1``)."""
    prefixes = tuple(f"model.layers.{i}." for i in range(cfg.num_hidden_layers,
                                                         cfg.num_hidden_layers + cfg.mtp_layers))
    return {k: v for k, v in state.items() if not (prefixes and k.startswith(prefixes))}
