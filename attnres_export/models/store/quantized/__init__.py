"""Quantized checkpoints read as float weights, their packed parts kept for a graph writer (docs/quantization.md).

``quantized_view(tensors, quantization_config, where)`` replaces each quantized layer's parts
(``<prefix>.weight_packed``, ``.weight_scale``, ``.qweight``, ...) by one ``QuantizedTensor`` ``<prefix>.weight``. A
weight is quantized when its parts are there, whatever the config's ignore list says (the rule vLLM tpu-inference PR
#3325 and llama.cpp `conversion/kimi_k3.py` follow: K3 ships its router and latent projections BF16 though no ignore
pattern names them); the config gives the scheme (bits, groups, symmetry)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from attnres_export.models.store.quantized import fp8, gptq_awq, mxfp4, packed_int
from attnres_export.models.store.quantized.base import DEQUANTIZED, Blocked, QuantizedJoin, QuantizedTensor, refuse
from attnres_export.models.store.tensors import StoredTensor

__all__ = ["DEQUANTIZED", "Blocked", "QuantizedJoin", "QuantizedTensor", "quantization_config_of", "quantized_view"]

PART_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_scale_inv",
                 "weight_global_scale", "input_scale", "input_global_scale", "input_zero_point", "output_scale",
                 "k_scale", "v_scale", "qweight", "qzeros", "scales", "g_idx")
"""Suffixes of a quantized layer's parts (``<prefix>.<suffix>``); ``<prefix>.weight`` joins them when it is
stored in FP8 or int8."""


def quantization_config_of(config: Mapping) -> dict | None:
    """The ``quantization_config`` of a Hugging Face ``config.json``: top level, or under ``text_config`` (Kimi K3,
    review §1.3)."""
    found = config.get("quantization_config")
    text = config.get("text_config")
    if found is None and isinstance(text, Mapping):
        found = text.get("quantization_config")
    return dict(found) if isinstance(found, Mapping) else None


def quantized_view(tensors: dict[str, StoredTensor], quantization_config: dict | None,
                   where: str) -> dict[str, StoredTensor]:
    """``tensors`` with each quantized weight's parts replaced by one ``QuantizedTensor`` ``<prefix>.weight``
    (logical float shape, dtype float32, ``format`` the format's name, dequantized on read); other tensors as
    given. Reads nothing but a pack-quantized weight's 2-value ``weight_shape`` when its scales cannot tell the
    columns. Refuses in one line: parts no format here reads, parts without a config, a config's activation or KV
    cache quantization (not emulated), and every inconsistency of a weight's parts."""
    layers: dict[str, dict[str, StoredTensor]] = {}
    for name, tensor in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if suffix in PART_SUFFIXES or (suffix == "weight" and _is_quantized_type(tensor)):
            layers.setdefault(prefix, {})[suffix] = tensor
    layers = {prefix: parts for prefix, parts in layers.items() if set(parts) != {"weight"} or
              _is_quantized_type(parts["weight"])}
    if not layers:
        return dict(tensors)
    first = next(iter(layers))
    if quantization_config is None:
        suffix, part = next(iter(sorted(layers[first].items())))
        stored = str(part.dtype).removeprefix("torch.")
        raise refuse(where, f"{first}.{suffix} is stored as {stored}, a quantized weight's part, but config.json has "
                            "no quantization_config; attnres reads weights stored as float32, float16 or bfloat16, or "
                            "a quantized checkpoint with its quantization_config")
    method = str(quantization_config.get("quant_method", ""))
    reader = _READERS.get(method)
    if reader is None:
        raise refuse(f"{where}: {first}", f"quantization_config quant_method {method[:60]!r} is not read "
                                          "(compressed-tensors, fp8, gptq, awq)")
    view = dict(tensors)
    for prefix, parts in layers.items():
        at = f"{where}: {prefix}"
        if set(parts) == {"weight"}:
            stored = str(parts["weight"].dtype).removeprefix("torch.")
            raise refuse(where, f"{prefix}.weight is stored as {stored} with no scale, which no quantized format "
                                "has; attnres reads weights stored as float32, float16 or bfloat16, or quantized "
                                "with their scales")
        weight = reader(prefix, parts, quantization_config, at)
        for suffix in parts:
            del view[f"{prefix}.{suffix}"]
        view[f"{prefix}.weight"] = weight
    return view


def _is_quantized_type(tensor: StoredTensor) -> bool:
    return str(tensor.dtype).removeprefix("torch.").startswith(("float8", "int8"))


def _unused(parts: dict[str, StoredTensor], used: tuple[str, ...], what: str, where: str) -> dict[str, StoredTensor]:
    extra = sorted(set(parts) - set(used))
    if extra:
        activation = [name for name in extra if name.startswith(("input_", "output_", "k_", "v_"))]
        if activation:
            raise refuse(where, f"{activation[0]}: activation or KV-cache quantization is not emulated by attnres "
                                "(weights only); give a weight-only checkpoint")
        raise refuse(where, f"{', '.join(extra)} beside a {what} weight: not read")
    return {name: parts[name] for name in used if name in parts}


def _compressed_tensors(prefix: str, parts: dict[str, StoredTensor], config: dict, where: str) -> QuantizedTensor:
    if config.get("kv_cache_scheme"):
        raise refuse(where, "quantization_config kv_cache_scheme: KV-cache quantization is not emulated by attnres")
    groups = config.get("config_groups") or {}
    for name, group in groups.items():
        for kind in ("input_activations", "output_activations"):
            if isinstance(group, Mapping) and group.get(kind):
                raise refuse(where, f"quantization_config config_groups.{name}.{kind}: activation quantization (e.g. "
                                    "W8A8) is not emulated by attnres; give a weight-only checkpoint")
    scheme = _group_for(prefix, groups, where)
    weights = dict(scheme.get("weights") or {})
    fmt = str(scheme.get("format") or config.get("format") or "")
    if mxfp4.recognise(parts):
        if fmt and fmt != mxfp4.FORMAT:
            raise refuse(where, f"uint8 weight_packed with a one-byte weight_scale is {mxfp4.FORMAT}, the config "
                                f"says {fmt!r}")
        used = _unused(parts, (*mxfp4.PARTS, *mxfp4.OPTIONAL), mxfp4.FORMAT, where)
        return mxfp4.MXFP4Weight(mxfp4.check(used, weights, where), mxfp4.FORMAT, used, weights, where)
    if "weight_packed" in parts and parts["weight_packed"].dtype.itemsize == 1:
        raise refuse(where, f"{fmt or 'FP4'} weight_packed (e.g. nvfp4-pack-quantized) is not read; "
                            f"{mxfp4.FORMAT} and pack-quantized are")
    if packed_int.recognise(parts):
        if fmt and fmt != "pack-quantized":
            raise refuse(where, f"int32 weight_packed is pack-quantized, the config says {fmt!r}")
        used = _unused(parts, packed_int.PARTS, "pack-quantized", where)
        shape, bits = packed_int.check(used, weights, where)
        return packed_int.PackedIntWeight(shape, packed_int.format_name(bits), used, weights, where)
    if fp8.recognise_scaled(parts):
        used = _unused(parts, ("weight", "weight_scale", "weight_zero_point"), fmt or "float-quantized", where)
        name, shape = fp8.check_scaled(used, weights, where)
        return fp8.ScaledWeight(shape, name, used, weights, where)
    raise refuse(where, f"parts {', '.join(sorted(parts))} are no compressed-tensors format attnres reads "
                        f"(config format {fmt!r})")


def _group_for(prefix: str, groups: Mapping, where: str) -> dict:
    """The config group whose ``re:`` target matches ``prefix``; else the only group targeting module classes."""
    by_regex = [dict(g) for g in groups.values()
                if any(str(t).startswith("re:") and re.match(str(t)[3:], prefix) for t in g.get("targets") or [])]
    if len(by_regex) == 1:
        return by_regex[0]
    by_class = [dict(g) for g in groups.values() if any(not str(t).startswith("re:") for t in g.get("targets") or [])]
    if not by_regex and len(by_class) == 1:
        return by_class[0]
    if len(groups) == 1:
        return dict(next(iter(groups.values())))
    raise refuse(where, f"{len(by_regex) or len(by_class) or 0} quantization_config config_groups could apply; "
                        "cannot tell this weight's scheme")


def _fp8(prefix: str, parts: dict[str, StoredTensor], config: dict, where: str) -> QuantizedTensor:
    if str(config.get("activation_scheme", "dynamic")) != "dynamic":
        raise refuse(where, f"fp8 activation_scheme {config.get('activation_scheme')!r}: static activation "
                            "quantization is not emulated by attnres")
    if str(config.get("fmt", "e4m3")) != "e4m3":
        raise refuse(where, f"fp8 fmt {config.get('fmt')!r} is not read (e4m3)")
    block = config.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise refuse(where, f"fp8 weight_block_size {block!r} is not two positive block sizes (per-block FP8 only)")
    if not fp8.recognise_block(parts):
        raise refuse(where, f"parts {', '.join(sorted(parts))}: an fp8 weight is weight and weight_scale_inv")
    used = _unused(parts, ("weight", "weight_scale_inv"), fp8.BLOCK_FORMAT, where)
    return fp8.FP8BlockWeight(fp8.check_block(used, block, where), fp8.BLOCK_FORMAT, used,
                              {"weight_block_size": list(block)}, where)


def _gptq_awq(prefix: str, parts: dict[str, StoredTensor], config: dict, where: str) -> QuantizedTensor:
    if not gptq_awq.recognise(parts):
        raise refuse(where, f"parts {', '.join(sorted(parts))}: a {config.get('quant_method')} weight is qweight, "
                            "qzeros and scales")
    used = _unused(parts, ("qweight", "qzeros", "scales", "g_idx"), str(config.get("quant_method")), where)
    name, shape = gptq_awq.check(used, config, where)
    return gptq_awq.GPTQAWQWeight(shape, name, used, dict(config), where)


_READERS = {"compressed-tensors": _compressed_tensors, "fp8": _fp8, "gptq": _gptq_awq, "awq": _gptq_awq}
