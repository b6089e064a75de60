"""Absurd config values of every family (docs/security.md#refused-before-anything-is-allocated): each is refused in
one line naming the key and its accepted range, fast and in little memory, before a per-layer list, a tensor or
any arithmetic is made of it; and weights stored in a type attnres does not read are refused naming the tensor.

Every case starts from the folder (or ``.pt``) that ``attnres example --arch NAME`` writes and edits its config."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint
from tests.conftest import slow_after
from tests.security.test_hostile_inputs import invoke

HF_FAMILIES = ["deepseek-v3", "kimi-linear", "llama", "qwen2", "qwen3", "qwen3-moe", "kimi-k3"]
"""The Hugging Face families (``attnres example --arch``), the first one or two in the fast loop."""
PT_FAMILIES = ["attnres-lm", "realformer"]
FAMILIES = [*HF_FAMILIES, *PT_FAMILIES]
DECODERS = ["llama", "qwen2", "qwen3", "qwen3-moe", "deepseek-v3"]
"""The families whose config carries rotary settings (Kimi Linear has no rotary anywhere)."""
ROUTED_SCALING = ["deepseek-v3", "kimi-linear", "kimi-k3"]
"""The families whose config carries ``routed_scaling_factor``."""

BILLION = 10**9
REFUSAL_SECONDS = 2.0
MEMORY_BUDGET = 1 << 30
"""Address space a refusal may add to the process that has imported torch and attnres (RLIMIT_AS)."""
STATES_A_RANGE = " and <"
"""Every refusal of a number states its accepted range, bounded above (``... >= 1 and <= 1048576``)."""


@pytest.fixture(scope="session")
def examples(tmp_path_factory) -> Callable[[str], Path]:
    """``example(arch)``: the folder or ``.pt`` ``attnres example --arch arch --layers 2`` writes, made once."""
    root, made = tmp_path_factory.mktemp("examples"), {}

    def example(arch: str) -> Path:
        if arch not in made:
            out = root / (f"{arch}.pt" if arch in PT_FAMILIES else arch)
            code, lines = invoke("example", out, "--arch", arch, "--layers", "2")
            assert code == 0, lines
            made[arch] = out
        return made[arch]

    return example


def edited(source: Path, into: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of ``source`` whose config went through ``edit`` (a Kimi K3 folder: its ``text_config``)."""
    if source.suffix == ".pt":
        payload = torch.load(source, weights_only=True)
        edit(payload["config"])
        torch.save(payload, into.with_suffix(".pt"))
        return into.with_suffix(".pt")
    shutil.copytree(source, into)
    config = json.loads((into / "config.json").read_text())
    edit(config.get("text_config", config))
    (into / "config.json").write_text(json.dumps(config))
    return into


def setting(**values) -> Callable[[dict], None]:
    return lambda config: config.update(values)


def layers_key(arch: str) -> str:
    return "n_layers" if arch in PT_FAMILIES else "num_hidden_layers"


def refused_in_one_line(path: Path, *needles: str) -> str:
    """The one-line refusal of loading ``path``, which names every needle and comes within ``REFUSAL_SECONDS``."""
    started = time.monotonic()
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    seconds = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message and len(message) < 500, message
    assert all(needle in message for needle in needles), message
    assert seconds < REFUSAL_SECONDS, f"refused after {seconds:.1f} s: {message}"
    return message


CHILD = f"""
import json, resource, sys, time
from pathlib import Path
from attnres_export.errors import AttnresError
from attnres_export.models import load_checkpoint

def address_space():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

limit = address_space() + {MEMORY_BUDGET}
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
started = time.monotonic()
try:
    load_checkpoint(Path(sys.argv[1]))
    outcome = {{"loaded": True}}
except AttnresError as error:
    outcome = {{"refused": str(error)}}
except BaseException as error:
    outcome = {{"crashed": f"{{type(error).__name__}}: {{str(error)[:300]}}"}}
outcome["seconds"] = time.monotonic() - started
print(json.dumps(outcome))
"""


