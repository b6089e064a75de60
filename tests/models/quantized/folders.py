"""Quantized Hugging Face folders for the export tests: a float folder's linear weights compressed the way each
format's writers compress them, written with the ``quantization_config`` those writers put in ``config.json``, and
an independent dequantization of the written parts (the reference the exported graphs are compared with).

- compressed-tensors formats (``pack-quantized``, ``float-quantized``, ``mxfp4-pack-quantized``): compressed-tensors'
  own compressors; its own ``decompress`` is the reference.
- FP8 blocks (``quant_method: fp8``, DeepSeek-V3 / Qwen3 FP8), GPTQ and AWQ: packed here with the packers of
  ``test_fp8_gptq_awq.py``; the reference unpacks the stored words with NumPy shifts written from the formats'
  descriptions (docs/quantization.md#formats) and multiplies with the FP8 block reference of that test file."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

QUANTIZED = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\..*(proj|w[123])\.weight$")
"""The linear weights a quantized release packs: attention and MLP projections, experts included; embeddings,
norms, routers (``mlp.gate.weight``) and the head stay float."""

GROUP = 32
"""The group (block) size of the group formats here: it divides every input width of ``BODIES``."""

BODIES = {
    "llama": {"hidden_size": 64, "intermediate_size": 96},
    "qwen3": {"hidden_size": 64, "intermediate_size": 96, "head_dim": 16},
    "qwen3_moe": {"hidden_size": 64, "intermediate_size": 96, "head_dim": 16, "mlp_only_layers": [0],
                  "moe_intermediate_size": 32},
    "deepseek_v3": {"hidden_size": 64, "intermediate_size": 96, "first_k_dense_replace": 1, "q_lora_rank": 32,
                    "kv_lora_rank": 32, "v_head_dim": 8, "moe_intermediate_size": 32},
}
"""Tiny bodies (``hf_bodies.hf_model`` overrides) whose linear input widths are all multiples of ``GROUP``: Qwen3-MoE
layers 1-2 and DeepSeek-V3 layers 1-2 have routed experts (DeepSeek-V3 a shared expert too); the DeepSeek-V3 MLA
ranks and value width are raised from hf_bodies' 16/12/10 so the latent and output projections hold whole groups."""


def float_folder(family: str, path: Path, seed: int = 0) -> Path:
    """A float32 ``family`` folder of ``BODIES[family]`` at ``seed``."""
    from tests.models.decoder.hf_bodies import hf_model, write_folder

    return write_folder(hf_model(family, seed, **BODIES[family]), path)


def copy_folder(source: Path, path: Path) -> Path:
    shutil.copytree(source, path)
    return path


def int_args(bits: int, group: int, symmetric: bool):
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=bits, type="int", strategy="group", group_size=group, symmetric=symmetric)


def channel_args(bits: int, kind: str = "int"):
    """Symmetric per-output-channel arguments: int8 (``pack-quantized``) or FP8 E4M3 (``float-quantized``)."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=bits, type=kind, strategy="channel", symmetric=True)


def mxfp4_args():
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True,
                            scale_dtype=torch.uint8)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _write(folder: Path, tensors: dict[str, torch.Tensor], quantization: dict | None) -> None:
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = _config(folder)
    target = config.get("text_config", config)
    if quantization is None:
        target.pop("quantization_config", None)
    else:
        target["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def quantized_config(folder: Path) -> dict:
    config = _config(folder)
    return config.get("text_config", config)["quantization_config"]


def _compressed_tensors_config(fmt: str, args) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": args.model_dump(mode="json", exclude_none=True),
                                          "input_activations": None}},
            "ignore": ["lm_head"]}


def quantize_folder(folder: Path, fmt: str, args, prefix: str = "") -> Path:
    """Compress every ``QUANTIZED`` weight of ``folder`` in place into ``fmt`` (``pack-quantized``,
    ``float-quantized``, ``mxfp4-pack-quantized``) with ``args``; returns the folder."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    from tests.models.quantized.test_compressed_tensors import qparams

    warnings.filterwarnings("ignore", module="compressed_tensors")
    tensors = load_file(str(folder / "model.safetensors"))
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    out = {}
    for name, tensor in tensors.items():
        if not QUANTIZED.search(name[len(prefix):] if name.startswith(prefix) else name):
            out[name] = tensor
            continue
        scale, zero = qparams(tensor.float(), args)
        packed = compressor.compress({"weight": tensor.float(), "weight_scale": scale, "weight_zero_point": zero},
                                     scheme)
        base = name.removesuffix(".weight")
        out |= {f"{base}.{part}": value.contiguous() for part, value in packed.items()}
    _write(folder, out, _compressed_tensors_config(fmt, args))
    return folder


