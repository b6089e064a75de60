"""The kernels under issue 35's last goals, one thread, measured alone: how fast ONNX Runtime's CPU kernels run the
two computations that decide a prefill and an expert body's decode, against what transformers' eager model runs.

- **Matrix products** (a dense prefill is about 90% of them: docs/benchmarks.md): ONNX Runtime's ``MatMul`` (MLAS)
  against ``torch.nn.functional.linear``, which transformers' ``nn.Linear`` calls, at the prefill shapes of
  ``benchmarks/family_decode.py``'s folders (hidden 512, feed-forward 1408, vocabulary 8192; 128 and 1024 rows).
  Their ratio bounds a prefill's: both sides do the same multiply-adds but for the head over every position.
- **Routed experts** of a decode step: ONNX Runtime's ``MoE`` node as the ``onnxruntime`` target writes it
  (interleaved SwiGLU, normalized top-k) against transformers' own experts module (that of a one-layer
  ``Qwen3MoeForCausalLM``, in the experts implementation the model picks by default) on the same routing, and
  against a plain read of the chosen experts' weight bytes (numpy ``sum``: what streaming them from memory costs,
  with no arithmetic). Every call gets a new random routing and follows a 64 MiB read that pushes the weights out
  of the caches, as a decode step finds them. GB/s are the chosen experts' weight bytes over the call's time.
  Shapes: the Qwen3-MoE folder of ``family_decode.py`` (16 experts of width 256, hidden 512, top-2) and the 0.47B
  K3-architecture folder of ``kimi_decode.py`` (64 of 256, hidden 1024, top-8).

Every call of every kind runs in turn on the same input before the next call (interleaved), figures are medians.
Run from the repository root:
    python benchmarks/kernel_floors.py [--calls 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from functools import partial

import numpy as np
import onnxruntime
import torch
import transformers
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

GEMMS = (("attention projection", 512, 512), ("feed-forward", 512, 1408), ("head", 512, 8192))
"""(name, in, out) of the family folders' matrix products."""
EXPERT_SHAPES = (("Qwen3-MoE folder", 16, 512, 256, 2), ("K3-architecture folder", 64, 1024, 256, 8))
"""(name, experts, hidden, width, top-k)."""
FLUSH_BYTES = 64 << 20


def load_average() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def session(graph, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)])
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def gemm_rows(args, rng: np.random.Generator) -> list[tuple]:
    rows = []
    for name, k, n in GEMMS:
        weight = rng.standard_normal((k, n), dtype=np.float32)
        graph = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                              [numpy_helper.from_array(weight, "w")])
        ort = session(graph, args.threads)
        linear = torch.from_numpy(np.ascontiguousarray(weight.T))
        for m in (128, 1024):
            x = rng.standard_normal((m, k), dtype=np.float32)
            xt = torch.from_numpy(x)
            kinds = {"onnxruntime": partial(ort.run, None, {"x": x}),
                     "torch": partial(torch.nn.functional.linear, xt, linear)}
            times = {kind: [] for kind in kinds}
            for call in range(args.calls + 2):
                for kind, run in kinds.items():
                    spent = timed(run)
                    if call >= 2:
                        times[kind].append(spent)
            median = {kind: statistics.median(t) for kind, t in times.items()}
            flops = 2 * m * k * n
            rows.append((f"{name} {k}x{n}", m, flops / median["onnxruntime"] / 1e9, flops / median["torch"] / 1e9,
                         median["torch"] / median["onnxruntime"]))
    return rows


def transformers_experts(experts: int, hidden: int, width: int, top_k: int, gate_up: np.ndarray,
                         down: np.ndarray) -> torch.nn.Module:
    """The experts module of a one-layer ``Qwen3MoeForCausalLM``: built by the model, it runs the experts
    implementation the model picks by default, as the transformers runner of ``family_decode.py`` does."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(hidden_size=hidden, intermediate_size=width, moe_intermediate_size=width,
                            num_experts=experts, num_experts_per_tok=top_k, num_hidden_layers=1,
                            num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, vocab_size=16)
    model = Qwen3MoeForCausalLM(config).eval()
    module = model.model.layers[0].mlp.experts
    with torch.no_grad():
        module.gate_up_proj.copy_(torch.from_numpy(gate_up))
        module.down_proj.copy_(torch.from_numpy(down))
    return module


def moe_session(experts: int, hidden: int, width: int, top_k: int, gate_up: np.ndarray, down: np.ndarray,
                threads: int) -> onnxruntime.InferenceSession:
    """The ``MoE`` node of graphs/onnxruntime_ops/experts.py: gate and up rows interleaved."""
    interleaved = np.ascontiguousarray(np.stack([gate_up[:, :width], gate_up[:, width:]], axis=2)
                                       .reshape(gate_up.shape))
    node = oh.make_node("MoE", ["x", "probs", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=top_k,
                        activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
                        normalize_routing_weights=1, use_sparse_mixer=0)
    graph = oh.make_graph([node], "moe",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", hidden]),
                           oh.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", experts])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["n", hidden])],
                          [numpy_helper.from_array(interleaved, "fc1"), numpy_helper.from_array(down, "fc2")])
    return session(graph, threads)


def read(gate_up: np.ndarray, down: np.ndarray, hit: np.ndarray) -> list:
    """Every byte of the ``hit`` experts' weights, read once."""
    return [gate_up[e].sum() + down[e].sum() for e in hit]


