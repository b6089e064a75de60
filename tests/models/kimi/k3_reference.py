"""An independent float64 Kimi K3 text model, read straight from a K3 folder's ``config.json`` and published
tensor names and written from the public K3 code (docs/models.md#kimi-k3 cites files and commits): SGLang
``python/sglang/srt/models/kimi_k3.py`` (SiTU ``SituAndMul``, the latent MoE ``_forward_unfused``, the MLA output
gate, the full-rank KDA gate, the weight prefixes), llama.cpp ``conversion/kimi_k3.py`` (``A_log[:n_head]``,
1-based ``full_attn_layers``), transformers 5.23's ``Glm5NextTextForgetGate`` (the lower-bounded forget gate),
fla's naive recurrent KDA (the delta rule) and NeMo AutoModel's K3 ``_apply_attn_res`` (the mixing). It shares no
code with ``attnres_export``: one token sequence at a time, loops where the engines fuse."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

F64 = torch.float64


def mxfp4_decompressed(tensors: dict[str, torch.Tensor], quantization: dict | None) -> dict[str, torch.Tensor]:
    """``tensors`` with each MXFP4 weight's ``weight_packed`` and ``weight_scale`` replaced by its ``weight``, as
    compressed-tensors' own ``MXFP4PackedCompressor.decompress`` computes it (the reader K3's publishers use)."""
    packed = [name.removesuffix(".weight_packed") for name in tensors if name.endswith(".weight_packed")]
    if not packed:
        return tensors
    import warnings

    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    warnings.filterwarnings("ignore", module="compressed_tensors")
    group = next(iter(quantization["config_groups"].values()))
    args = QuantizationArgs(**{k: v for k, v in group["weights"].items() if k != "scale_dtype"},
                            scale_dtype=torch.uint8)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressor = BaseCompressor.get_value_from_registry(quantization["format"])
    out = {k: v for k, v in tensors.items() if not k.endswith((".weight_packed", ".weight_scale"))}
    for base in packed:
        parts = {"weight_packed": tensors[f"{base}.weight_packed"], "weight_scale": tensors[f"{base}.weight_scale"]}
        out[f"{base}.weight"] = compressor.decompress(parts, scheme)["weight"]
    return out


class K3Reference:
    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        self.c = config["text_config"]
        self.w = {k.removeprefix("language_model."): v.to(F64) for k, v in mxfp4_decompressed(
            load_file(folder / "model.safetensors"), self.c.get("quantization_config")).items()
            if k.startswith("language_model.")}
        self.full = {n - 1 for n in self.c["linear_attn_config"]["full_attn_layers"]}

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w[name + ".weight"].T

    def rms(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return out if weight is None else out * weight

    def situ(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        beta, linear_beta = self.c.get("activation_situ_beta") or 1.0, self.c.get("activation_situ_linear_beta")
        if self.c["hidden_act"] == "silu":
            return torch.nn.functional.silu(gate) * up
        if linear_beta is not None:
            up = linear_beta * torch.tanh(up / linear_beta)
        return beta * torch.tanh(gate / beta) * torch.sigmoid(gate) * up

    def mlp(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        return self.linear(f"{prefix}.down_proj", self.situ(self.linear(f"{prefix}.gate_proj", x),
                                                            self.linear(f"{prefix}.up_proj", x)))

    def moe(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        scores = torch.sigmoid(self.linear(f"{prefix}.gate", x))
        chosen = (scores + self.w[f"{prefix}.gate.e_score_correction_bias"]).topk(c["num_experts_per_token"]).indices
        weights = scores.gather(-1, chosen)
        if c["moe_renormalize"]:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * c["routed_scaling_factor"]
        latent = c.get("routed_expert_hidden_size") is not None
        h = self.linear(f"{prefix}.routed_expert_down_proj", x) if latent else x
        routed = torch.zeros_like(h)
        for t in range(x.shape[0]):
            for j, expert in enumerate(chosen[t].tolist()):
                e = f"{prefix}.experts.{expert}"
                routed[t] += weights[t, j] * self.linear(f"{e}.w2", self.situ(self.linear(f"{e}.w1", h[t]),
                                                                              self.linear(f"{e}.w3", h[t])))
        if latent:
            if c.get("latent_moe_use_norm"):
                routed = self.rms(routed, self.w[f"{prefix}.routed_expert_norm.weight"], c["rms_norm_eps"])
            routed = self.linear(f"{prefix}.routed_expert_up_proj", routed)
        return routed + self.mlp(f"{prefix}.shared_experts", x)

    def mla(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        c, t = self.c, x.shape[0]
        heads, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        if c.get("q_lora_rank") is None:
            q = self.linear(f"{prefix}.q_proj", x)
        else:
            q = self.linear(f"{prefix}.q_b_proj", self.rms(self.linear(f"{prefix}.q_a_proj", x),
                                                           self.w[f"{prefix}.q_a_layernorm.weight"], 1e-6))
        q = q.view(t, heads, nope + rope)
        latent, k_rope = self.linear(f"{prefix}.kv_a_proj_with_mqa", x).split([c["kv_lora_rank"], rope], -1)
        kv = self.linear(f"{prefix}.kv_b_proj", self.rms(latent, self.w[f"{prefix}.kv_a_layernorm.weight"], 1e-6))
        k_nope, v = kv.view(t, heads, nope + vd).split([nope, vd], -1)
        k = torch.cat([k_nope, k_rope[:, None].expand(t, heads, rope)], -1)
        logits = torch.einsum("qhd,khd->hqk", q, k) * (nope + rope) ** -0.5
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v).reshape(t, heads * vd)
        if c.get("mla_use_output_gate"):
            out = out * torch.sigmoid(self.linear(f"{prefix}.g_proj", x))
        return self.linear(f"{prefix}.o_proj", out)

    def kda(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        la, t = self.c["linear_attn_config"], x.shape[0]
        heads, dk = la["num_heads"], la["head_dim"]

        def conv(name: str) -> torch.Tensor:
            y, kernel = self.linear(f"{prefix}.{name}_proj", x), self.w[f"{prefix}.{name}_conv1d.weight"][:, 0]
            padded = torch.cat([y.new_zeros(kernel.shape[1] - 1, y.shape[1]), y])
            mixed = torch.stack([(padded[i:i + kernel.shape[1]] * kernel.T).sum(0) for i in range(t)])
            return torch.nn.functional.silu(mixed).view(t, heads, dk)

        q, k, v = conv("q"), conv("k"), conv("v")
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(self.linear(f"{prefix}.b_proj", x))
        f = (self.linear(f"{prefix}.f_b_proj", self.linear(f"{prefix}.f_a_proj", x)) + self.w[f"{prefix}.dt_bias"])
        rate = torch.exp(self.w[f"{prefix}.A_log"].reshape(-1)[:heads])[:, None]
        f = f.view(t, heads, dk)
        bound = la.get("gate_lower_bound")
        g = bound * torch.sigmoid(rate * f) if bound is not None else -rate * torch.nn.functional.softplus(f)
        state = x.new_zeros(heads, dk, dk)
        out = []
        for i in range(t):
            state = state * torch.exp(g[i])[..., None]
            predicted = torch.einsum("hk,hkv->hv", k[i], state)
            state = state + torch.einsum("hk,hv->hkv", beta[i][:, None] * k[i], v[i] - predicted)
            out.append(torch.einsum("hk,hkv->hv", q[i], state))
        core = torch.stack(out)
        if la.get("use_full_rank_gate"):
            gate = self.linear(f"{prefix}.g_proj", x)
        else:
            gate = self.linear(f"{prefix}.g_b_proj", self.linear(f"{prefix}.g_a_proj", x))
        normed = self.rms(core, self.w[f"{prefix}.o_norm.weight"], self.c["rms_norm_eps"])
        return self.linear(f"{prefix}.o_proj", (normed * torch.sigmoid(gate.view(t, heads, dk))).reshape(t, -1))

    def mix(self, site: str, values: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(values)
        keys = self.rms(stacked, None, self.c["rms_norm_eps"])
        scores = (keys * self.w[f"{site}_norm.weight"] * self.w[f"{site}_proj.weight"][0]).sum(-1)
        return (scores.softmax(0)[..., None] * stacked).sum(0)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """``[T, vocab]`` float64 logits of one sequence."""
        c, eps, block = self.c, self.c["rms_norm_eps"], self.c.get("attn_res_block_size")
        h = self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        bank: list[torch.Tensor] = []
        partial: torch.Tensor | None = h
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}"

            def attention(x: torch.Tensor, p: str = p, i: int = i) -> torch.Tensor:
                x = self.rms(x, self.w[f"{p}.input_layernorm.weight"], eps)
                return self.mla(f"{p}.self_attn", x) if i in self.full else self.kda(f"{p}.self_attn", x)

            def feed_forward(x: torch.Tensor, p: str = p, i: int = i) -> torch.Tensor:
                x = self.rms(x, self.w[f"{p}.post_attention_layernorm.weight"], eps)
                moe = i >= c["first_k_dense_replace"]
                return self.moe(f"{p}.block_sparse_moe", x) if moe else self.mlp(f"{p}.mlp", x)

            if block is None:
                h = h + attention(h)
                h = h + feed_forward(h)
                continue
            x = self.mix(f"{p}.self_attention_res", [*bank, partial]) if bank else partial
            if i % block == 0:
                bank.append(partial)
                partial = None
            out = attention(x)
            partial = out if partial is None else partial + out
            partial = partial + feed_forward(self.mix(f"{p}.mlp_res", [*bank, partial]))
        if block is not None:
            h = self.mix("model.output_attn_res", [*bank, partial])
        return self.linear("lm_head", self.rms(h, self.w["model.norm.weight"], eps))

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        tokens = list(ids)
        for _ in range(new_tokens):
            tokens.append(int(self.logits(tokens)[-1].argmax()))
        return tokens[len(ids):]


def with_float_experts(folder: Path) -> Path:
    """Rewrite a K3 example folder's MXFP4 experts as float32 (decompressed by compressed-tensors) and drop its
    ``quantization_config``: a K3 folder whose whole model a trace can hold (``--trace-whole``) and TensorRT builds."""
    from safetensors.torch import save_file

    config = json.loads((folder / "config.json").read_text())
    quantization = config["text_config"].pop("quantization_config")
    tensors = mxfp4_decompressed(load_file(folder / "model.safetensors"), quantization)
    save_file({k: v.float().contiguous() if k.endswith(".weight") and v.dtype == torch.bfloat16 else v
               for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
