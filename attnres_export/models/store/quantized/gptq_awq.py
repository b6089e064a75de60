"""GPTQ and AWQ int4 (as Qwen publishes them, ``quant_method: gptq`` / ``awq``).

* GPTQ: ``qweight`` int32 ``[in * bits / 32, out]`` (``32 / bits`` input rows per word, lowest bits first),
  ``qzeros`` int32 ``[groups, out * bits / 32]`` (output columns packed the same way), ``scales`` ``[groups, out]``,
  ``g_idx`` int32 ``[in]`` (the group of each input row; ``i // group_size`` when absent). The float weight
  ``W[o, i] = scales[g, o] * (q[i, o] - z[g, o])`` with ``g = g_idx[i]``, ``z = qzeros + 1`` for
  ``checkpoint_format`` ``gptq`` (v1 stores zero - 1) and ``qzeros`` itself for ``gptq_v2``.
* AWQ (``version: gemm``): ``qweight`` int32 ``[in, out / 8]``, ``qzeros`` int32 ``[in / group, out / 8]``,
  ``scales`` ``[in / group, out]``; eight output columns per word in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble ``k``
  holds column ``AWQ_ORDER[k]``). ``W[o, i] = scales[i // group, o] * (q[i, o] - z[i // group, o])``.

(onnxruntime-genai 0.18.0 ``models/quantized_model.py`` reads both layouts so; AutoAWQ ``dequantize_gemm``.)"""

from __future__ import annotations

import torch

from attnres_export.models.store.quantized.base import (
    Blocked,
    Layout,
    QuantizedTensor,
    ceil_div,
    check_dtype,
    check_shape,
    finite_scale,
    refuse,
)
from attnres_export.models.store.tensors import StoredTensor

GPTQ_FORMAT = "gptq-int4"
AWQ_FORMAT = "awq-int4"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SCALE_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def recognise(parts: dict[str, StoredTensor]) -> bool:
    return "qweight" in parts


