"""Layers shared by two or more model families: each family imports them from here, never from another family
(import-linter: "Model families are independent", docs/architecture.md#adding-an-architecture).

``norm.py`` RMSNorm; ``attention.py`` masked softmax attention over grouped keys; ``mlp.py`` the gated SiLU MLP;
``moe.py`` the MoE config (transformers' keys), routers, stacked experts and ``expert_state_from_hf``; ``residual.py``
K3's Attention Residuals sites; ``causal_lm.py`` the causal-LM base (module layout, residual streams, contract
methods); ``plan.py`` the export-plan pieces of that base; ``hf_keys.py`` the Hugging Face keys every family accepts.
"""
