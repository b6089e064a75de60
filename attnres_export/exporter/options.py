"""What an export is asked for and what it returns, checked before any model is read.

The command line builds these options before it imports torch or onnx, so this module imports neither at the
top (docs/architecture.md: a mistake surfaces before heavy imports).
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from attnres_export.dims import DimRange
from attnres_export.dtypes import STORAGE_TYPES, Tolerance
from attnres_export.errors import ExportError, GraphError
from attnres_export.graphs.target_names import EXPORT_TARGETS

if TYPE_CHECKING:
    import onnx

    from attnres_export.exporter.quantized_graph import QuantizedWeights
    from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
    from attnres_export.parity.report import Report

QUANTIZE_BITS = {"int4": 4, "int8": 8}
QUANTIZE_BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Powers of two from 16 to 256: the block sizes ONNX Runtime's MatMulNBits takes."""
DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 24)


@dataclass
class ExportOptions:
    source: Path
    """The model file or folder to export: an attnres checkpoint, a .pt2 program, an ONNX file or a pickled module."""
    output: Path | None = None
    target: str = "tensorrt"
    dtype: str = "float32"
    opset: int = DEFAULT_OPSET
    batch: DimRange = field(default_factory=lambda: DimRange(1, 1, 8))
    seq: DimRange | None = None
    check: bool = True
    seed: int = 0
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    with_past: bool = False
    """Export the KV-cache graph (docs/decode.md): past_key_values in, presents out."""
    past: DimRange | None = None
    fuse_norm: bool = False
    """Export each aggregation and the RMSNorm after it as one AttnResAggregateNorm node."""
    trace_whole: bool = False
    """Trace the whole model, even when its family has an export plan (docs/exporter-notes.md#assembled-export)."""
    trace_cache: bool = True
    """Read and store an assembled export's trace in the trace cache (``exporter/trace_cache.py``;
    ``$ATTNRES_TRACE_CACHE`` chooses the folder, ``off`` disables it; docs/exporter-notes.md#the-trace-cache)."""
    quantize: str | None = None
    """``int4`` or ``int8``: quantize the float matmul weights on export, round to nearest per block
    (docs/quantization.md#quantizing-on-export-rtn)."""
    quantize_block_size: int = 32
    quantize_embeddings: bool = False
    """With ``quantize``: the embedding table and the output head too."""
    matmul_nbits: bool = False
    """Write a quantized matrix read by one ``MatMul`` as ``com.microsoft.MatMulNBits`` (``--genai`` folders, whose
    ONNX Runtime session attnres cannot configure; docs/quantization.md#onnxruntime-genai-folders)."""
    int8_activations: bool = False
    """Write each ``MatMulNBits`` with ``accuracy_level`` 4: ONNX Runtime quantizes its activations to int8 per block
    at run time (onnxruntime-genai's CPU default; docs/quantization.md#int8-activations)."""

    @property
    def quantize_bits(self) -> int | None:
        return None if self.quantize is None else QUANTIZE_BITS[self.quantize]

    @property
    def rtn_block_size(self) -> int | None:
        """The block ``--quantize`` quantizes by; None (one scale per row) for int8 to the ``tensorrt`` target, whose
        int8 dequantization takes no blocks."""
        return None if self.quantize == "int8" and self.target == "tensorrt" else self.quantize_block_size

    def resolved_output(self) -> Path:
        if self.output is not None:
            return self.output
        suffix = ("" if self.dtype == "float32" else f".{self.dtype}") + (".with-past" if self.with_past else "")
        stem = self.source.name if self.source.is_dir() else self.source.stem
        return self.source.with_name(f"{stem}{suffix}.{self.target}.onnx")


@dataclass
class ExportResult:
    path: Path
    files: list[Path]
    fused_nodes: int
    expected_aggregations: int
    report: Report | None
    fused_by_type: dict[str, int] = field(default_factory=dict)
    quantized: QuantizedWeights | None = None
    """The weights kept quantized in the graph (``exporter.quantized_graph``)."""
    onnxruntime_ops: OnnxRuntimeOps | None = None
    """What the ``onnxruntime`` target wrote as ONNX Runtime fused ops, and kept (``graphs.onnxruntime_ops``)."""


