"""The plugin's YAML, C++ source and attnres_export.ops.opset must name the same op.

The native layout follows NVIDIA/TensorRT's plugin/: shared code in common/, one folder per plugin that
includes only its own headers and common/, and one list of creators (api/attnresPluginCreators.cpp)
that both TensorRT libraries serve.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from attnres_export.ops import opset
from attnres_export.plugins.build import SOURCE_DIR

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra")

PLUGIN_DIR = SOURCE_DIR / "attnResAggregatePlugin"
NORM_DIR = SOURCE_DIR / "attnResAggregateNormPlugin"
RSA_DIR = SOURCE_DIR / "residualScoreAttentionPlugin"
COMMON_DIR = SOURCE_DIR / "common"
API_DIR = SOURCE_DIR / "api"
NATIVE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")

PLUGIN_FOLDERS = sorted(p.parent for p in SOURCE_DIR.glob("*Plugin/*_PluginConfig.yaml"))
"""Every plugin folder: one per plugin, each with its <Name>_PluginConfig.yaml."""


def _native_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in NATIVE_SUFFIXES)


def _includes(path: Path) -> list[str]:
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.MULTILINE)


def _creator_class(folder: Path) -> str:
    """The one IPluginCreatorV3One (directly or through common/'s CreatorBase) the folder's headers declare."""
    found = [
        name
        for header in folder.glob("*.h")
        for name in re.findall(
            r"class\s+(\w+)\s*:\s*public\s+(?:nvinfer1::IPluginCreatorV3One\b|CreatorBase<\w+>)", header.read_text()
        )
    ]
    assert len(found) == 1, f"{folder.name}: expected one plugin creator class, found {found}"
    return found[0]


def _string_constant(text: str, suffix: str) -> str:
    """Value of the one `constexpr char const* k<...><suffix>{"value"}` in text."""
    found = re.findall(rf'constexpr\s+char\s+const\s*\*\s*k\w*{suffix}\{{"([^"]*)"\}}', text)
    assert len(found) == 1, f"expected one k..{suffix} constant, found {found}"
    return found[0]


def _creator_list() -> list[str]:
    """Creator classes of the one list in api/attnresPluginCreators.cpp, in order."""
    source = (API_DIR / "attnresPluginCreators.cpp").read_text()
    lists = re.findall(r"creators\[\]\s*=\s*\{(.*?)\};", source, flags=re.DOTALL)
    assert len(lists) == 1, "api/attnresPluginCreators.cpp must hold exactly one creators[] list"
    return re.findall(r"creatorInstance<(\w+)>\(\)", lists[0])


def test_there_are_plugin_folders() -> None:
    assert {p.name for p in PLUGIN_FOLDERS} >= {
        "attnResAggregatePlugin",
        "attnResAggregateNormPlugin",
        "residualScoreAttentionPlugin",
    }


def test_yaml_names_the_op_of_opset() -> None:
    config = yaml.safe_load((PLUGIN_DIR / "AttnResAggregate_PluginConfig.yaml").read_text())
    assert config["name"] == opset.AGGREGATE
    version = config["versions"][opset.PLUGIN_VERSION]
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == opset.PLUGIN_NAMESPACE
    assert version["attributes"] == ["eps"]
    assert version["attribute_types"]["eps"] == "float32"
    assert version["inputs"][0] == "score_weight"
    assert version["outputs"] == ["h"]


def test_cpp_source_uses_the_same_strings() -> None:
    header = (PLUGIN_DIR / "attnResAggregatePlugin.h").read_text()
    common = (COMMON_DIR / "attnresPluginCommon.h").read_text()
    source = (PLUGIN_DIR / "attnResAggregatePlugin.cpp").read_text()
    kernel = (PLUGIN_DIR / "attnResAggregateKernel.h").read_text()
    launcher = (COMMON_DIR / "attnresAggregateApi.h").read_text()
    assert f'kAGGREGATE_NAME{{"{opset.AGGREGATE}"}}' in header
    assert f'kAGGREGATE_VERSION{{"{opset.PLUGIN_VERSION}"}}' in header
    assert f'kPLUGIN_NAMESPACE{{"{opset.PLUGIN_NAMESPACE}"}}' in common
    assert 'kEPS_FIELD{"eps"}' in source
    # The launcher's declaration is in common/ (the AttnResAggregateNorm launcher calls it too).
    assert '#include "common/attnresAggregateApi.h"' in kernel
    assert f"#define ATTNRES_MAX_SOURCES {opset.MAX_SOURCES}" in launcher
    assert "attnresAggregateLaunch(" in launcher


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=lambda p: p.name)
def test_creator_list_holds_each_plugin_once(folder: Path) -> None:
    creators = Counter(_creator_list())
    assert creators[_creator_class(folder)] == 1, f"{folder.name}'s creator must be in the creator list once"


def test_creator_list_holds_only_plugin_creators() -> None:
    assert sorted(_creator_list()) == sorted(_creator_class(folder) for folder in PLUGIN_FOLDERS)


def test_both_libraries_serve_the_one_list() -> None:
    registered = (API_DIR / "registerPlugins.cpp").read_text()
    dynamic = (API_DIR / "dynamicPlugins.cpp").read_text()
    assert "pluginCreators(" in registered
    assert "registerCreator(creator, pluginNamespace)" in registered
    assert "getPluginNamespace()" in registered
    assert "return attnres::plugin::pluginCreators(nbCreators);" in dynamic
    for source in (registered, dynamic):
        # No second list: neither entry point names a creator or registers one by type.
        assert "REGISTER_TENSORRT_PLUGIN(" not in source
        for folder in PLUGIN_FOLDERS:
            assert _creator_class(folder) not in source


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=lambda p: p.name)
def test_yaml_agrees_with_the_cpp(folder: Path) -> None:
    (config_path,) = folder.glob("*_PluginConfig.yaml")
    config = yaml.safe_load(config_path.read_text())
    header = "\n".join(p.read_text() for p in folder.glob("*Plugin.h"))
    source = "\n".join(p.read_text() for p in folder.glob("*Plugin.cpp"))
    common = (COMMON_DIR / "attnresPluginCommon.h").read_text()
    name = _string_constant(header, "_NAME")
    assert config["name"] == name
    assert config_path.name == f"{name}_PluginConfig.yaml"
    assert list(config["versions"]) == [_string_constant(header, "_VERSION")]
    (version,) = config["versions"].values()
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == _string_constant(common, "PLUGIN_NAMESPACE")
    # The creator's fields, in the order getFieldNames lists them, are the YAML's attributes.
    fields = dict(re.findall(r'constexpr\s+char\s+const\s*\*\s*(k\w+_FIELD)\{"([^"]+)"\}', source))
    creator_fields = re.findall(r"mFields\.emplace_back\((k\w+_FIELD)", source)
    assert [fields[f] for f in creator_fields] == version["attributes"]
    assert set(version.get("attributes_required", [])) <= set(version["attributes"])


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=lambda p: p.name)
def test_plugin_folder_includes_only_itself_and_common(folder: Path) -> None:
    others = {p.name for p in PLUGIN_FOLDERS if p != folder} | {"api"}
    for path in _native_files(folder):
        for include in _includes(path):
            top = include.split("/", 1)[0]
            assert top not in others, f"{path.relative_to(SOURCE_DIR)} includes {include}"


def test_common_includes_no_plugin_folder() -> None:
    plugins = {p.name for p in PLUGIN_FOLDERS} | {"api"}
    for path in _native_files(COMMON_DIR):
        for include in _includes(path):
            assert include.split("/", 1)[0] not in plugins, f"{path.relative_to(SOURCE_DIR)} includes {include}"


def test_kernel_abi_lives_in_common() -> None:
    api = (COMMON_DIR / "attnresKernelApi.h").read_text()
    assert "enum AttnresDtype" in api
    assert "#define ATTNRES_KERNEL_API " in api
    for folder in PLUGIN_FOLDERS:
        for kernel in folder.glob("*Kernel.h"):
            text = kernel.read_text()
            assert '#include "common/attnresKernelApi.h"' in text
            assert "enum AttnresDtype" not in text
            assert "#define ATTNRES_KERNEL_API" not in text


SHARED_HELPERS = (
    "void logError(",
    "bool isSourceType(",
    "bool isDataType(",
    "bool isKernelDataType(",
    "std::string dimsToString(",
    "bool compatible(",
    "bool same(",
    "bool readFloat(",
    "bool readInt(",
    "void readFloatField(",
    "void requireFiniteNonNegative(",
    "bool rowsAndWidth(",
    "bool checkAggregateShapes(",
)


def test_shared_helpers_are_defined_once_in_common() -> None:
    common = (COMMON_DIR / "attnresPluginCommon.cpp").read_text()
    defined = ("void logError(", "std::string dimsToString(", "bool compatible(", "bool readFloat(", "bool readInt(",
               "void readFloatField(", "void requireFiniteNonNegative(", "bool rowsAndWidth(",
               "bool checkAggregateShapes(")
    for helper in defined:
        assert helper in common
    for folder in PLUGIN_FOLDERS:
        for path in _native_files(folder):
            text = path.read_text()
            for helper in SHARED_HELPERS:
                assert helper not in text, f"{path.relative_to(SOURCE_DIR)} defines its own {helper}...)"


def test_residual_attention_yaml_names_the_op_of_opset() -> None:
    config = yaml.safe_load((RSA_DIR / "ResidualScoreAttention_PluginConfig.yaml").read_text())
    assert config["name"] == opset.RESIDUAL_ATTENTION == "ResidualScoreAttention"
    version = config["versions"][opset.PLUGIN_VERSION]
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == opset.PLUGIN_NAMESPACE
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
    assert f'kRESIDUAL_ATTENTION_NAME{{"{opset.RESIDUAL_ATTENTION}"}}' in header
    assert f'kRESIDUAL_ATTENTION_VERSION{{"{opset.PLUGIN_VERSION}"}}' in header
    for field in ("scale", "logit_divisor", "has_prev_scores", "has_mask"):
        assert f'{{"{field}"}}' in source
    assert "#define ATTNRES_RSA_MAX_HEAD_DIM 128" in kernel
    assert "residualScoreAttentionLaunch(" in kernel
    for name in ("README.md", "residualScoreAttentionKernel.cu"):
        assert (RSA_DIR / name).is_file()


def test_aggregate_norm_yaml_names_the_op_of_opset() -> None:
    config = yaml.safe_load((NORM_DIR / "AttnResAggregateNorm_PluginConfig.yaml").read_text())
    assert config["name"] == opset.AGGREGATE_NORM == "AttnResAggregateNorm"
    version = config["versions"][opset.PLUGIN_VERSION]
    assert version["interface"] == "IPluginV3"
    assert version["namespace"] == opset.PLUGIN_NAMESPACE
    assert version["inputs"] == ["score_weight", "norm_weight", "sources"]
    assert version["outputs"] == ["y", "h"]
    assert version["attributes"] == ["eps", "norm_eps", "has_aggregate"]
    assert version["attribute_types"] == {"eps": "float32", "norm_eps": "float32", "has_aggregate": "int32"}
    # has_aggregate is a presence flag, as has_prev_scores / has_mask: optional, 0 or 1.
    assert version["attributes_required"] == ["eps", "norm_eps"]
    assert version["attribute_options"]["has_aggregate"] == [0, 1]
    for name in ("eps", "norm_eps"):
        assert version["attribute_options"][name] == {"min": "0.0", "max": "=pinf"}
    for config_ in version["configs"].values():
        types = config_["input_types"]
        assert types["score_weight"] == types["norm_weight"] == "float32"
        assert types["sources"] == config_["output_types"]["y"] == config_["output_types"]["h"]


def test_aggregate_norm_cpp_uses_the_same_strings() -> None:
    header = (NORM_DIR / "attnResAggregateNormPlugin.h").read_text()
    source = (NORM_DIR / "attnResAggregateNormPlugin.cpp").read_text()
    kernel = (NORM_DIR / "attnResAggregateNormKernel.h").read_text()
    assert f'kAGGREGATE_NORM_NAME{{"{opset.AGGREGATE_NORM}"}}' in header
    assert f'kAGGREGATE_NORM_VERSION{{"{opset.PLUGIN_VERSION}"}}' in header
    for field in ("eps", "norm_eps", "has_aggregate"):
        assert f'{{"{field}"}}' in source
    assert "attnresAggregateNormLaunch(" in kernel
    assert '#include "common/attnresAggregateApi.h"' in kernel
    for name in ("README.md", "attnResAggregateNormKernel.cu"):
        assert (NORM_DIR / name).is_file()


def test_aggregate_norm_launcher_composes_the_aggregate_kernel() -> None:
    """The correctness path calls the verified aggregate launcher; its only kernel of its own is the RMSNorm."""
    cuda = (NORM_DIR / "attnResAggregateNormKernel.cu").read_text()
    assert "attnresAggregateLaunch(" in cuda
    kernels = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", cuda)
    assert kernels == ["rmsNormRowsKernel"]
    readme = (NORM_DIR / "README.md").read_text()
    assert "not yet verified" in readme
    assert "python -m attnres_export.plugins.selftest --op aggregate_norm" in readme
