"""Real-size model presets with random weights: ``build_preset("qwen3.5-4b-like", torch.bfloat16, "cuda")``.

A preset is a transformers config at the layer sizes of a released hybrid model, so that the
decode step can be timed at real sizes without downloading weights (``replayssm bench
--preset NAME``). The weights are random (seed 0), which is all a timing needs; the tokens
they produce mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ModelSpecError

_LIN3FULL = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


@dataclass(frozen=True)
class Preset:
    """A named config builder. ``summary``: one line for tables and ``--help``."""

    name: str
    summary: str
    config_class: str
    kwargs: dict[str, Any]

    def config(self):
        """The transformers config (raises ModelSpecError if this transformers lacks the class)."""
        import transformers

        cls = getattr(transformers, self.config_class, None)
        if cls is None:
            raise ModelSpecError(
                f"preset {self.name!r} needs transformers' {self.config_class}, which transformers "
                f"{transformers.__version__} does not have",
                hint="upgrade transformers, or pick another preset",
            )
        return cls(**self.kwargs)


def _nemotron_pattern() -> list[str]:
    # 28 layers: 12 Mamba-2 + MLP pairs, two attention + MLP pairs after the 4th and 8th Mamba-2 layer
    pairs = ["M"] * 4 + ["*"] + ["M"] * 4 + ["*"] + ["M"] * 4
    names = {"M": "linear_attention", "*": "full_attention"}
    return [layer for p in pairs for layer in (names[p], "mlp")]


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "nemotron3-nano-like",
        "Nemotron-H, hidden 3072, 28 layers: 12 Mamba-2 (96 heads x 80, state 128, 8 groups), 2 attention, "
        "14 MLP; 2.3B parameters (1.9B besides the embedding)",
        "NemotronHConfig",
        dict(layers_block_type=_nemotron_pattern(), hidden_size=3072, intermediate_size=6144,
             mamba_num_heads=96, mamba_head_dim=80, ssm_state_size=128, n_groups=8, conv_kernel=4, expand=2,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=131072,
             tie_word_embeddings=False,
             # prefill runs transformers' PyTorch chunk scan unless mamba_ssm is installed; it holds
             # batch x chunk x chunk x heads x state per chunk (103 GB at batch 256 with chunks of 128,
             # 1.6 GB with 16). Decoding does not use chunks.
             chunk_size=16),
    ),
    Preset(
        "qwen3.5-4b-like",
        "Qwen3.5 text model, hidden 2560, 32 layers: 24 Gated DeltaNet (16 key / 32 value heads, 128 x 128), "
        "8 full attention; tied embeddings; 4.2B parameters (3.6B besides the embedding)",
        "Qwen3_5TextConfig",
        dict(vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
             num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
             linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
             layer_types=_LIN3FULL * 8, tie_word_embeddings=True),
    ),
    Preset(
        "kimi-linear-like",
        "Kimi-Linear, hidden 2304, 27 layers: 21 KDA (32 heads x 128), 6 MLA attention; dense MLPs (9216) in "
        "every layer instead of the 256-expert MoE; 3.5B parameters",
        "KimiLinearConfig",
        dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216, num_hidden_layers=27,
             num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, qk_rope_head_dim=64,
             qk_nope_head_dim=128, v_head_dim=128, linear_num_heads=32, linear_head_dim=128,
             layer_types=(_LIN3FULL * 7)[:27], mlp_layer_types=["dense"] * 27, tie_word_embeddings=False),
    ),
)}


def preset(name: str) -> Preset:
    """The preset called ``name``; raises ModelSpecError listing the presets."""
    if name not in PRESETS:
        raise ModelSpecError(f"unknown preset {name!r}; expected one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def build_preset(name: str, dtype, device, *, seed: int = 0):
    """The preset's causal-LM model with random weights (``seed``), in ``dtype``, built on ``device``.

    The weights are drawn on ``device`` directly (a few seconds on a GPU for billions of
    parameters, where a CPU would take minutes).
    """
    import torch

    from .tiny import model_class_for

    config = preset(name).config()
    cls = model_class_for(config)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        if torch.device(device).type == "cuda":
            torch.cuda.manual_seed_all(seed)
        with torch.device(device):
            model = cls._from_config(config, dtype=dtype)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


__all__ = ["PRESETS", "Preset", "build_preset", "preset"]