def refused_within_bounds(path: Path, *needles: str) -> str:
    """Loading ``path`` in a child process capped at ``MEMORY_BUDGET`` more address space than its imports took:
    a one-line refusal naming every needle within ``REFUSAL_SECONDS``, not a MemoryError, a hang or a crash."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).parents[2])
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path.name} ran past 300 s")
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert "refused" in outcome, outcome
    message = outcome["refused"]
    assert "\n" not in message and len(message) < 500 and all(needle in message for needle in needles), message
    assert outcome["seconds"] < REFUSAL_SECONDS, outcome
    return message


# --- layer counts: bounded time and memory -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", slow_after(FAMILIES))
def test_a_billion_layers_is_refused_in_one_line_in_bounded_time_and_memory(examples, tmp_path, arch):
    path = edited(examples(arch), tmp_path / arch, setting(**{layers_key(arch): BILLION}))
    refused_within_bounds(path, layers_key(arch), str(BILLION))


@pytest.mark.slow
@pytest.mark.parametrize("key", ["num_nextn_predict_layers", "num_mtp_layers"])
def test_a_billion_multi_token_prediction_layers_is_refused_in_bounded_time_and_memory(examples, tmp_path, key):
    path = edited(examples("deepseek-v3"), tmp_path / "ds", setting(**{key: BILLION}))
    refused_within_bounds(path, key, str(BILLION))


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt what runs past ``seconds`` (a quadratic read of a long list would take minutes)."""

    def expire(*_) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read_quickly(read: Callable[[], object]) -> object:
    """``read()``, which must finish within ``REFUSAL_SECONDS``."""
    started = time.monotonic()
    with deadline(30):
        result = read()
    assert time.monotonic() - started < REFUSAL_SECONDS
    return result


@pytest.mark.parametrize("dense", slow_after(["every other layer", "every layer"]))
def test_a_config_listing_100000_dense_layers_is_read_in_linear_time(examples, dense):
    from attnres_export.models.decoder.hf_config import parse_hf_config

    config = json.loads((examples("qwen3-moe") / "config.json").read_text())
    config.update(num_hidden_layers=100_000, mlp_only_layers=list(range(0, 100_000, 2 if dense == "every other layer"
                                                                       else 1)))
    cfg = read_quickly(lambda: parse_hf_config(config))
    assert len(cfg.moe_layers) == (50_000 if dense == "every other layer" else 0)


@pytest.mark.parametrize("listed", slow_after([list(range(100_000)), [0, 7]]), ids=["100000-indices", "index-7"])
def test_layer_indices_more_than_the_layers_or_past_the_last_are_refused(examples, tmp_path, listed):
    path = edited(examples("qwen3-moe"), tmp_path / "q", setting(mlp_only_layers=listed))
    refused_in_one_line(path, "mlp_only_layers", "2 layers")


@pytest.mark.parametrize("arch", slow_after(["kimi-linear", "kimi-k3"]))
def test_a_config_listing_100000_kda_layers_is_read_in_linear_time(examples, arch):
    from attnres_export.models.kimi.lm_config import KimiLinearConfig

    config = json.loads((examples(arch) / "config.json").read_text())
    config = config.get("text_config", config)
    kda_lists(100_000)(config)
    for key in ("layer_types", "mlp_layer_types"):
        config.pop(key, None)
    cfg = read_quickly(lambda: KimiLinearConfig.from_hf(config))
    assert cfg.kda.kda_layers[:3] == (0, 2, 4) and len(cfg.layer_types) == 100_000


def kda_lists(count: int) -> Callable[[dict], None]:
    """``count`` layers listed alternately as KDA and full attention (1-based, as Moonshot writes them)."""

    def edit(config: dict) -> None:
        config["num_hidden_layers"] = count
        linear = config.setdefault("linear_attn_config", {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4})
        linear["kda_layers"], linear["full_attn_layers"] = list(range(1, count + 1, 2)), list(range(2, count + 1, 2))

    return edit


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["kimi-linear", "kimi-k3"])
def test_100000_listed_kda_layers_are_refused_at_once(examples, tmp_path, arch):
    path = edited(examples(arch), tmp_path / arch, kda_lists(100_000))
    refused_within_bounds(path, "num_hidden_layers")


