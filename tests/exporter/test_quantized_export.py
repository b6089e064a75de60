"""Quantized Hugging Face folders export with their weights kept quantized, and the graph computes the published
quantized model.

Each format's folder is a tiny float body (``folders.BODIES``: group 32 divides every linear input width) compressed
as its writers compress it (``tests/models/quantized/folders.py``). The export runs ``attnres-export`` with its own
parity check (against float64 PyTorch on the dequantized weights); the written graph is then read back: every
quantized weight is an INT4/INT8/FLOAT8E4M3FN initializer read by a ``DequantizeLinear`` (through the ``Gather`` of
the chosen experts for stacked experts), no float initializer holds one, and ONNX Runtime's logits equal
transformers' own model loaded from an independent dequantization of the stored parts (compressed-tensors'
``decompress``; NumPy unpacking for FP8 blocks, GPTQ and AWQ). Refusals are one line at the command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

from attnres_export.cli import export_app
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.models.decoder.hf_bodies import relative_l2
from tests.models.quantized import folders

pytest.importorskip("compressed_tensors")

QUANTIZED_TYPES = {onnx.TensorProto.INT4, onnx.TensorProto.INT8, onnx.TensorProto.FLOAT8E4M3FN}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
RANGES = ("--batch", "1:1:2", "--seq", "1:8:16")
"""Small dynamic ranges: the check runs at the optimal sequence and at the largest batch, one token each."""


@dataclass(frozen=True)
class Format:
    make: Callable[[Path], Path]
    name: str
    """The format the export's summary line names (``QuantizedTensor.format``)."""
    values: frozenset[int]
    """The ONNX types its values may take: 4-bit weights become INT8 where a ``Gather`` of experts reads them."""
    block: int | None = folders.GROUP
    """Input columns per scale; None: one scale per output channel (a block of the whole input width)."""


FORMATS = {
    "int4-sym": Format(lambda p: folders.quantize_folder(p, "pack-quantized", folders.int_args(4, 32, True)),
                       "int4-pack-quantized", frozenset({onnx.TensorProto.INT4, onnx.TensorProto.INT8})),
    "int4-asym": Format(lambda p: folders.quantize_folder(p, "pack-quantized", folders.int_args(4, 32, False)),
                        "int4-pack-quantized", frozenset({onnx.TensorProto.INT4, onnx.TensorProto.INT8})),
    "int8-channel": Format(lambda p: folders.quantize_folder(p, "pack-quantized", folders.channel_args(8)),
                           "int8-pack-quantized", frozenset({onnx.TensorProto.INT8}), None),
    "fp8-channel": Format(lambda p: folders.quantize_folder(p, "float-quantized", folders.channel_args(8, "float")),
                          "float-quantized", frozenset({onnx.TensorProto.FLOAT8E4M3FN}), None),
    "fp8-block": Format(folders.fp8_block_folder, "fp8-block", frozenset({onnx.TensorProto.FLOAT8E4M3FN})),
    "gptq": Format(folders.gptq_folder, "gptq-int4", frozenset({onnx.TensorProto.INT4, onnx.TensorProto.INT8})),
    "awq": Format(folders.awq_folder, "awq-int4", frozenset({onnx.TensorProto.INT4, onnx.TensorProto.INT8})),
    # MXFP4 is written as its exact int8 form (2 x E2M1 in -12..12, docs/quantization.md#mxfp4--int8-is-exact)
    "mxfp4": Format(lambda p: folders.quantize_folder(p, "mxfp4-pack-quantized", folders.mxfp4_args()),
                    "mxfp4-pack-quantized", frozenset({onnx.TensorProto.INT8})),
}

FAST = [("int4-asym", "qwen3_moe")]
"""The default tier: experts gathered before their DequantizeLinear, INT4 with zero points (dense INT4 is
tests/exporter/test_quantize_on_export.py's, MXFP4 the K3 example's in tests/models/kimi); the rest runs in the
slow tier, on two workers."""
SLOW = [("int4-sym", "llama"), ("mxfp4", "deepseek_v3"), ("int8-channel", "qwen3"), ("fp8-channel", "llama"),
        ("fp8-block", "qwen3"), ("gptq", "llama"), ("awq", "qwen3")]
EXPERTS = {"qwen3_moe", "deepseek_v3"}
FLOAT32 = [pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in FAST] + \
          [pytest.param(*case, id=f"{case[0]}-{case[1]}", marks=pytest.mark.slow) for case in SLOW]


@dataclass
class Export:
    folder: Path
    onnx: Path
    exit_code: int
    output: str
    report: dict | None


