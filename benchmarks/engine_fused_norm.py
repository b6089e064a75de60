"""Engine-level gain of ``--fuse-norm`` (docs/op-set.md#attnresaggregatenorm) on a GPU with TensorRT: the same
12-layer model exported with and without it, both engines built with the attnres plugins, checked against PyTorch,
then timed in alternation by ``attnres bench --compare`` (the fused engine first, so its ratio reads fused/unfused).

Model: 12 layers, d_model 512, 8 heads, d_ff 1408, vocab 8192, Block AttnRes S = 4, float16. Run from the
repository root on a machine with an NVIDIA GPU, TensorRT, torch with CUDA, cmake and nvcc:
    python benchmarks/engine_fused_norm.py [--out DIR] [--dtype float16] [--iterations 200]
Every step is an ``attnres`` command, printed before it runs, so a failure names the command to rerun.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

CONFIG = AttnResLMConfig(vocab_size=8192, d_model=512, n_layers=12, n_heads=8, d_ff=1408, block_size=4, max_seq_len=512)
SHAPES = ("1,1", "1,128", "8,128", "4,512")
"""Single-token decode, one prompt, a batch of prompts, long prompts."""


def run(*args: str | Path) -> None:
    command = [str(a) for a in args]
    print("$ " + shlex.join(command), flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("fused-norm-bench"))
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    if importlib.util.find_spec("tensorrt") is None:
        sys.exit("error: TensorRT is not installed; run this on a GPU machine with TensorRT (pip install tensorrt)")
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "m12.pt"
    save_checkpoint(make_example(CONFIG, seed=0), CONFIG, checkpoint)
    exe = [Path(sys.executable).with_name("attnres")]
    run(*exe, "plugin", "build")
    engines = {}
    for variant, flags in (("fused", ["--fuse-norm"]), ("unfused", [])):
        onnx_path, engine = args.out / f"m12.{variant}.onnx", args.out / f"m12.{variant}.engine"
        run(*exe, "export", checkpoint, "-o", onnx_path, "--dtype", args.dtype, "--batch", "1:1:8",
            "--seq", "1:128:512", *flags)
        run(*exe, "build", onnx_path, "-o", engine)
        engines[variant] = engine
    run(*exe, "check", checkpoint, "--engine", engines["fused"], "--engine", engines["unfused"])
    shapes = [item for shape in SHAPES for item in ("--shapes", shape)]
    for graph in ([], ["--cuda-graph"]):
        run(*exe, "bench", engines["fused"], "--compare", engines["unfused"], *shapes,
            "--iterations", str(args.iterations), *graph)


if __name__ == "__main__":
    main()
