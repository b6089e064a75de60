"""Exporting AttnRes models written elsewhere: a torch.export program (.pt2), an ONNX file, or (only when the
user trusts it) a pickled nn.Module. Each becomes an unfused ONNX graph whose aggregations are then fused by
pattern (attnres_export.graphs.fusion) and checked against the unfused graph on the same inputs.
"""


from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from attnres_export import __version__
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.options import ExportOptions, ExportResult, publish
from attnres_export.exporter.program_names import name_from_signature
from attnres_export.exporter.pt2_archive import unsafe_members
from attnres_export.exporter.to_onnx import quiet_torch_onnx_export
from attnres_export.graphs.fusion import FusionResult, random_feeds
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.graphs.onnx_utils import set_metadata
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.graphs.targets import convert
from attnres_export.parity.fusion_checks import fuse_with_shape_hint, refuse_crashing, whole_model_parity

PICKLE_RISK = (
    "holds a pickled Python object; unpickling runs arbitrary code from the file, so attnres does not do it "
    "unless you pass --trust-pickle (with --import MODULE for its classes and --example-shape for its inputs). "
    "Safer: save a torch.export program (torch.export.save -> .pt2), an ONNX file, or an attnres state_dict "
    "checkpoint (docs/models.md#checkpoint-format)"
)


@dataclass
class ForeignOptions:
    """What a foreign model needs besides ExportOptions."""

    example_shapes: dict[str, tuple[list[int], str | None]] = field(default_factory=dict)
    """NAME -> (shape, dtype) of example inputs, from ``--example-shape NAME:d0,d1[:DTYPE]`` (dtype None: not
    given; ``example_input_dtype`` picks it from the name)."""
    trust_pickle: bool = False
    strict: bool = False
    """Fail (and write nothing) when a site of any fusion pattern is left unfused."""
    imports: list[str] = field(default_factory=list)
    vocab: int | None = None
    """Integer inputs are drawn from [0, vocab); default: the size of the table they index (ONNX) or the module's
    first nn.Embedding (pickled modules), else 2."""


@dataclass
class ForeignExportResult(ExportResult):
    fusion: FusionResult | None = None


def export_source(source: ForeignSource, opts: ExportOptions, strict: bool = False,
                  status: Callable[[str], None] = lambda _: None) -> ForeignExportResult:
    """Fuse a foreign model's ONNX, convert it for the target, check it against its reference, write it."""
    original, feeds = source.onnx, source.feeds
    refuse_crashing(original, feeds, str(opts.source))
    status("finding and verifying aggregations")
    fusion = fuse_with_shape_hint(original, feeds, opts.seed)
    refuse_unfused(fusion, strict)
    model = fusion.model
    fused = sum(fusion.fused_by_op.values())
    set_metadata(model, EXPORT_KEY, json.dumps({"attnres_version": __version__, "dtype": opts.dtype,
                                                 "target": opts.target, "source": source.kind,
                                                 "source_file": opts.source.name, "fused": fused}))
    if opts.target != "tensorrt":
        model = convert(model, opts.target)
    report = None
    if opts.check:
        status(f"parity against {source.reference}")
        expected = source.run_reference(feeds) if source.run_reference else fusion.values
        report = whole_model_parity(model, feeds, expected, original, artifact=f"exported vs {source.reference}",
                                    dtype=opts.dtype)
    out, files = publish(model, opts.resolved_output(), report, status)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": opts.dtype, "fused_nodes": fused,
                             "onnx": str(out), "reference": source.reference, "fusion": fusion.to_dict()})
    return ForeignExportResult(out, files, fused, fused, report, fusion.fused_by_op,
                               onnxruntime_ops=OnnxRuntimeOps.of(model), fusion=fusion)


@dataclass
class ForeignSource:
    """A foreign model as ONNX, the feeds of its checks, and what it is checked against."""

    kind: str
    """``onnx``, ``program`` or ``module``."""
    onnx: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    reference: str
    """What the exported model is compared with: the PyTorch program or module, or (ONNX input) the input graph."""
    run_reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    """Outputs of the PyTorch reference on feeds, keyed by ONNX output name (None: the input graph is the reference,
    and the fusion's own run of it serves)."""


def refuse_unfused(fusion: FusionResult, strict: bool) -> None:
    """With ``--strict``, a site of any pattern left as standard ops is an error (nothing is written)."""
    left = fusion.unfused
    if strict and left:
        raise ExportError(f"--strict: {fusion.unfused_summary()} were not fused, or only in part (first: "
                          f"{left[0].site}: {left[0].reason}); drop --strict to write the model with them as "
                          "standard ops")


