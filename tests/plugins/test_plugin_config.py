"""The plugin's YAML, C++ source and attnres.ops.identity must name the same op."""

from __future__ import annotations

import pytest

from attnres.ops import identity
from attnres.plugins.build import SOURCE_DIR

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