def unpack_rows(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Unsigned values packed along dim 0 (``32/bits`` rows per word, lowest bits first), ``count`` rows."""
    shifts = torch.arange(32 // bits, dtype=torch.int32) * bits
    fields = (words.unsqueeze(1) >> shifts.reshape(1, -1, 1)) & ((1 << bits) - 1)
    return fields.reshape(-1, words.shape[1])[:count]


def unpack_columns(words: torch.Tensor, bits: int, count: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Unsigned values packed along dim 1; with ``order``, field ``k`` of a word holds column ``order[k]``."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    if order is not None:
        fields = fields[..., [order.index(c) for c in range(per_word)]]
    return fields.reshape(words.shape[0], -1)[:, :count]


def _settings(config: dict, where: str) -> tuple[int, int]:
    bits, group = int(config.get("bits", config.get("w_bit", 0))), int(config.get("group_size",
                                                                                  config.get("q_group_size", 0)))
    if bits != 4:
        raise refuse(where, f"{bits}-bit {config.get('quant_method')} weights are not read (int4)")
    return bits, group


def check(parts: dict[str, StoredTensor], config: dict, where: str) -> tuple[str, torch.Size]:
    method = str(config.get("quant_method"))
    bits, group = _settings(config, where)
    qweight, qzeros, scales = parts["qweight"], parts.get("qzeros"), parts.get("scales")
    if qzeros is None or scales is None:
        raise refuse(where, f"qweight needs qzeros and scales ({method})")
    for name in ("qweight", "qzeros"):
        check_dtype(where, name, parts[name], (torch.int32,))
    check_dtype(where, "scales", scales, SCALE_TYPES)
    if qweight.dim() != 2 or scales.dim() != 2:
        raise refuse(where, "qweight and scales must have 2 dimensions")
    per_word = 32 // bits
    if method == "gptq":
        columns, out = qweight.shape[0] * per_word, qweight.shape[1]
        if "g_idx" in parts:
            check_dtype(where, "g_idx", parts["g_idx"], (torch.int32, torch.int64))
            check_shape(where, "g_idx", parts["g_idx"], [columns], "one group per input row")
        groups = 1 if group <= 0 else ceil_div(columns, group)
        if "g_idx" not in parts and group > 0 and columns % group:
            raise refuse(where, f"group_size {group} does not divide the {columns} columns and there is no g_idx")
        check_shape(where, "scales", scales, [groups, out], "one scale per group and output channel")
        check_shape(where, "qzeros", qzeros, [groups, ceil_div(out, per_word)], "packed like scales")
        if str(config.get("checkpoint_format", "gptq")) not in ("gptq", "gptq_v2"):
            raise refuse(where, f"GPTQ checkpoint_format {config.get('checkpoint_format')!r} is not read")
        return GPTQ_FORMAT, torch.Size([out, columns])
    if str(config.get("version", "gemm")).lower() != "gemm":
        raise refuse(where, f"AWQ version {config.get('version')!r} is not read (gemm)")
    if not config.get("zero_point", True):
        raise refuse(where, "AWQ without zero points is not read")
    columns, out = qweight.shape[0], qweight.shape[1] * per_word
    if group <= 0 or columns % group:
        raise refuse(where, f"group_size {group} does not divide the {columns} columns")
    check_shape(where, "scales", scales, [columns // group, out], "one scale per group and output channel")
    check_shape(where, "qzeros", qzeros, [columns // group, out // per_word], "packed like qweight")
    return AWQ_FORMAT, torch.Size([out, columns])


class GPTQAWQWeight(QuantizedTensor):
    def _decoded(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor]:
        """``(q [in, out], zeros [groups, out], scales [groups, out], group of each input row)``, unsigned."""
        bits, group = _settings(self.scheme, self.where)
        out, columns = self.shape
        scales = finite_scale(self.where, "scales", parts["scales"])
        if self.format == GPTQ_FORMAT:
            q = unpack_rows(parts["qweight"], bits, columns)
            zeros = unpack_columns(parts["qzeros"], bits, out)
            if str(self.scheme.get("checkpoint_format", "gptq")) == "gptq":
                zeros = zeros + 1
            if "g_idx" in parts:
                rows = parts["g_idx"].long()
                if bool(((rows < 0) | (rows >= scales.shape[0])).any()):
                    raise refuse(self.where, f"g_idx names groups outside 0..{scales.shape[0] - 1}")
            else:
                rows = torch.arange(columns) // (group if group > 0 else columns)
        else:
            q = unpack_columns(parts["qweight"], bits, out, AWQ_ORDER)
            zeros = unpack_columns(parts["qzeros"], bits, out, AWQ_ORDER)
            rows = torch.arange(columns) // group
        return q, zeros, scales, rows

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        q, zeros, scales, rows = self._decoded(parts)
        return ((q.to(torch.float32) - zeros[rows].to(torch.float32)) * scales[rows]).t().contiguous()

    def layout(self) -> Layout | None:
        """Read ``g_idx`` and the zero points (small) to tell act-order (no blocks) and a GPTQ v1 zero point of 16
        (outside int4: the values are then written as int8)."""
        bits, group = _settings(self.scheme, self.where)
        out, columns = self.shape
        size = group if group > 0 else columns
        if "g_idx" in self.parts and not torch.equal(self.parts["g_idx"].read().long(), torch.arange(columns) // size):
            return None
        order = None if self.format == GPTQ_FORMAT else AWQ_ORDER
        zeros = unpack_columns(self.parts["qzeros"].read(), bits, out, order)
        if self.format == GPTQ_FORMAT and str(self.scheme.get("checkpoint_format", "gptq")) == "gptq":
            zeros = zeros + 1
        wide = bool((zeros > 15).any())
        return Layout(size, 8 if wide else 4, torch.int8, True, self.parts["scales"].dtype == torch.float16)

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked | None:
        """Values and zero points shifted by -8 (int4 storage is unsigned); a GPTQ v1 zero point of 16 gives 8,
        outside int4 (a writer must then widen). ``None`` with act-order (``g_idx`` not ``i // group_size``)."""
        q, zeros, scales, rows = self._decoded(parts)
        columns = q.shape[0]
        group = int(self.scheme.get("group_size", self.scheme.get("q_group_size", 0)))
        size = group if group > 0 else columns
        if not torch.equal(rows, torch.arange(columns) // size):
            return None
        return Blocked((q - 8).t().to(torch.int8).contiguous(), scales.t().contiguous(),
                       (zeros - 8).t().to(torch.int8).contiguous(), size, 8 if bool((zeros > 15).any()) else 4)