def validate_options(opts: ExportOptions) -> None:
    """The options of a Python caller, checked as the command line checks its own (the same tables)."""
    if opts.target not in EXPORT_TARGETS:
        raise ExportError(f"--target {opts.target!r}: choose one of {', '.join(EXPORT_TARGETS)} (ort-trt: "
                          "`attnres convert`)")
    if opts.dtype not in STORAGE_TYPES:
        raise ExportError(f"--dtype {opts.dtype!r}: choose one of {', '.join(STORAGE_TYPES)}")
    if opts.opset not in SUPPORTED_OPSETS:
        raise ExportError(
            f"--opset {opts.opset}: supported are {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}"
        )
    if opts.quantize is not None and opts.quantize not in QUANTIZE_BITS:
        raise ExportError(f"--quantize {opts.quantize!r}: choose one of {', '.join(QUANTIZE_BITS)}")
    if opts.quantize_block_size not in QUANTIZE_BLOCK_SIZES:
        raise ExportError(f"--quantize-block-size {opts.quantize_block_size}: choose one of "
                          f"{', '.join(map(str, QUANTIZE_BLOCK_SIZES))} (the block sizes MatMulNBits takes)")
    if opts.quantize is None and (opts.quantize_embeddings or opts.quantize_block_size != 32):
        raise ExportError("--quantize-block-size and --quantize-embeddings need --quantize int4|int8")
    if opts.int8_activations and opts.target != "onnxruntime":
        raise ExportError(f"--int8-activations: the {opts.target} target writes no MatMulNBits to set it on (ONNX "
                          "Runtime chooses the activations of a DequantizeLinear + MatMul by its session option "
                          "session.qdq_matmulnbits_accuracy_level); use --target onnxruntime or --genai")
    if opts.int8_activations and opts.dtype != "float32":
        raise ExportError(f"--int8-activations: --dtype {opts.dtype}: ONNX Runtime's CPU MatMulNBits quantizes float32 "
                          "activations to int8; export --dtype float32")


def refuse_default_output_of_another_source(opts: ExportOptions) -> None:
    """Two model files can share a default output (``mine.onnx`` and ``mine.pt2`` both give
    ``mine.tensorrt.onnx``): without ``-o``, an existing default output that records another source file is
    refused rather than replaced."""
    if opts.output is not None:
        return
    out = opts.resolved_output()
    if not out.is_file():
        return
    import onnx
    from google.protobuf.message import DecodeError

    from attnres_export.graphs.metadata import export_info

    try:
        recorded = export_info(onnx.load(str(out), load_external_data=False)).get("source_file")
    except (DecodeError, OSError, ValueError, GraphError):
        return  # a file that is not a readable export says nothing about its source
    if recorded is not None and recorded != opts.source.name:
        raise ExportError(f"{out} exists and was exported from {recorded}, not {opts.source.name} (both default to "
                          f"this output); pass -o to choose where to write (-o {out} replaces it)")


def failed_path(out: Path) -> Path:
    """Where a model that missed its parity bar is kept: ``OUT.failed.onnx`` beside ``OUT``."""
    return out.with_name(f"{out.stem}.failed{out.suffix or '.onnx'}")


def onnx_files(option: str, out: Path) -> dict[str, Path]:
    """An ONNX output and the data file written beside it when the model is over protobuf's 2 GB limit."""
    return {option: out, f"{option}'s data file": out.with_name(out.name + ".data")}


def export_outputs(out: Path) -> dict[str, Path]:
    """Every file an export (or ``attnres fuse``) to ``out`` may write, for ``atomic.check_outputs``: the model, or
    its failed copy when the check fails, each with its data file."""
    return {**onnx_files("-o", out), **onnx_files("the failed copy of -o", failed_path(out))}


def publish(model: onnx.ModelProto, out: Path, report: Report | None,
            status: Callable[[str], None]) -> tuple[Path, list[Path]]:
    """Write ``model`` to ``out`` when its check passed (or did not run), else to ``OUT.failed.onnx``: a model
    that failed its check never replaces a good file (docs/security.md)."""
    from attnres_export.graphs.save import save_onnx_atomic

    target = out if report is None or report.ok else failed_path(out)
    status(f"checking and writing {target}")
    return target, save_onnx_atomic(model, target)
