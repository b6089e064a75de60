"""Bad parts are refused in one line naming the weight."""

from __future__ import annotations

import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.store.quantized import quantization_config_of, quantized_view

from .helpers import prefixed, stored

MXFP4 = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                       "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                                                   "group_size": 32, "symmetric": True}}}}
PACK4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"],
                                       "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                   "group_size": 16, "symmetric": True}}}}


def mxfp4_parts(out=4, columns=64, scale=127):
    return {"weight_packed": torch.randint(0, 256, (out, columns // 2), dtype=torch.uint8),
            "weight_scale": torch.full((out, columns // 32), scale, dtype=torch.uint8)}


def refusal(tensors, config, match, named="ckpt: layers.0.w1"):
    with pytest.raises(CheckpointError, match=match) as caught:
        view = quantized_view(stored(prefixed("layers.0.w1", tensors)), config, "ckpt")
        view["layers.0.w1.weight"].read()
    assert "\n" not in str(caught.value) and named in str(caught.value)


def test_e8m0_nan_byte():
    parts = mxfp4_parts()
    parts["weight_scale"][2, 1] = 0xFF
    refusal(parts, MXFP4, r"E8M0 NaN byte 0xFF at \[2, 1\]")


def test_mxfp4_wrong_scale_shape():
    parts = mxfp4_parts()
    parts["weight_scale"] = parts["weight_scale"][:, :1]
    refusal(parts, MXFP4, r"weight_scale has shape \[4, 1\], expected \[4, 2\]")


def test_mxfp4_columns_not_whole_groups():
    parts = mxfp4_parts(columns=64)
    parts["weight_packed"] = parts["weight_packed"][:, :24]
    refusal(parts, MXFP4, "48 columns are not a whole number of 32-value scale groups")


def test_mxfp4_overflowing_scale_is_not_finite():
    parts = mxfp4_parts(scale=254)
    parts["weight_packed"][:] = 0x77  # 6 * 2**127 overflows float32
    refusal(parts, MXFP4, "NaN or infinite")


def test_weight_shape_disagrees():
    parts = mxfp4_parts() | {"weight_shape": torch.tensor([4, 32])}
    refusal(parts, MXFP4, r"weight_shape holds \[4, 32\], but the packed parts give \[4, 64\]")


def test_non_finite_scale():
    parts = {"weight_packed": torch.zeros(3, 4, dtype=torch.int32), "weight_scale": torch.ones(3, 2),
             "weight_shape": torch.tensor([3, 32])}
    parts["weight_scale"][1, 0] = float("inf")
    # the part's own read refuses it (StoredTensor.read checks every tensor it reads)
    refusal(parts, PACK4, "weight_scale holds NaN or infinite values", named="layers.0.w1.weight_scale")


def test_group_size_must_divide_columns():
    parts = {"weight_packed": torch.zeros(3, 5, dtype=torch.int32), "weight_scale": torch.ones(3, 3),
             "weight_shape": torch.tensor([3, 40])}
    refusal(parts, PACK4, "group_size 16 does not divide the 40 columns")


def test_fp8_block_wrong_scale_shape_and_nan():
    weight = torch.zeros(300, 200).to(torch.float8_e4m3fn)
    config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    refusal({"weight": weight, "weight_scale_inv": torch.ones(2, 2)}, config,
            r"weight_scale_inv has shape \[2, 2\], expected \[3, 2\]")
    scale = torch.ones(3, 2)
    scale[2, 1] = float("nan")
    refusal({"weight": weight, "weight_scale_inv": scale}, config, "weight_scale_inv holds NaN or infinite values",
            named="layers.0.w1.weight_scale_inv")


def test_activation_quantization_is_refused():
    config = {**MXFP4, "config_groups": {"group_0": {**MXFP4["config_groups"]["group_0"],
                                                     "input_activations": {"num_bits": 8, "type": "float"}}}}
    refusal(mxfp4_parts(), config, "input_activations: activation quantization .* is not emulated")
    refusal(mxfp4_parts() | {"input_scale": torch.ones(1)}, MXFP4, "input_scale: activation or KV-cache")


def test_parts_without_config_and_unknown_methods():
    refusal(mxfp4_parts(), None, "stored as uint8, a quantized weight.s part, but config.json has no "
                                 "quantization_config")
    refusal(mxfp4_parts(), {"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not read")
    nvfp4 = {"weight_packed": torch.zeros(4, 8, dtype=torch.uint8),
             "weight_scale": torch.ones(4, 1).to(torch.float8_e4m3fn), "weight_global_scale": torch.ones(1)}
    refusal(nvfp4, {**MXFP4, "format": "nvfp4-pack-quantized"}, "nvfp4-pack-quantized weight_packed .* is not read")


def test_dense_tensors_pass_through_and_k3_config_is_found():
    dense = stored({"embed.weight": torch.ones(2, 2), "layers.0.norm.weight": torch.ones(2)})
    assert quantized_view(dense, None, "ckpt") == dense
    assert quantization_config_of({"text_config": {"quantization_config": MXFP4}}) == MXFP4
    assert quantization_config_of({"quantization_config": MXFP4, "text_config": {}}) == MXFP4
    assert quantization_config_of({}) is None
