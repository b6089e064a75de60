"""Where one decode step of a with-past ONNX spends its time on ONNX Runtime CPU: its profiler's kernel times per
part of the model (each ``layers.N.mlp`` / ``layers.N.self_attn`` scope, ``lm_head``, the rest), per op type, and
inside the control-flow nodes (an MoE's ``If`` and ``Loop``: their own share is what their subgraphs' ops do not
account for).

The step is fed ``--seq`` new tokens per row (1: a decode step; ``--past 0 --seq 128``: a 128-token prefill) for
``--batch`` rows after a random past of ``--past`` positions (every ``past_key_values.*`` input random normal * 0.1,
input ids random): timings do not depend on the values, only routing does, and random ids
route as a prompt does at random init. The step runs ``--warmup`` then ``--steps`` times unprofiled (the wall
figure), then as often again under the profiler, which adds a per-node cost of its own: read its shares, not its
sums. Run from the repository root:
    python benchmarks/profile_decode_step.py MODEL.with-past.onnx [--batch 1,8] [--past 32] [--seq 1] [--steps 10]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

from attnres_export.graphs.load import load_onnx

SUBGRAPH = re.compile(r"/(then_branch|else_branch|body)/")
SCOPE = re.compile(r"layers\.(\d+)\.(mlp|self_attn)")


def step_feeds(model: onnx.ModelProto, batch: int, past: int, rng: np.random.Generator, seq: int = 1
               ) -> dict[str, np.ndarray]:
    """``seq`` new tokens per row after ``past`` positions of random state."""
    sizes = {"batch": batch, "seq": seq, "past": past, "total": past + seq}
    feeds = {}
    for value in model.graph.input:
        dims = [sizes.get(d.dim_param, d.dim_value) for d in value.type.tensor_type.shape.dim]
        if value.name == "input_ids":
            vocab = next(o for o in model.graph.output if o.name == "logits").type.tensor_type.shape.dim[-1]
            feeds[value.name] = rng.integers(0, vocab.dim_value, dims, dtype=np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones(dims, np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(past, past + seq), dims).astype(np.int64)
        else:
            numpy_type = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feeds[value.name] = (rng.standard_normal(dims) * 0.1).astype(numpy_type)
    return feeds


def part(name: str) -> str:
    found = SCOPE.search(name)
    if found:
        return "MoE / MLP layers" if found[2] == "mlp" else "attention layers (KDA, latent, ...)"
    if "lm_head" in name:
        return "lm_head"
    if "kimi_delta_attention" in name:
        return "attention layers (KDA, latent, ...)"
    return "the rest (norms, AttnRes, embedding)"


def profile(path: Path, batch: int, past: int, steps: int, warmup: int, threads: int, seq: int = 1) -> dict:
    model = load_onnx(path, load_external_data=False)
    rng = np.random.default_rng(batch)
    feeds = step_feeds(model, batch, past, rng, seq)

    def session(profiled: bool, prefix: str) -> onnxruntime.InferenceSession:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        options.enable_profiling = profiled
        options.profile_file_prefix = prefix
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    plain = session(False, "")
    for _ in range(warmup):
        plain.run(None, feeds)
    started = time.perf_counter()
    for _ in range(steps):
        plain.run(None, feeds)
    wall = (time.perf_counter() - started) / steps
    del plain
    with tempfile.TemporaryDirectory(prefix="attnres-profile-") as tmp:
        profiled = session(True, str(Path(tmp) / "step"))
        for _ in range(warmup + steps):
            profiled.run(None, feeds)
        events = json.loads(Path(profiled.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    runs = warmup + steps
    top = [e for e in nodes if not SUBGRAPH.search(e["name"])]
    total = sum(e["dur"] for e in top)
    parts, ops, inner, control = collections.Counter(), collections.Counter(), collections.Counter(), {}
    for e in top:
        parts[part(e["name"])] += e["dur"]
        ops[e["args"]["op_name"]] += e["dur"]
    for e in nodes:
        op = e["args"]["op_name"]
        if op in ("If", "Loop", "Scan"):
            control[op] = control.get(op, 0) + e["dur"]
        if SUBGRAPH.search(e["name"]) and op not in ("If", "Loop", "Scan"):
            inner[op] += e["dur"]
    return {"batch": batch, "wall_ms": wall * 1e3, "profiled_ms": total / runs / 1e3,
            "parts": {k: v / total for k, v in parts.most_common()},
            "ops": {k: v / total for k, v in ops.most_common(8)},
            "control_ms": {k: v / runs / 1e3 for k, v in control.items()},
            "inside_control": {k: v / total for k, v in inner.most_common(6)},
            "inside_control_ms": sum(inner.values()) / runs / 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", type=Path)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--past", type=int, default=32)
    parser.add_argument("--seq", type=int, default=1, help="new tokens per row (1: a decode step)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"# {args.onnx.name}: one step of {args.seq} new token(s) per row after {args.past} positions; onnxruntime "
          f"{onnxruntime.__version__}, {args.threads} thread(s)")
    for batch in (int(b) for b in args.batch.split(",")):
        r = profile(args.onnx, batch, args.past, args.steps, args.warmup, args.threads, args.seq)
        tokens_per_s = batch * args.seq / r["wall_ms"] * 1e3
        print(f"\n## batch {batch}: {r['wall_ms']:.1f} ms per step unprofiled ({tokens_per_s:.1f} tokens/s); "
              f"{r['profiled_ms']:.1f} ms of top-level kernel time profiled")
        print("| part | share |\n|---|---:|")
        for name, share in r["parts"].items():
            print(f"| {name} | {share:.1%} |")
        print("| op type (top level) | share |\n|---|---:|")
        for name, share in r["ops"].items():
            print(f"| {name} | {share:.1%} |")
        if r["control_ms"]:
            own = max(r["control_ms"].values()) - r["inside_control_ms"]
            print(f"control flow: {', '.join(f'{k} {v:.1f} ms' for k, v in r['control_ms'].items())} per step, "
                  f"the ops inside them {r['inside_control_ms']:.1f} ms (so about {own:.1f} ms is the control "
                  "nodes' own cost)")
            print("| op type inside If, Loop, Scan | share of the step |\n|---|---:|")
            for name, share in r["inside_control"].items():
                print(f"| {name} | {share:.1%} |")


if __name__ == "__main__":
    main()
