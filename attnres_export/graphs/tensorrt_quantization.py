"""Which ``DequantizeLinear`` nodes TensorRT builds, by the rules of its Quantize/Dequantize layers
(docs/quantization.md#tensorrt): the scale is a scalar (per tensor), 1-D (per channel, on ``axis``) or of the
input's rank (blocked, **INT4 only**, weight-only); a zero point must be all zeros; the values are INT8, INT4 or
FP8 (FP4 takes a second DequantizeLinear for its FP8 block scales, NVFP4, which attnres does not write). Sources:
the TensorRT operator reference, Quantize and Dequantize layers (docs.nvidia.com/deeplearning/tensorrt/operators,
"block quantization (supported for DataType::kINT4 only)", "the zero_point must only contain zero-valued
coefficients"), and "Working with Quantized Types" (TensorRT 10.11 and 11.0: symmetric quantization; INT4
weight-only)."""

from __future__ import annotations

import onnx

INT4 = "int4"
BUILDS = frozenset({"int8", INT4, "float8e4m3fn"})


def dequantize_problem(values: str, input_rank: int, scale_rank: int, zero_points: bool) -> str | None:
    """Why TensorRT would not build a ``DequantizeLinear`` of ``values`` (ONNX type name, lower case) with a scale of
    ``scale_rank`` dims on an input of ``input_rank`` (and zero points when ``zero_points``); None when it builds."""
    if values not in BUILDS:
        return f"{values} values are not a TensorRT quantized type (int8, int4, float8e4m3fn)"
    if zero_points:
        return "zero points: TensorRT quantization is symmetric (asymmetric weights, e.g. GPTQ/AWQ, do not build)"
    if scale_rank > 1 and scale_rank == input_rank and values != INT4:
        return f"{values} values in blocks: TensorRT's blocked dequantization is INT4 only"
    if scale_rank > 1 and scale_rank != input_rank:
        return f"a {scale_rank}-D scale on a {input_rank}-D input is neither per-tensor, per-channel nor blocked"
    return None


def dequantize_problems(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(node name, problem)`` for every ``DequantizeLinear`` of ``model`` (its subgraphs too) on a weight (an
    initializer, or rows gathered from one) that TensorRT would not build."""
    initializers = {t.name: t for t in model.graph.initializer}
    gathered: dict[str, str] = {}
    problems: list[tuple[str, str]] = []

    def source(name: str) -> onnx.TensorProto | None:
        """The initializer ``name`` is, or gathers rows of (the chosen experts of a stacked weight)."""
        return initializers.get(gathered.get(name, name))

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    visit(sub)
            if node.op_type == "Gather" and node.input[0] in initializers:
                gathered[node.output[0]] = node.input[0]
            if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
                continue
            values, scale = source(node.input[0]), source(node.input[1])
            if values is None or scale is None:
                continue
            name = onnx.TensorProto.DataType.Name(values.data_type).lower()
            problem = dequantize_problem(name, len(values.dims), len(scale.dims),
                                         len(node.input) > 2 and bool(node.input[2]))
            if problem is not None:
                problems.append((node.name, problem))

    visit(model.graph)
    return problems