@pytest.mark.parametrize("arch", slow_after(["kimi-linear", "kimi-k3"]))
def test_layer_lists_longer_than_the_layer_count_are_refused_at_once(examples, tmp_path, arch):
    def longer(config: dict) -> None:
        kda_lists(2)(config)
        config["linear_attn_config"]["kda_layers"] = [1] * 100_000

    refused_in_one_line(edited(examples(arch), tmp_path / arch, longer), "kda_layers", "2 layers")


# --- values that break the arithmetic or poison every logit -------------------------------------------------------


def rope(**parameters) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        config.pop("rope_scaling", None)
        config["rope_parameters"] = {"rope_theta": 10000.0, **parameters}

    return edit


ROPE_CASES = {
    "llama3-low_freq_factor-0": (rope(rope_type="llama3", factor=8.0, low_freq_factor=0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64), "low_freq_factor"),
    "yarn-original-10^400": (rope(rope_type="yarn", factor=8.0, original_max_position_embeddings=10**400),
                             "original_max_position_embeddings"),
    "rope_theta--1": (rope(rope_theta=-1), "rope_theta"),
    "legacy-rope_theta-0": (lambda c: (c.pop("rope_parameters", None), c.update(rope_theta=0)), "rope_theta"),
    "rope_theta-1": (rope(rope_type="yarn", rope_theta=1, factor=8.0), "rope_theta"),
    "yarn-beta_fast--1": (rope(rope_type="yarn", factor=8.0, beta_fast=-1), "beta_fast"),
    "yarn-mscale_all_dim-negative": (rope(rope_type="yarn", factor=100.0, mscale=1.0, mscale_all_dim=-2.1714724),
                                     "mscale_all_dim"),
    "linear-factor-1e308": (rope(rope_type="linear", factor=1e308), "factor"),
    "yarn-attention_factor-0": (rope(rope_type="yarn", factor=8.0, attention_factor=0), "attention_factor"),
}


@pytest.mark.parametrize("case", slow_after(list(ROPE_CASES), fast=len(ROPE_CASES)))
@pytest.mark.parametrize("arch", slow_after(DECODERS))
def test_rotary_values_that_break_the_arithmetic_are_refused_naming_the_key_and_range(examples, tmp_path, arch, case):
    edit, key = ROPE_CASES[case]
    refused_in_one_line(edited(examples(arch), tmp_path / arch, edit), key, STATES_A_RANGE)


@pytest.mark.parametrize(("value", "case"), [("abc", "a string"), (1e308, "overflowing float32"), (-2.5, "negative"),
                                             (True, "a flag")])
@pytest.mark.parametrize("arch", slow_after(ROUTED_SCALING, fast=2))
def test_a_routed_scaling_factor_out_of_range_is_refused_naming_the_key_and_range(examples, tmp_path, arch, value,
                                                                                 case):
    path = edited(examples(arch), tmp_path / arch, setting(routed_scaling_factor=value))
    refused_in_one_line(path, "routed_scaling_factor", STATES_A_RANGE)


@pytest.mark.parametrize("value", [1e300, -1e-6, "1e-6"])
@pytest.mark.parametrize("arch", slow_after(FAMILIES, fast=2))
def test_a_norm_epsilon_out_of_range_is_refused_naming_the_key(examples, tmp_path, arch, value):
    key = "eps" if arch in PT_FAMILIES else "rms_norm_eps"
    refused_in_one_line(edited(examples(arch), tmp_path / arch, setting(**{key: value})), key)


SIZES = [("head_dim", "llama"), ("intermediate_size", "kimi-linear"), ("head_dim", "qwen3"),
         ("intermediate_size", "llama"), ("num_attention_heads", "qwen2"), ("num_attention_heads", "kimi-k3"),
         ("max_position_embeddings", "llama"), ("model_max_length", "kimi-linear"),
         ("moe_intermediate_size", "qwen3-moe"), ("moe_intermediate_size", "deepseek-v3"),
         ("kv_lora_rank", "deepseek-v3"), ("kv_lora_rank", "kimi-linear"), ("d_model", "attnres-lm"),
         ("d_ff", "realformer")]
