"""User-facing errors: each carries one line that names the problem and the fix."""

from __future__ import annotations


class AttnresError(Exception):
    """An error the CLI prints as one line (no traceback unless --debug) before exiting non-zero."""


class CheckpointError(AttnresError):
    """A checkpoint file that is not a valid attnres checkpoint."""


class PickledModelError(CheckpointError):
    """A ``.pt`` that holds pickled Python objects (a whole ``nn.Module``): only unpickling, which runs code from the
    file, reads it (``--trust-pickle``)."""


class ExportError(AttnresError):
    """A model or option the exporter cannot turn into ONNX."""


class GraphError(AttnresError):
    """An ONNX file that is not what the command needs."""


class ParityError(AttnresError):
    """A backend that could not be run for a parity check."""


class GenerationError(AttnresError):
    """Generation whose tokens would mean nothing: NaN or infinite logits, a graph of another model."""


class EngineError(AttnresError):
    """A TensorRT engine that cannot be built, loaded or run (missing TensorRT, plugin, profile)."""


class PluginBuildError(AttnresError):
    """A native build step failed (CMake, nvcc, missing headers)."""


class OpSetError(GraphError):
    """An attnres node that breaks the op-set contract (docs/op-set.md): missing inputs, bad attributes."""
