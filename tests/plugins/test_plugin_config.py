"""The plugin's YAML, C++ source and attnres_export.ops.identity must name the same op."""

from __future__ import annotations

import pytest

from attnres_export.ops import identity
from attnres_export.plugins.build import SOURCE_DIR

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra")

PLUGIN_DIR = SOURCE_DIR / "attnResAggregatePlugin"


def test_yaml_names_the_op_of_identity() -> None:
    config = yaml.safe_load((PLUGIN_DIR / "AttnResAggregate_PluginConfig.yaml").read_text())
    assert config["name"] == identity.AGGREGATE
    version = config["versions"][identity.PLUGIN_VERSION]
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == identity.PLUGIN_NAMESPACE
    assert version["attributes"] == ["eps"]
    assert version["attribute_types"]["eps"] == "float32"
    assert version["inputs"][0] == "score_weight"
    assert version["outputs"] == ["h"]


def test_cpp_source_uses_the_same_strings() -> None:
    header = (PLUGIN_DIR / "attnResAggregatePlugin.h").read_text()
    common = (SOURCE_DIR / "common" / "attnresPluginCommon.h").read_text()
    source = (PLUGIN_DIR / "attnResAggregatePlugin.cpp").read_text()
    kernel = (PLUGIN_DIR / "attnResAggregateKernel.h").read_text()
    assert f'kAGGREGATE_NAME{{"{identity.AGGREGATE}"}}' in header
    assert f'kAGGREGATE_VERSION{{"{identity.PLUGIN_VERSION}"}}' in header
    assert f'kPLUGIN_NAMESPACE{{"{identity.PLUGIN_NAMESPACE}"}}' in common
    assert 'kEPS_FIELD{"eps"}' in source
    assert f"#define ATTNRES_MAX_SOURCES {identity.MAX_SOURCES}" in kernel


def test_api_registers_every_creator() -> None:
    creators = (SOURCE_DIR / "api" / "attnresPluginCreators.cpp").read_text()
    registered = (SOURCE_DIR / "api" / "registerPlugins.cpp").read_text()
    assert "AttnResAggregatePluginCreator" in creators
    assert "REGISTER_TENSORRT_PLUGIN(AttnResAggregatePluginCreator)" in registered
    assert "ResidualScoreAttentionPluginCreator residualAttentionCreator" in creators
    assert "&residualAttentionCreator" in creators
    assert "REGISTER_TENSORRT_PLUGIN(ResidualScoreAttentionPluginCreator)" in registered


RSA_DIR = SOURCE_DIR / "residualScoreAttentionPlugin"
RSA_NAME = getattr(identity, "RESIDUAL_ATTENTION", "ResidualScoreAttention")


def test_residual_attention_yaml_names_the_op_of_identity() -> None:
    config = yaml.safe_load((RSA_DIR / "ResidualScoreAttention_PluginConfig.yaml").read_text())
    assert config["name"] == RSA_NAME == "ResidualScoreAttention"
    version = config["versions"][identity.PLUGIN_VERSION]
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == identity.PLUGIN_NAMESPACE
    assert version["inputs"] == ["q", "k", "v", "prev_scores", "mask_bias"]
    assert version["outputs"] == ["out", "scores"]
    assert version["attributes"] == ["scale", "logit_divisor", "has_prev_scores", "has_mask"]
    assert version["attribute_types"] == {
        "scale": "float32",
        "logit_divisor": "float32",
        "has_prev_scores": "int32",
        "has_mask": "int32",
    }
    assert version["attributes_required"] == ["scale", "logit_divisor"]
    for config_ in version["configs"].values():
        assert config_["input_types"]["prev_scores"] == config_["output_types"]["scores"] == "float32"
        assert config_["input_types"]["q"] == config_["output_types"]["out"]


def test_residual_attention_cpp_uses_the_same_strings() -> None:
    header = (RSA_DIR / "residualScoreAttentionPlugin.h").read_text()
    source = (RSA_DIR / "residualScoreAttentionPlugin.cpp").read_text()
    kernel = (RSA_DIR / "residualScoreAttentionKernel.h").read_text()
    assert f'kRESIDUAL_ATTENTION_NAME{{"{RSA_NAME}"}}' in header
    assert f'kRESIDUAL_ATTENTION_VERSION{{"{identity.PLUGIN_VERSION}"}}' in header
    for field in ("scale", "logit_divisor", "has_prev_scores", "has_mask"):
        assert f'{{"{field}"}}' in source
    assert "#define ATTNRES_RSA_MAX_HEAD_DIM 128" in kernel
    assert "residualScoreAttentionLaunch(" in kernel
    for name in ("README.md", "residualScoreAttentionKernel.cu"):
        assert (RSA_DIR / name).is_file()