def load_foreign(kind: str, opts: ExportOptions, foreign: ForeignOptions) -> ForeignSource:
    path = opts.source
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    shapes = {name: dims for name, (dims, _) in foreign.example_shapes.items()}
    if kind == "onnx":
        model = load_onnx(path)
        return ForeignSource("onnx", model, random_feeds(model, opts.seed, shapes, foreign.vocab),
                             "the input ONNX graph")
    if kind == "program":
        program = load_program(path, foreign.trust_pickle)
        args, kwargs = program.example_inputs or ((), {})
        if opts.dtype != "float32":
            dynamic = [dict.fromkeys(range(t.dim()), torch.export.Dim.AUTO) for t in args] or None
            return module_source(program.module(), args, kwargs, dynamic, opts.opset, opts.dtype)
        model, feeds = _onnx_with_feeds(program, args, kwargs, None, opts.opset)
        if shapes or feeds is None:
            feeds = random_feeds(model, opts.seed, shapes, foreign.vocab)
        return ForeignSource("program", model, feeds, "the PyTorch program",
                             _torch_reference(program.module(), model, len(args), list(kwargs)))
    return _pickled_module_source(load_pickled_module(path, foreign), foreign, opts)


def module_source(module: nn.Module, args: tuple, kwargs: dict, dynamic: dict | None, opset: int,
                  dtype: str = "float32") -> ForeignSource:
    """A module in this process as a foreign source: exported to ONNX in ``dtype`` (a copy of the module and the
    floating example inputs cast to it), checked against the float32 module itself."""
    exported = module
    if dtype != "float32":
        exported = copy.deepcopy(module).to(torch_dtype(dtype))
        args = tuple(_cast(t, dtype) for t in args)
        kwargs = {name: _cast(t, dtype) for name, t in kwargs.items()}
    model, feeds = _onnx_with_feeds(exported, args, kwargs, dynamic, opset)
    if feeds is None:
        raise ExportError("the module needs example inputs to be exported and checked")
    return ForeignSource("module", model, feeds, "the PyTorch module",
                         _torch_reference(module, model, len(args), list(kwargs)))