class Exports:
    """Folders and exports made once per module (the checks of one export share it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[tuple, object] = {}

    def float_folder(self, family: str) -> Path:
        key = ("float", family)
        if key not in self.made:
            self.made[key] = folders.float_folder(family, self.root / f"{family}-float")
        return self.made[key]

    def folder(self, fmt: str, family: str) -> Path:
        key = ("folder", fmt, family)
        if key not in self.made:
            self.made[key] = FORMATS[fmt].make(folders.copy_folder(self.float_folder(family),
                                                                   self.root / f"{family}-{fmt}"))
        return self.made[key]

    def export(self, folder: Path, dtype: str = "float32", *extra: str) -> Export:
        key = ("export", folder, dtype, extra)
        if key not in self.made:
            name = f"{folder.name}-{dtype}{''.join(extra).replace('-', '_')}"
            out, report = self.root / f"{name}.onnx", self.root / f"{name}.json"
            result = invoke(folder, "--target", "portable", "-o", out, "--dtype", dtype, "--report", report,
                            *RANGES, *extra, application=export_app)
            self.made[key] = Export(folder, out, result.exit_code, result.output,
                                    json.loads(report.read_text()) if report.is_file() else None)
        return self.made[key]

    def quantized(self, fmt: str, family: str, dtype: str = "float32", *extra: str) -> Export:
        return self.export(self.folder(fmt, family), dtype, *extra)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Exports:
    return Exports(tmp_path_factory.mktemp("quantized-export"))


def assert_exported_and_checked(export: Export, fmt: str, dtype: str) -> None:
    assert export.exit_code == 0, export.output
    assert "Traceback" not in export.output
    assert export.report is not None and export.report["ok"] and export.report["dtype"] == dtype
    assert export.report["checks"] and all(check["ok"] for check in export.report["checks"])
    assert all(check["backend"].startswith("onnxruntime") for check in export.report["checks"])
    summary = [line for line in export.output.splitlines() if line.startswith("kept ")]
    assert len(summary) == 1 and f" {FORMATS[fmt].name})" in summary[0], export.output


# --- 1. every format exports with its parity check ---------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "family"), FLOAT32)
def test_quantized_folder_exports_and_passes_its_own_parity_check(exports, fmt, family):
    assert_exported_and_checked(exports.quantized(fmt, family), fmt, "float32")


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "family", "dtype"), [("int4-sym", "llama", "float16"),
                                                      ("mxfp4", "qwen3", "bfloat16")])
def test_quantized_folder_exports_in_half_types_and_passes_its_parity_check(exports, fmt, family, dtype):
    export = exports.quantized(fmt, family, dtype)
    assert_exported_and_checked(export, fmt, dtype)
    assert_kept_quantized(export, fmt, experts=False)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "family"), [("mxfp4", "deepseek_v3")])
def test_quantized_experts_export_with_past_and_pass_the_parity_check(exports, fmt, family):
    export = exports.quantized(fmt, family, "float32", "--with-past")
    assert_exported_and_checked(export, fmt, "float32")
    assert_kept_quantized(export, fmt, experts=True)


# --- 2. the written graph keeps them quantized --------------------------------------------------------------------


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph (the ``If`` branches of the expert loops)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attribute.g)
            for sub in attribute.graphs:
                yield from graphs(sub)


def assert_kept_quantized(export: Export, fmt: str, experts: bool) -> None:
    """Every quantized weight of the folder is in the graph once, as integer / FP8 values a ``DequantizeLinear``
    reads by blocks of the format's input columns (directly, or, with ``experts``, through the ``Gather`` of the
    chosen experts); no float initializer has a quantized weight's shape (or its transpose)."""
    model = onnx.load(str(export.onnx))
    assert not model.functions
    all_graphs = list(graphs(model.graph))
    initializers = {t.name: t for g in all_graphs for t in g.initializer}
    producers = {out: node for g in all_graphs for node in g.node for out in node.output}
    dequantize = [node for g in all_graphs for node in g.node if node.op_type == "DequantizeLinear"]
    assert dequantize

    values, gathered = set(), 0
    for node in dequantize:
        source = node.input[0]
        attributes = {a.name: a.i for a in node.attribute}
        if source in initializers:
            width = initializers[source].dims[attributes.get("axis", 1)]
            assert attributes["block_size"] == (FORMATS[fmt].block or width), node
        else:  # the experts' blocks are gathered before they are dequantized
            gather = producers[source]
            assert gather.op_type == "Gather", gather
            source, gathered = gather.input[0], gathered + 1
            assert attributes["block_size"] == FORMATS[fmt].block, node
        values.add(source)
        assert initializers[source].data_type in FORMATS[fmt].values, (node.name, initializers[source].data_type)
        for scale_or_zero in node.input[1:]:
            name = scale_or_zero if scale_or_zero in initializers else producers[scale_or_zero].input[0]
            assert name in initializers, (node.name, scale_or_zero)
    assert bool(gathered) == experts

    shapes = folders.quantized_weight_shapes(export.folder)
    assert sum(int(np.prod(initializers[name].dims)) for name in values) == sum(
        int(np.prod(shape)) for shape in shapes.values())
    assert not [name for name, t in initializers.items() if t.data_type in QUANTIZED_TYPES and "values" in name
                and name not in values]
    forbidden = {s for shape in shapes.values() for s in (shape, shape[::-1])}
    leaked = [(t.name, list(t.dims)) for t in initializers.values()
              if t.data_type in FLOAT_TYPES and len(t.dims) >= 2 and tuple(t.dims[-2:]) in forbidden]
    assert not leaked


