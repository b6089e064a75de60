"""A KDA layer exports with dynamic batch and sequence to one ``KimiDeltaAttention`` node, and both the fused node
(through the ONNX Runtime reference op) and the portable decomposition compute on ONNX Runtime what transformers
computes: from the zero state and continuing from transformers' own cache, for a prefill and a single token."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn
from transformers import DynamicCache, KimiLinearConfig

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dims import DimRange
from attnres_export.exporter.to_onnx import export_module
from attnres_export.graphs.schemas import register_schemas
from attnres_export.graphs.targets import convert
from attnres_export.models.kimi import KdaState, KimiDeltaAttention
from tests.models.kimi.reference import CONFIG_JSON, hidden, our_layer, rel_l2, transformers_layer

STATE_NAMES = ("recurrent_state", "conv_state_q", "conv_state_k", "conv_state_v")
OUTPUT_NAMES = ["out", *(f"{name}_out" for name in STATE_NAMES)]


class FlatState(nn.Module):
    """The layer with its state as separate tensors: graph inputs and outputs."""

    def __init__(self, layer: KimiDeltaAttention) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, recurrent_state, conv_state_q, conv_state_k, conv_state_v):
        out, state = self.layer(hidden_states, KdaState(recurrent_state, conv_state_q, conv_state_k, conv_state_v))
        return out, *state


def export_layer(reference: nn.Module) -> dict[str, onnx.ModelProto]:
    """Our layer holding ``reference``'s weights, traced at batch 2 x 5 tokens with dynamic batch and sequence,
    in both targets (each passing onnx's full check)."""
    register_schemas()
    layer = our_layer(reference)
    state = layer.initial_state(2)
    example = {"hidden_states": hidden(2, 5, dtype=reference.q_proj.weight.dtype),
               **dict(zip(STATE_NAMES, state, strict=True))}
    sizes = DimRange(1, 4, 256)
    dynamic = {name: {0: ("batch", sizes)} for name in STATE_NAMES}
    dynamic["hidden_states"] = {0: ("batch", sizes), 1: ("seq", sizes)}
    model = ir.to_proto(export_module(FlatState(layer).eval(), example, dynamic, OUTPUT_NAMES, opset=18))
    targets = {target: convert(model, target) for target in ("tensorrt", "portable")}
    for converted in targets.values():
        onnx.checker.check_model(converted, full_check=True)
    return targets


@pytest.fixture(scope="module")
def exported() -> tuple[nn.Module, dict[str, onnx.ModelProto]]:
    reference = transformers_layer(seed=11)
    return reference, export_layer(reference)


def _transformers_state(cache: DynamicCache) -> dict[str, np.ndarray]:
    """Copies: transformers updates its cache in place."""
    layer = cache.layers[0]
    conv = layer.conv_states[0][..., 1:]  # transformers keeps conv_size inputs; the layer reads conv_size - 1
    q, k, v = conv.chunk(3, dim=1)
    return {"recurrent_state": layer.recurrent_states[0].clone().numpy(), "conv_state_q": q.clone().numpy(),
            "conv_state_k": k.clone().numpy(), "conv_state_v": v.clone().numpy()}


@pytest.mark.slow
def test_the_tensorrt_target_holds_one_fused_node_and_portable_none(exported) -> None:
    _, models = exported
    fused = [n for n in models["tensorrt"].graph.node if n.domain == "attnres"]
    assert [n.op_type for n in fused] == ["KimiDeltaAttention"]
    assert not [n for n in models["portable"].graph.node if n.domain == "attnres"]
    batch, seq = (models["tensorrt"].graph.input[0].type.tensor_type.shape.dim[i].dim_param for i in (0, 1))
    assert batch and seq and batch != seq


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tensorrt", "portable"])
@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (3, 7), (2, 70)])
def test_onnx_from_zero_state_matches_transformers(exported, target: str, batch: int, tokens: int) -> None:
    reference, models = exported
    x = hidden(batch, tokens, seed=tokens)
    zeros = our_layer(reference).initial_state(batch)
    cache = DynamicCache(config=KimiLinearConfig(**CONFIG_JSON))
    with torch.no_grad():
        want = reference(x, cache_params=cache)
    feeds = {"hidden_states": x.numpy(), **{n: t.numpy() for n, t in zip(STATE_NAMES, zeros, strict=True)}}
    with OnnxRuntimeRunner(models[target]) as runner:
        got = runner.infer(feeds)
    assert rel_l2(got["out"], want) < 1e-5
    for name, value in _transformers_state(cache).items():
        assert rel_l2(got[f"{name}_out"], value) < 1e-5, name


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tensorrt", "portable"])
@pytest.mark.parametrize("tokens", [1, 6])
def test_onnx_continuing_from_transformers_cache_matches_transformers(exported, target: str, tokens: int) -> None:
    """The single-token step (transformers' recurrent form) and a continued prefill (its chunked form from the
    cached state), with the state taken from transformers' cache."""
    reference, models = exported
    cache = DynamicCache(config=KimiLinearConfig(**CONFIG_JSON))
    more = hidden(2, tokens, seed=21)
    with torch.no_grad():
        reference(hidden(2, 9, seed=20), cache_params=cache)
        feeds = {"hidden_states": more.numpy(), **_transformers_state(cache)}
        want = reference(more, cache_params=cache)
    with OnnxRuntimeRunner(models[target]) as runner:
        got = runner.infer(feeds)
    assert rel_l2(got["out"], want) < 1e-5
    assert rel_l2(got["recurrent_state_out"], cache.layers[0].recurrent_states[0]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "bar"), [(torch.float16, 5e-3), (torch.bfloat16, 2e-2)], ids=str)
def test_half_precision_exports_match_transformers_in_the_same_dtype(dtype: torch.dtype, bar: float) -> None:
    """bfloat16 arrays travel as float32 (numpy has no bfloat16); the runner emulates bfloat16 storage."""
    reference = transformers_layer(seed=12, dtype=dtype)
    models = export_layer(reference)
    x = hidden(2, 9, seed=4, dtype=dtype)
    state = our_layer(reference).initial_state(2)
    with torch.no_grad():
        want = reference(x)
    feeds = {"hidden_states": x, **dict(zip(STATE_NAMES, state, strict=True))}
    feeds = {name: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for name, t in feeds.items()}
    for target, model in models.items():
        with OnnxRuntimeRunner(model) as runner:
            got = runner.infer(feeds)["out"]
        assert rel_l2(got.astype(np.float32), want.float()) < bar, target
