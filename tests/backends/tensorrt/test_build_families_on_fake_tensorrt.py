"""Every decoder family's plain and with-past exports build on the strict TensorRT fake: preflight passes, every
aggregation runs as our plugin, and the with-past engine has a profile for every cache input (grouped K/V, the
compressed latent and rope key of latent attention)."""

from __future__ import annotations

import pytest

from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models.decoder.example import FAMILY_EXTRAS, write_example_folder
from tests.conftest import slow_after


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


@pytest.mark.parametrize("family", slow_after(list(FAMILY_EXTRAS)))
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
