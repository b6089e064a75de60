"""Exporting AttnRes models written elsewhere: a torch.export program (.pt2), an ONNX file, or (only when the
user trusts it) a pickled nn.Module. Each becomes an unfused ONNX graph whose aggregations are then fused by
pattern (attnres_export.graphs.fusion) and checked against the unfused graph on the same inputs.
"""

from __future__ import annotations

import importlib
import json
import logging
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from attnres_export import __version__
from attnres_export.errors import ExportError
from attnres_export.exporter.export import ExportOptions, ExportResult, export_checkpoint, validate_options
from attnres_export.exporter.save import save_onnx_atomic
from attnres_export.exporter.to_onnx import quiet_torch_onnx_export
from attnres_export.graphs.fusion import FusionResult, random_feeds
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.graphs.onnx_utils import set_metadata
from attnres_export.graphs.targets import convert
from attnres_export.ops.opset import AGGREGATE
from attnres_export.parity.fusion_checks import fuse_and_check, whole_model_parity

PICKLE_RISK = (
    "holds a pickled Python object; unpickling runs arbitrary code from the file, so attnres does not do it "
    "unless you pass --trust-pickle (with --import MODULE for its classes and --example-shape for its inputs). "
    "Safer: save a torch.export program (torch.export.save -> .pt2), an ONNX file, or an attnres state_dict "
    "checkpoint (docs/models.md#checkpoint-format)"
)


@dataclass
class ForeignOptions:
    """What a foreign model needs besides ExportOptions."""

    example_shapes: dict[str, tuple[list[int], str]] = field(default_factory=dict)
    """NAME -> (shape, dtype) of example inputs, from ``--example-shape NAME:d0,d1[:DTYPE]``."""
    trust_pickle: bool = False
    imports: list[str] = field(default_factory=list)
    vocab: int | None = None
    """Integer inputs are drawn from [0, vocab); default: the size of the table they index (ONNX) or the module's
    first nn.Embedding (pickled modules), else 2."""


@dataclass
class ForeignExportResult(ExportResult):
    fusion: FusionResult | None = None


def model_kind(path: Path) -> str:
    """``onnx``, ``program`` (.pt2), ``pickle`` (a whole pickled object) or ``checkpoint`` (anything else).

    The peek is memory-mapped, so an ordinary checkpoint is not read twice."""
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix == ".pt2":
        return "program"
    if not path.is_file():
        return "checkpoint"
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        return "pickle" if "Unsupported global" in str(exc) else "checkpoint"
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError):
        return "checkpoint"
    return "checkpoint"


