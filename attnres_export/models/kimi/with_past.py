"""``KimiLinearWithPast``: the with-past step of a ``KimiLinearLM`` (docs/decode.md#kimi-linear-with-past).

``cache_inputs()`` per layer, in layer order:

- KDA (``linear_attention``): ``past_key_values.{i}.recurrent`` ``[batch, heads, head_dim, head_dim]`` float32,
  the delta-rule state, and ``.conv_q`` / ``.conv_k`` / ``.conv_v`` ``[batch, heads * head_dim, conv_size - 1]``,
  the last inputs of each short convolution: fixed sizes, no ``past`` axis;
- latent attention (``full_attention``): ``past_key_values.{i}.latent`` ``[batch, past, kv_lora_rank]`` after
  ``kv_a_layernorm`` and ``.rope_key`` ``[batch, past, qk_rope_head_dim]``, the shared key part (unrotated: NoPE).
"""

from __future__ import annotations

from attnres_export.models.base import CacheInput, WithPastStep


class KimiLinearWithPast(WithPastStep):
    """The with-past form of a ``KimiLinearLM`` (shares its weights)."""

    def cache_inputs(self) -> list[CacheInput]:
        cfg, kda = self.config, self.config.kda
        width = kda.num_heads * kda.head_dim
        out = []
        for i, kind in enumerate(cfg.layer_types):
            name = f"past_key_values.{i}."
            if kind == "linear_attention":
                out.append(CacheInput(name + "recurrent", ("batch", kda.num_heads, kda.head_dim, kda.head_dim),
                                      "float32"))
                out += [CacheInput(name + f"conv_{part}", ("batch", width, kda.conv_size - 1)) for part in "qkv"]
            else:
                out += [CacheInput(name + "latent", ("batch", "past", cfg.kv_lora_rank)),
                        CacheInput(name + "rope_key", ("batch", "past", cfg.qk_rope_head_dim))]
        return out

    def metadata(self) -> dict:
        """The cache layout: per layer its kind, with the sizes of the KDA state and of one cached MLA position."""
        cfg, kda = self.config, self.config.kda
        return {"model_type": "kimi_linear", "num_hidden_layers": cfg.num_hidden_layers, "attention": "kimi-linear",
                "layer_types": list(cfg.layer_types), "kv_lora_rank": cfg.kv_lora_rank,
                "qk_rope_head_dim": cfg.qk_rope_head_dim, "kda_heads": kda.num_heads, "kda_head_dim": kda.head_dim,
                "kda_conv_size": kda.conv_size}
