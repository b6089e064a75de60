"""Graphs neither serving command takes: those of the ``onnxruntime`` target and an onnxruntime-genai folder's
``model.onnx`` (``attnres-export --target onnxruntime [--genai]``, docs/onnxruntime-target.md), whose attention is
ONNX Runtime's ``com.microsoft.GroupQueryAttention``.

That node is exact only under onnxruntime-genai's inputs: it reads each row's length (``seqlens_k =
sum(attention_mask) - 1``), not the mask, so a left-padded row or a mask with zeros inside attends to the wrong
keys without an error, and ONNX Runtime's CPU kernel refuses a batch of several rows with several new tokens and a
past ("batch_size must be 1 when sequence_length > 1 and past context is given", measured with ONNX Runtime 1.32),
which is what Triton's dynamic batcher makes of two such requests. The with-past export without ``--genai`` serves
the same model with standard attention (docs/serving.md#with-past-kv-cache-graphs).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from attnres_export.serve.dependencies import ServeError

LENGTH_ONLY_ATTENTION = {("com.microsoft", "GroupQueryAttention")}
"""(domain, op type) of nodes that read a row's length instead of its attention mask."""


def refuse_length_only_attention(model: onnx.ModelProto, artifact: Path) -> None:
    """One line when ``model`` holds a node of ``LENGTH_ONLY_ATTENTION`` (an onnxruntime-genai folder's graph)."""
    found = [n for n in model.graph.node if (n.domain, n.op_type) in LENGTH_ONLY_ATTENTION]
    if found:
        raise ServeError(
            f"{Path(artifact).name} has {len(found)} {found[0].domain}.{found[0].op_type} node(s) (the onnxruntime "
            "target's or an onnxruntime-genai folder's graph), which read each row's length, not its attention "
            "mask, and take one row per step with past and several tokens, so batched or padded requests would be "
            "wrong or fail; serve the with-past export of the portable target (attnres-export MODEL --with-past "
            "--target portable), and run this graph with attnres generate or onnxruntime-genai (docs/genai.md)")