def export_any(opts: ExportOptions, foreign: ForeignOptions,
               status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export an attnres checkpoint as before, or a foreign model through pattern fusion."""
    kind = model_kind(opts.checkpoint)
    if kind == "checkpoint":
        return export_checkpoint(opts, status)
    validate_options(opts)
    if opts.dtype != "float32":
        raise ExportError("--dtype: foreign models (.onnx, .pt2, pickled modules) are exported as they are "
                          "(float32); convert the source model to change its precision")
    status(f"loading {opts.checkpoint}")
    original, feeds = _load(kind, opts, foreign)
    status("finding and verifying aggregations")
    fusion, report = fuse_and_check(original, feeds, seed=opts.seed, check=opts.check)
    model = fusion.model
    set_metadata(model, EXPORT_KEY, json.dumps({"attnres_version": __version__, "dtype": "float32",
                                                 "target": opts.target, "source": kind, "fused": fusion.fused}))
    if opts.target != "tensorrt":
        model = convert(model, opts.target)
        if opts.check:
            report = whole_model_parity(model, feeds, fusion.values, original)
    out = opts.resolved_output()
    status(f"checking and writing {out}")
    files = save_onnx_atomic(model, out)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": "float32", "fused_nodes": fusion.fused,
                             "onnx": str(out), "fusion": fusion.to_dict()})
    return ForeignExportResult(out, files, fusion.fused, fusion.fused, report,
                               {AGGREGATE: fusion.fused} if fusion.fused else {}, fusion=fusion)


def _load(kind: str, opts: ExportOptions, foreign: ForeignOptions) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    path = opts.checkpoint
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    shapes = {name: dims for name, (dims, _) in foreign.example_shapes.items()}
    if kind == "onnx":
        model = load_onnx(path)
        return model, random_feeds(model, opts.seed, shapes, foreign.vocab)
    if kind == "program":
        program = load_program(path)
        args, kwargs = program.example_inputs or ((), {})
        model, feeds = _onnx_with_feeds(program, args, kwargs, None, opts.opset)
        if shapes or feeds is None:
            feeds = random_feeds(model, opts.seed, shapes, foreign.vocab)
        return model, feeds
    module = load_pickled_module(path, foreign)
    kwargs = _example_inputs(foreign, _vocab(module, foreign), opts.seed)
    dynamic = {name: dict.fromkeys(range(t.dim()), torch.export.Dim.AUTO) for name, t in kwargs.items()}
    model, feeds = _onnx_with_feeds(module, (), kwargs, dynamic, opts.opset)
    return model, feeds


def load_program(path: Path) -> torch.export.ExportedProgram:
    """``torch.export.load``, with one line when the file is not an ExportedProgram."""
    quiet = logging.getLogger("torch.export")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ExportError(f"{path}: not a torch.export program ({type(exc).__name__}); write one with "
                          "torch.export.save(torch.export.export(model, args), 'model.pt2')") from exc
    finally:
        quiet.setLevel(level)
    if not isinstance(program, torch.export.ExportedProgram):
        raise ExportError(f"{path}: holds a {type(program).__name__}, not a torch.export ExportedProgram")
    return program


def load_pickled_module(path: Path, foreign: ForeignOptions) -> nn.Module:
    """Unpickle a whole nn.Module, only when the user said they trust the file."""
    if not foreign.trust_pickle:
        raise ExportError(f"{path}: {PICKLE_RISK}")
    for name in foreign.imports:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ExportError(f"--import {name}: {exc}") from exc
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError) as exc:
        raise ExportError(f"{path}: cannot unpickle ({exc}); pass --import MODULE for the model's classes") from exc
    if not isinstance(module, nn.Module):
        raise ExportError(f"{path}: holds a {type(module).__name__}, not a torch.nn.Module")
    if not foreign.example_shapes:
        raise ExportError(f"{path}: a pickled module needs example inputs: --example-shape NAME:d0,d1[:DTYPE] "
                          "for each forward argument (e.g. input_ids:2,16:int64)")
    return module.eval().float()


def _vocab(module: nn.Module, foreign: ForeignOptions) -> int:
    if foreign.vocab is not None:
        return foreign.vocab
    embedding = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
    return embedding.num_embeddings if embedding is not None else 2


def _example_inputs(foreign: ForeignOptions, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = {}
    for name, (dims, dtype) in foreign.example_shapes.items():
        torch_dtype = getattr(torch, dtype)
        if torch_dtype.is_floating_point:
            inputs[name] = torch.randn(dims, generator=generator).to(torch_dtype)
        elif torch_dtype == torch.bool:
            inputs[name] = torch.rand(dims, generator=generator) < 0.5
        else:
            inputs[name] = torch.randint(0, vocab, dims, generator=generator, dtype=torch_dtype)
    return inputs


def _onnx_with_feeds(model, args: tuple, kwargs: dict, dynamic: dict | None,
                     opset: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray] | None]:
    """torch.onnx.export (dynamo) of a module or program, and the example inputs keyed by ONNX input name
    (None without example inputs)."""
    program = quiet_torch_onnx_export(model, args, kwargs=kwargs or None, dynamic_shapes=dynamic,
                                      opset_version=opset)
    model_proto = program.model_proto
    tensors = [*args, *kwargs.values()]
    inputs = [i.name for i in model_proto.graph.input if i.name not in {t.name for t in model_proto.graph.initializer}]
    if not tensors:
        return model_proto, None
    if len(inputs) != len(tensors):
        raise ExportError(f"the ONNX graph has {len(inputs)} inputs for {len(tensors)} example tensors")
    return model_proto, {name: t.numpy() for name, t in zip(inputs, tensors, strict=True)}
