"""Every decoder family's plain and with-past exports build on the strict TensorRT fake: preflight passes, every
aggregation runs as our plugin, and the with-past engine has a profile for every cache input (grouped K/V, the
compressed latent and rope key of latent attention). Kimi Linear and Kimi K3 folders build in their ``portable``
form (KimiDeltaAttention has no plugin yet: a ``Loop``, docs/tensorrt.md#kimi-linear-and-kimi-k3) with a profile
for every KDA state and latent cache input; their ``tensorrt`` form is refused by the op's name."""

from __future__ import annotations

import pytest

from attnres_export.backends.tensorrt.builder import BuildOptions, PreflightFailed, build_engine
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models.decoder.example import FAMILY_EXTRAS, write_example_folder
from attnres_export.models.registry import architecture
from tests.models.kimi.k3_reference import with_float_experts


@pytest.fixture(scope="module")
def family_exports(tmp_path_factory) -> dict:
    """family -> (plain ONNX, with-past ONNX, with-past cache input names), exported once per module."""
    made = {}

    def export(family: str):
        if family not in made:
            folder = tmp_path_factory.mktemp(family)
            source, _, _ = write_example_folder(family, folder / "model", seed=2, attn_res_block_size=1)
            plain = export_checkpoint(ExportOptions(source, folder / "plain.onnx", batch=DimRange(1, 1, 2),
                                                    seq=DimRange(1, 4, 8), check=False))
            past = export_checkpoint(ExportOptions(source, folder / "past.onnx", with_past=True, check=False,
                                                   batch=DimRange(1, 1, 2), seq=DimRange(1, 1, 4),
                                                   past=DimRange(0, 4, 8)))
            made[family] = (plain, past)
        return made[family]

    return export


REPEATED_FAMILIES = ("qwen2", "qwen3")
"""Dense grouped-query families whose builds repeat llama's (the same plugin nodes and cache inputs): ``full``, out
of CI's ``-m "slow and not full"``. The builds themselves take well under a second; each family's two exports cost
the time."""


@pytest.mark.slow
@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.full if family in REPEATED_FAMILIES else ())
                                    for family in FAMILY_EXTRAS])
def test_plain_and_with_past_exports_build_with_every_aggregation_as_plugin(fake_trt, libraries, family_exports,
                                                                           tmp_path, family):
    plain, past = family_exports(family)
    for result, name in ((plain, "plain"), (past, "past")):
        manifest = build_engine(BuildOptions(result.path, tmp_path / f"{name}.engine", plugin=libraries.trt)).manifest
        assert len(manifest.plugin_nodes) == result.fused_nodes == 4
        assert manifest.inlined_nodes == [] and manifest.unknown_nodes == []
    profile = manifest.profiles[0]
    caches = [name for name in profile if name.startswith("past_key_values.")]
    assert caches and all(profile[name]["min"][0] == 1 and profile[name]["max"][0] == 2 for name in caches)
    assert all(profile[name]["min"][axis] == 0 and profile[name]["max"][axis] == 8
               for name, axis in ((n, _past_axis(n)) for n in caches))
    assert manifest.dims["past"] == [0, 4, 8] and manifest.dims["total"][2] <= 12


def _past_axis(name: str) -> int:
    """Where the past length sits: axis 2 of grouped K/V ``[batch, kv_heads, past, head_dim]``, axis 1 of the latent
    caches ``[batch, past, size]`` (docs/decode.md)."""
    return 2 if name.endswith((".key", ".value")) else 1


KIMI_FOLDERS = {"kimi_linear": 4, "kimi_k3": 5}
"""Layers of each Kimi folder kind: KDA and latent attention interleaved, the K3 one with a partial last block."""
KIMI_KINDS = [pytest.param("kimi_linear", marks=pytest.mark.full), "kimi_k3"]
"""``kimi_linear`` is ``full`` (its KDA and latent caches are the K3 folder's; its three exports cost the time)."""


@pytest.fixture(scope="module")
def kimi_exports(tmp_path_factory) -> dict:
    """folder kind -> (plain portable ONNX, with-past portable ONNX, with-past tensorrt-target ONNX)."""
    made = {}

    def export(kind: str):
        if kind not in made:
            folder = tmp_path_factory.mktemp(kind)
            source, _, _ = architecture("kimi-linear").write_example_folder(kind, folder / "model", 2, 2,
                                                                           KIMI_FOLDERS[kind])
            if kind == "kimi_k3":
                with_float_experts(source)  # MXFP4 experts are int8 blocks, which TensorRT does not build
            dims = {"batch": DimRange(1, 1, 2), "check": False}
            plain = export_checkpoint(ExportOptions(source, folder / "plain.onnx", target="portable",
                                                    seq=DimRange(1, 4, 8), **dims))
            past = {target: export_checkpoint(ExportOptions(source, folder / f"past-{target}.onnx", target=target,
                                                            with_past=True, seq=DimRange(1, 1, 4),
                                                            past=DimRange(0, 4, 8), **dims))
                    for target in ("portable", "tensorrt")}
            made[kind] = (plain, past["portable"], past["tensorrt"])
        return made[kind]

    return export


@pytest.mark.slow
@pytest.mark.parametrize("kind", KIMI_KINDS)
def test_kimi_plain_and_with_past_portable_exports_build_with_a_profile_for_every_state_input(
        fake_trt, libraries, kimi_exports, tmp_path, kind):
    plain, past, _ = kimi_exports(kind)
    for result, name in ((plain, "plain"), (past, "past")):
        built = build_engine(BuildOptions(result.path, tmp_path / f"{name}.engine", plugin=libraries.trt))
        assert not any(problem.fatal for problem in built.preflight.problems)
        manifest = built.manifest
        assert manifest.plugin_nodes == [] and manifest.unknown_nodes == []
    profile = manifest.profiles[0]
    states = [name for name in profile if name.startswith("past_key_values.")]
    kinds = {name.rsplit(".", 1)[1] for name in states}
    assert kinds == {"recurrent", "conv_q", "conv_k", "conv_v", "latent", "rope_key"}
    assert all(profile[name]["min"][0] == 1 and profile[name]["max"][0] == 2 for name in states)
    growing = [name for name in states if name.endswith((".latent", ".rope_key"))]
    assert all(profile[name]["min"][1] == 0 and profile[name]["max"][1] == 8 for name in growing)
    fixed = [name for name in states if name not in growing]
    assert all(profile[name]["min"][1:] == profile[name]["max"][1:] for name in fixed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KIMI_KINDS)
def test_kimi_tensorrt_target_build_is_refused_naming_kimi_delta_attention(fake_trt, libraries, kimi_exports,
                                                                          tmp_path, kind):
    _, _, past = kimi_exports(kind)
    with pytest.raises(PreflightFailed) as info:
        build_engine(BuildOptions(past.path, tmp_path / "past.engine", plugin=libraries.trt))
    messages = {problem.message for problem in info.value.result.problems}
    assert any(m.startswith("KimiDeltaAttention has no TensorRT plugin yet") for m in messages)
    assert all("\n" not in m for m in messages)