@pytest.mark.parametrize(("fmt", "family"), FLOAT32)
def test_every_quantized_weight_stays_quantized_in_the_graph(exports, fmt, family):
    export = exports.quantized(fmt, family)
    assert export.exit_code == 0, export.output
    assert_kept_quantized(export, fmt, experts=family in EXPERTS)


@pytest.mark.slow
def test_int4_export_is_smaller_than_the_float_folders_export(exports):
    """The same llama folder before quantizing exports its weights as float initializers, which the check of
    ``assert_kept_quantized`` finds; the int4 file is under 0.6x its size."""
    quantized = exports.quantized("int4-sym", "llama")
    assert quantized.exit_code == 0, quantized.output
    plain = exports.float_folder("llama")
    out = exports.root / "llama-float.onnx"
    result = invoke(plain, "--target", "portable", "-o", out, "--no-check", *RANGES, application=export_app)
    assert result.exit_code == 0, result.output
    graphs_read = [onnx.load(str(path), load_external_data=False) for path in (quantized.onnx, out)]
    assert not [t.name for m in graphs_read for t in m.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]  # each file is the whole model
    assert quantized.onnx.stat().st_size < 0.6 * out.stat().st_size
    shapes = folders.quantized_weight_shapes(exports.folder("int4-sym", "llama"))
    forbidden = {s for shape in shapes.values() for s in (shape, shape[::-1])}
    floats = [t for t in graphs_read[1].graph.initializer if tuple(t.dims[-2:]) in forbidden]
    assert len(floats) == len(shapes)


# --- 3. the numbers are the published quantized model's ----------------------------------------------------------


def onnx_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # float32 activations in the MatMulNBits ONNX Runtime fuses from DequantizeLinear + MatMul (its default, 4,
    # quantizes the activations to int8)
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids})[0]


@torch.inference_mode()
def transformers_logits(folder: Path, ids: np.ndarray) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    # eager experts: transformers' grouped-mm experts take no float64
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", experts_implementation="eager")
    model = model.eval().double()
    return model(torch.from_numpy(ids)).logits


@pytest.mark.parametrize(("fmt", "family"), [("int4-asym", "qwen3_moe"),
                                             *[pytest.param(*case, marks=pytest.mark.slow) for case in SLOW]])
def test_onnx_logits_equal_transformers_on_independently_dequantized_weights(exports, fmt, family):
    export = exports.quantized(fmt, family)
    assert export.exit_code == 0, export.output
    reference = folders.dequantized_folder(export.folder, exports.root / f"{export.folder.name}-dequantized")
    ids = np.random.default_rng(7).integers(0, 61, (2, 9), dtype=np.int64)
    ours = torch.from_numpy(onnx_logits(export.onnx, ids))
    assert ours.dtype == torch.float32
    assert relative_l2(ours, transformers_logits(reference, ids)) < 1e-5
    # the reference is the quantized model, not the float one it was made from
    assert relative_l2(ours, transformers_logits(exports.float_folder(family), ids)) > 1e-3


# --- 4. refusals: one line, exit 1, no traceback, nothing written -------------------------------------------------


def refused(folder: Path, tmp_path: Path, pattern: str) -> str:
    out = tmp_path / "refused.onnx"
    result = invoke(folder, "--target", "portable", "-o", out, *RANGES, application=export_app)
    assert_one_line_error(result, pattern)
    assert not out.exists()
    return result.output


@pytest.mark.slow
def test_gptq_act_order_is_refused_as_not_kept_quantized(exports, tmp_path):
    folder = folders.gptq_folder(folders.copy_folder(exports.float_folder("llama"), tmp_path / "act-order"),
                                 act_order=True)
    g_idx = load_file(str(folder / "model.safetensors"))["model.layers.0.self_attn.q_proj.g_idx"].long()
    assert not torch.equal(g_idx, torch.arange(64) // 32)
    assert "cannot be kept quantized" in refused(folder, tmp_path, "act-order")


def test_mxfp4_nan_scale_byte_is_refused_naming_the_e8m0_nan(exports, tmp_path):
    folder = folders.copy_folder(exports.folder("mxfp4", "deepseek_v3"), tmp_path / "nan")
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.layers.1.self_attn.o_proj.weight_scale"][3, 0] = 0xFF
    save_file(tensors, str(weights), metadata={"format": "pt"})
    output = refused(folder, tmp_path, "E8M0 NaN byte 0xFF")
    assert "model.layers.1.self_attn.o_proj" in output


def test_activation_quantization_is_refused_as_w8a8_not_emulated(exports, tmp_path):
    folder = folders.copy_folder(exports.folder("int4-sym", "llama"), tmp_path / "w8a8")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}
    (folder / "config.json").write_text(json.dumps(config))
    assert "not emulated" in refused(folder, tmp_path, "W8A8")