"""Sizes (and a family that reads each) that a model is built from before its weights are compared."""


@pytest.mark.parametrize(("key", "arch"), slow_after(SIZES, fast=2))
def test_a_size_of_ten_billion_is_refused_naming_the_key_and_range(examples, tmp_path, key, arch):
    refused_in_one_line(edited(examples(arch), tmp_path / arch, setting(**{key: 10**10})), key, STATES_A_RANGE)


@pytest.mark.parametrize("arch", slow_after(["kimi-linear", "kimi-k3"]))
def test_kda_sizes_and_gate_bounds_out_of_range_are_refused_naming_the_key(examples, tmp_path, arch):
    for key, value in (("head_dim", 10**10), ("short_conv_kernel_size", 10**6), ("gate_lower_bound", -1e308)):
        def edit(config: dict, key=key, value=value) -> None:
            config.setdefault("linear_attn_config", {})[key] = value

        refused_in_one_line(edited(examples(arch), tmp_path / f"{arch}-{key}", edit), key, STATES_A_RANGE)


@pytest.mark.parametrize("arch", slow_after(["kimi-linear", "kimi-k3"]))
def test_situ_clip_levels_that_overflow_float32_are_refused(examples, tmp_path, arch):
    path = edited(examples(arch), tmp_path / arch,
                  setting(hidden_act="situ", activation_situ_beta=1e300, activation_situ_linear_beta=25.0))
    refused_in_one_line(path, "activation_situ_beta", STATES_A_RANGE)


@pytest.mark.parametrize("arch", slow_after(HF_FAMILIES, fast=2))
def test_a_config_nested_50000_deep_is_refused_in_one_line(examples, tmp_path, arch):
    folder = edited(examples(arch), tmp_path / arch, setting())
    text = (folder / "config.json").read_text()
    nested = '{"a": ' * 50_000 + "1" + "}" * 50_000
    (folder / "config.json").write_text(text.replace('"vocab_size":', f'"deep": {nested}, "vocab_size":', 1))
    refused_in_one_line(folder, "config.json", "nested")


@pytest.mark.parametrize("arch", slow_after(HF_FAMILIES, fast=2))
def test_a_config_nested_deeper_than_a_model_config_is_refused(examples, tmp_path, arch):
    def deep(config: dict) -> None:
        value: object = 1
        for _ in range(900):
            value = [value]
        config["num_attention_heads"] = value

    refused_in_one_line(edited(examples(arch), tmp_path / arch, deep), "config.json", "nested")


# --- weights in a type attnres does not read ---------------------------------------------------------------------


def retyped(source: Path, into: Path, dtype: torch.dtype) -> tuple[Path, str]:
    """A copy of ``source`` with one norm weight stored as ``dtype``, and that tensor's name."""
    if source.suffix == ".pt":
        payload = torch.load(source, weights_only=True)
        name = next(k for k in payload["state_dict"] if k.endswith("norm.weight"))
        payload["state_dict"][name] = payload["state_dict"][name].to(dtype)
        torch.save(payload, into.with_suffix(".pt"))
        return into.with_suffix(".pt"), name
    shutil.copytree(source, into)
    tensors = load_file(str(into / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("model.norm.weight"))
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    return into, name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float8_e4m3fn, torch.float8_e5m2, torch.int32])
@pytest.mark.parametrize("arch", slow_after(FAMILIES, fast=2))
def test_weights_stored_in_a_type_attnres_does_not_read_are_refused_naming_tensor_and_type(examples, tmp_path, arch,
                                                                                           dtype):
    path, name = retyped(examples(arch), tmp_path / arch, dtype)
    refused_in_one_line(path, name, str(dtype).removeprefix("torch."), "float32, float16 or bfloat16")


@pytest.mark.parametrize("arch", slow_after(["deepseek-v3", "attnres-lm"]))
def test_weights_in_the_storage_types_still_load(examples, tmp_path, arch):
    for dtype in (torch.float16, torch.bfloat16):
        path, _ = retyped(examples(arch), tmp_path / f"{arch}-{dtype}", dtype)
        load_checkpoint(path)