def agree(ort: np.ndarray, hf: torch.Tensor, name: str) -> None:
    """The two compute the same routed sum (or the timings compare different work)."""
    expected = hf.detach().numpy()
    error = np.linalg.norm(ort - expected) / np.linalg.norm(expected)
    if error > 1e-5:
        raise SystemExit(f"{name}: ONNX Runtime's MoE and transformers' experts differ (relative L2 {error:.1e})")


def expert_rows(args, rng: np.random.Generator) -> list[tuple]:
    flush = np.ones(FLUSH_BYTES // 4, np.float32)
    rows = []
    for name, experts, hidden, width, top_k in EXPERT_SHAPES:
        gate_up = rng.standard_normal((experts, 2 * width, hidden), dtype=np.float32) * 0.02
        down = rng.standard_normal((experts, hidden, width), dtype=np.float32) * 0.02
        ort = moe_session(experts, hidden, width, top_k, gate_up, down, args.threads)
        hf = transformers_experts(experts, hidden, width, top_k, gate_up, down)
        per_expert = (gate_up[0].nbytes + down[0].nbytes)
        for tokens in (1, 8):
            times = {"onnxruntime MoE": [], "transformers": [], "read": []}
            read_bytes = []
            for call in range(args.calls + 2):
                x = rng.standard_normal((tokens, hidden), dtype=np.float32)
                logits = rng.standard_normal((tokens, experts), dtype=np.float32)
                chosen = np.argsort(-logits, axis=1)[:, :top_k]
                weights = np.take_along_axis(np.exp(logits), chosen, axis=1)
                weights /= weights.sum(axis=1, keepdims=True)
                hit = np.unique(chosen)
                xt, index, share = torch.from_numpy(x), torch.from_numpy(chosen), torch.from_numpy(weights)
                kinds = {"onnxruntime MoE": partial(ort.run, None, {"x": x, "probs": logits}),
                         "transformers": partial(hf, xt, index, share),
                         "read": partial(read, gate_up, down, hit)}
                if call == 0:
                    agree(kinds["onnxruntime MoE"]()[0], kinds["transformers"](), name)
                for kind, run in kinds.items():
                    flush.sum()
                    with torch.no_grad():
                        spent = timed(run)
                    if call >= 2:
                        times[kind].append(spent)
                if call >= 2:
                    read_bytes.append(len(hit) * per_expert)
            median = {kind: statistics.median(t) for kind, t in times.items()}
            gbs = {kind: statistics.median(b / t / 1e9 for b, t in zip(read_bytes, spent, strict=True))
                   for kind, spent in times.items()}
            rows.append((hf.config._experts_implementation, name, tokens, statistics.median(read_bytes) / per_expert,
                         median["onnxruntime MoE"] * 1e3, gbs["onnxruntime MoE"], median["transformers"] * 1e3,
                         gbs["transformers"], gbs["read"], median["transformers"] / median["onnxruntime MoE"],
                         gbs["onnxruntime MoE"] / gbs["read"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30, help="timed calls of each kind per shape (default 30)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of torch and ONNX Runtime alike")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load average {load_average()}; torch {torch.__version__}"
          f", onnxruntime {onnxruntime.__version__}, transformers {transformers.__version__}; {args.threads} thread(s),"
          f" {args.calls} calls, medians", flush=True)
    rng = np.random.default_rng(0)
    print("\n## Matrix products (float32)")
    print("| product | rows | onnxruntime GFLOP/s | torch GFLOP/s | onnxruntime / torch |")
    print("|---|---:|---:|---:|---:|")
    for product, m, ort, pt, ratio in gemm_rows(args, rng):
        print(f"| {product} | {m} | {ort:.0f} | {pt:.0f} | {ratio:.2f}x |")
    rows = expert_rows(args, rng)
    print(f"\n## Routed experts of a decode step (float32, weights out of cache; transformers' experts "
          f"implementation: {rows[0][0]})")
    print("| shape | tokens | experts hit | onnxruntime MoE ms | GB/s | transformers ms | GB/s | read GB/s | "
          "transformers / MoE | MoE / read |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _, name, tokens, hit, ort_ms, ort_gbs, hf_ms, hf_gbs, read_gbs, speedup, share in rows:
        print(f"| {name} | {tokens} | {hit:.0f} | {ort_ms:.2f} | {ort_gbs:.1f} | {hf_ms:.2f} | {hf_gbs:.1f} | "
              f"{read_gbs:.1f} | {speedup:.2f}x | {share:.2f} |")
    print(f"\n# load average after: {load_average()}")


if __name__ == "__main__":
    main()