FP8_MAX = 448.0
"""The largest float8 E4M3FN value."""


def fp8_block_folder(folder: Path, block: tuple[int, int] = (GROUP, GROUP)) -> Path:
    """DeepSeek-V3 / Qwen3 FP8: each ``QUANTIZED`` weight as float8 E4M3FN ``weight`` times a float32
    ``weight_scale_inv`` per ``block`` (its absmax over 448), ``quant_method: fp8``."""
    rows, cols = block
    out = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not QUANTIZED.search(name):
            out[name] = tensor
            continue
        weight = tensor.float()
        scale = torch.empty(-(-weight.shape[0] // rows), -(-weight.shape[1] // cols))
        values = torch.empty_like(weight)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                piece = weight[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]
                scale[i, j] = piece.abs().amax().clamp_min(1e-12) / FP8_MAX
                values[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] = piece / scale[i, j]
        out[name] = values.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale_inv"] = scale
    _write(folder, out, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                         "weight_block_size": list(block)})
    return folder


def _min_max_int4(weight: torch.Tensor, columns_group: np.ndarray, groups: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric 4-bit min/max quantization of ``weight [out, in]`` with the group of each input column:
    ``(q [in, out] in 0..15, zero [groups, out] in 0..15, scale [groups, out] float16)`` as GPTQ/AWQ store them
    (the range always holds 0, as their quantizers make it)."""
    w = weight.double().numpy().T  # [in, out]
    scale = np.empty((groups, w.shape[1]), dtype=np.float16)
    zero = np.empty((groups, w.shape[1]), dtype=np.int64)
    for g in range(groups):
        rows = w[columns_group == g]
        low, high = np.minimum(rows.min(0), 0), np.maximum(rows.max(0), 0)
        scale[g] = np.maximum((high - low) / 15, 1e-6).astype(np.float16)
        zero[g] = np.clip(np.rint(-low / scale[g].astype(np.float64)), 0, 15)
    s, z = scale[columns_group].astype(np.float64), zero[columns_group]
    q = np.clip(np.rint(w / s) + z, 0, 15).astype(np.int64)
    return q, zero, scale


def gptq_folder(folder: Path, group: int = GROUP, act_order: bool = False, seed: int = 0) -> Path:
    """GPTQ int4 (``checkpoint_format: gptq``, v1: ``qzeros`` stores the zero point minus one): ``qweight``
    ``[in/8, out]``, ``qzeros`` ``[groups, out/8]``, float16 ``scales`` ``[groups, out]``, ``g_idx`` ``[in]``. With
    ``act_order`` the columns' groups are a seeded shuffle of ``i // group`` and ``desc_act`` is true."""
    from tests.models.quantized.test_fp8_gptq_awq import pack_columns, pack_rows

    rng = np.random.default_rng(seed)
    out = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not QUANTIZED.search(name):
            out[name] = tensor
            continue
        columns = tensor.shape[1]
        g_idx = np.arange(columns) // group
        if act_order:
            g_idx = rng.permutation(g_idx)
        q, zero, scale = _min_max_int4(tensor, g_idx, columns // group)
        base = name.removesuffix(".weight")
        out |= {f"{base}.qweight": torch.from_numpy(pack_rows(q)),
                f"{base}.qzeros": torch.from_numpy(pack_columns((zero - 1) % 16)),
                f"{base}.scales": torch.from_numpy(scale), f"{base}.g_idx": torch.from_numpy(g_idx.astype(np.int32))}
    _write(folder, out, {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                         "sym": False, "checkpoint_format": "gptq"})
    return folder


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ GEMM: field k of a word holds column ``AWQ_ORDER[k]`` of its eight."""


def awq_folder(folder: Path, group: int = GROUP) -> Path:
    """AWQ int4 GEMM: ``qweight`` ``[in, out/8]`` and ``qzeros`` ``[in/g, out/8]`` in ``AWQ_ORDER``, float16
    ``scales`` ``[in/g, out]``."""
    from tests.models.quantized.test_fp8_gptq_awq import pack_columns

    out = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not QUANTIZED.search(name):
            out[name] = tensor
            continue
        columns = tensor.shape[1]
        q, zero, scale = _min_max_int4(tensor, np.arange(columns) // group, columns // group)
        base = name.removesuffix(".weight")
        out |= {f"{base}.qweight": torch.from_numpy(pack_columns(q, AWQ_ORDER)),
                f"{base}.qzeros": torch.from_numpy(pack_columns(zero, AWQ_ORDER)),
                f"{base}.scales": torch.from_numpy(scale)}
    _write(folder, out, {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm",
                         "zero_point": True})
    return folder


def _unpack_rows(words: np.ndarray) -> np.ndarray:
    """Inverse of GPTQ's row packing: ``[n/8, c]`` int32 words to ``[n, c]`` nibbles, row ``8r + k`` at bits
    ``4k`` of word row ``r``."""
    u = words.view(np.uint32).astype(np.int64)
    return np.stack([(u >> (4 * k)) & 15 for k in range(8)], axis=1).reshape(-1, u.shape[1])


def _unpack_columns(words: np.ndarray, order: tuple[int, ...] = tuple(range(8))) -> np.ndarray:
    """Inverse of the column packing: ``[r, c/8]`` words to ``[r, c]``, field ``k`` of word ``w`` is column
    ``8w + order[k]``."""
    u = words.view(np.uint32).astype(np.int64)
    out = np.empty((u.shape[0], u.shape[1] * 8), dtype=np.int64)
    for k in range(8):
        out[:, order[k]::8] = (u >> (4 * k)) & 15
    return out


def dequantized_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every quantized weight of ``folder`` (``<prefix>.weight``, float32 ``[out, in]``) dequantized from its stored
    parts by the references named in the module docstring, without attnres_export's readers."""
    from tests.models.quantized.test_fp8_gptq_awq import fp8_reference

    tensors = load_file(str(folder / "model.safetensors"))
    config = quantized_config(folder)
    method = config["quant_method"]
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        prefix, _, part = name.rpartition(".")
        if QUANTIZED.search(f"{prefix}.weight") and not (method == "compressed-tensors" and part == "weight"
                                                         and tensor.dtype.is_floating_point
                                                         and tensor.dtype.itemsize > 1):
            layers.setdefault(prefix, {})[part] = tensor
    out = {}
    if method == "compressed-tensors":
        from compressed_tensors.compressors import BaseCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        warnings.filterwarnings("ignore", module="compressed_tensors")
        group = next(iter(config["config_groups"].values()))
        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**group["weights"]))
        compressor = BaseCompressor.get_value_from_registry(config["format"])
        for prefix, parts in layers.items():
            out[f"{prefix}.weight"] = compressor.decompress(dict(parts), scheme)["weight"].float()
    elif method == "fp8":
        block = tuple(config["weight_block_size"])
        for prefix, parts in layers.items():
            weight = parts["weight"].float().numpy().astype(np.float64)
            out[f"{prefix}.weight"] = torch.from_numpy(
                fp8_reference(weight, parts["weight_scale_inv"].numpy(), block).astype(np.float32))
    else:
        gptq = method == "gptq"
        for prefix, parts in layers.items():
            scales = parts["scales"].numpy().astype(np.float64)
            if gptq:
                q, groups = _unpack_rows(parts["qweight"].numpy()), parts["g_idx"].numpy().astype(np.int64)
                zero = _unpack_columns(parts["qzeros"].numpy()) + 1  # v1 stores zero - 1
            else:
                q = _unpack_columns(parts["qweight"].numpy(), AWQ_ORDER)
                zero = _unpack_columns(parts["qzeros"].numpy(), AWQ_ORDER)
                groups = np.arange(q.shape[0]) // config["group_size"]
            weight = (q - zero[groups]) * scales[groups]
            out[f"{prefix}.weight"] = torch.from_numpy(weight.T.astype(np.float32).copy())
    return out


def dequantized_folder(folder: Path, path: Path) -> Path:
    """A float32 copy of quantized ``folder`` at ``path``: its quantized weights replaced by
    ``dequantized_weights`` and no ``quantization_config``, for transformers to load as the published model."""
    shutil.copytree(folder, path)
    weights = dequantized_weights(folder)
    prefixes = {name.removesuffix(".weight") for name in weights}
    kept = {name: tensor for name, tensor in load_file(str(folder / "model.safetensors")).items()
            if name.rpartition(".")[0] not in prefixes}
    _write(path, kept | weights, None)
    return path


def quantized_weight_shapes(folder: Path) -> dict[str, tuple[int, int]]:
    """The logical ``[out, in]`` shape of every quantized weight of ``folder``, by ``<prefix>.weight``."""
    return {name: tuple(weight.shape) for name, weight in dequantized_weights(folder).items()}