def _cast(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    return tensor.to(torch_dtype(dtype)) if tensor.is_floating_point() else tensor


def _torch_reference(module: Callable, model: onnx.ModelProto, n_args: int,
                     kwarg_names: list[str]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Run ``module`` itself on ONNX-keyed feeds: the first ``n_args`` graph inputs are positional, the rest are
    the keyword arguments, in order; outputs are matched to the graph outputs in order."""
    inputs = _graph_inputs(model)
    outputs = [o.name for o in model.graph.output]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [_cast(torch.from_numpy(np.ascontiguousarray(feeds[name])), "float32") for name in inputs]
        with torch.inference_mode():
            result = module(*tensors[:n_args], **dict(zip(kwarg_names, tensors[n_args:], strict=True)))
        flat = _flatten(result)
        if len(flat) != len(outputs):
            raise ExportError(f"the PyTorch reference returns {len(flat)} tensors for {len(outputs)} ONNX outputs; "
                              "return the model's outputs as a tensor or a flat tuple")
        return {name: t.detach().float().numpy() for name, t in zip(outputs, flat, strict=True)}

    return run


def _flatten(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        result = list(result.values())
    return [t for item in result for t in _flatten(item)] if isinstance(result, list | tuple) else []


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def load_program(path: Path, trust_pickle: bool = False) -> torch.export.ExportedProgram:
    """``torch.export.load``, only after the archive was inspected: a member that would be unpickled (code runs)
    is refused unless ``trust_pickle``; one line when the file is not an ExportedProgram."""
    unsafe = unsafe_members(path)
    if unsafe and not trust_pickle:
        more = f" and {len(unsafe) - 1} more" if len(unsafe) > 1 else ""
        raise ExportError(f"{path}: {unsafe[0]}{more} would be unpickled by torch.export.load, which runs code from "
                          "the file; attnres does not do that unless you pass --trust-pickle (only for files you "
                          "trust). Re-save tensors as plain weights: torch.export.save of a program whose constants "
                          "are tensors")
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
    """Unpickle a whole nn.Module, only when the user said they trust the file. The current folder is importable
    while the ``--import`` modules load and the file is unpickled (a console script's ``sys.path`` lacks it, where
    ``python -m`` has it), so a class defined in a module beside the user is found."""
    if not foreign.trust_pickle:
        raise ExportError(f"{path}: {PICKLE_RISK}")
    with _current_folder_importable():
        for name in foreign.imports:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise ExportError(f"--import {name}: {exc} (looked in the current folder {Path.cwd()} and "
                                  "sys.path; run from the folder that holds the module, or add its folder to "
                                  "PYTHONPATH)") from exc
        try:
            module = torch.load(path, map_location="cpu", weights_only=False)
        except (AttributeError, ModuleNotFoundError) as exc:
            raise ExportError(f"{path}: cannot unpickle ({exc}); pass --import MODULE for the model's classes (looked "
                              f"up in the current folder {Path.cwd()} and sys.path)") from exc
    if not isinstance(module, nn.Module):
        raise ExportError(f"{path}: holds a {type(module).__name__}, not a torch.nn.Module")
    if not foreign.example_shapes:
        raise ExportError(f"{path}: a pickled module needs example inputs: --example-shape NAME:d0,d1[:DTYPE] "
                          "for each forward argument (e.g. input_ids:2,16:int64)")
    return module.eval().float()


@contextlib.contextmanager
def _current_folder_importable() -> Iterator[None]:
    folder = str(Path.cwd())
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


INDEX_NAME = re.compile(r"(^|_)(ids?|idx|index|indices|positions?|tokens?|mask)($|_)", re.IGNORECASE)
"""Input names that hold indices (token ids, positions) or an attention mask, which models take as int64."""


def example_input_dtype(name: str, dtype: str | None) -> str:
    """The dtype of an example input: the one given, else int64 for a name that reads as indices or a mask
    (``input_ids``, ``position_ids``, ``attention_mask``), else float32."""
    if dtype is not None:
        return dtype
    return "int64" if INDEX_NAME.search(name) else "float32"


def _vocab(module: nn.Module, foreign: ForeignOptions) -> int:
    if foreign.vocab is not None:
        return foreign.vocab
    embedding = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
    return embedding.num_embeddings if embedding is not None else 2


def _example_inputs(foreign: ForeignOptions, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = {}
    for name, (dims, given) in foreign.example_shapes.items():
        input_dtype = getattr(torch, example_input_dtype(name, given))
        if input_dtype.is_floating_point:
            inputs[name] = torch.randn(dims, generator=generator).to(input_dtype)
        elif input_dtype == torch.bool:
            inputs[name] = torch.rand(dims, generator=generator) < 0.5
        else:
            inputs[name] = torch.randint(0, vocab, dims, generator=generator, dtype=input_dtype)
    return inputs


def _pickled_module_source(module: nn.Module, foreign: ForeignOptions, opts: ExportOptions) -> ForeignSource:
    """The pickled module exported on its example inputs; when it fails on them and a dtype was picked from an
    input's name rather than given, the error says how to spell it."""
    kwargs = _example_inputs(foreign, _vocab(module, foreign), opts.seed)
    dynamic = {name: dict.fromkeys(range(t.dim()), torch.export.Dim.AUTO) for name, t in kwargs.items()}
    try:
        return module_source(module, (), kwargs, dynamic, opts.opset, opts.dtype)
    except ExportError as exc:
        picked = [f"{name}:{','.join(map(str, dims))}:{example_input_dtype(name, None)}"
                  for name, (dims, given) in foreign.example_shapes.items() if given is None]
        if not picked:
            raise
        raise ExportError(f"{exc} (the example inputs {', '.join(picked)} had no :DTYPE and were given the dtype "
                          "shown; if the module wants another, spell it, e.g. --example-shape input_ids:2,16:int64 "
                          "or x:2,16:float32)") from exc


def _onnx_with_feeds(model, args: tuple, kwargs: dict, dynamic: dict | None,
                     opset: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray] | None]:
    """torch.onnx.export (dynamo) of a module or program, its outputs and dynamic dims named from the program's
    signature (exporter/program_names.py), and the example inputs keyed by ONNX input name (None without example
    inputs)."""
    program = quiet_torch_onnx_export(model, args, kwargs=kwargs or None, dynamic_shapes=dynamic,
                                      opset_version=opset)
    if program.exported_program is not None:
        name_from_signature(program.model, program.exported_program)
    model_proto = program.model_proto
    tensors = [*args, *kwargs.values()]
    inputs = _graph_inputs(model_proto)
    if not tensors:
        return model_proto, None
    if len(inputs) != len(tensors):
        raise ExportError(f"the ONNX graph has {len(inputs)} inputs for {len(tensors)} example tensors")
    return model_proto, {name: t.numpy() for name, t in zip(inputs, tensors, strict=True)}
