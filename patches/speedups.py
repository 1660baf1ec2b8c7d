"""What a patched model changes outside its SSM layers, to decode faster; the same model up to rounding.

* Attention: the attention modules' implementation (theirs only: the config objects keep ``sdpa``)
  becomes a registered form of ``sdpa`` whose one-token queries on CUDA run the Triton
  decode-attention kernel (``decode_attention``; K/V read once per key/value head, the masked tail
  of a static cache not read), and otherwise run ``sdpa`` on the key/value heads directly where
  transformers 5.17-5.23 would repeat the KV cache per query head
  (``attention_switch.use_grouped_decode_attention``). A model whose modeling code compares the name with
  ``"sdpa"`` (5.24's glm5_next) keeps ``sdpa``: under another name it would compute differently.
* Multi-head latent attention (the ``expand_kv`` form: Kimi-Linear, Bailing-hybrid) attends a one-token
  query on the cached latents instead of expanding the whole cache into per-head keys and values
  every step (``latent_attention``): the same attention with the products regrouped, in fp32; the
  first such call of each module checks it against the expanded form.
* The decoder layers' plain RMSNorms run as one Triton launch each on CUDA tensors, checked
  against the module on their first call (``fused_norm.fuse_decoder_norms``).
* The ``nn.Linear`` layers run a weight-streaming Triton GEMV for one-row CUDA inputs with 16-bit
  weights inside a CUDA-graph capture, i.e. the captured step of a batch-1 graph decode
  (``fused_linear.fuse_decode_linears``); fp32 accumulation like cuBLAS, so outputs differ from its
  only in the last rounding; fp32 weights keep cuBLAS. Projections sharing an input run as one launch
  there, and a gated MLP's gate and up as one gated launch.
* The 16-bit weights of a rewritten layer's projections that share an input (``_replay_pack``: the
  delta-rule layers' ``delta.PROJECTION_GROUPS``) are stored as one buffer, each weight a view of its
  rows (``packed_linear``): with more than one row of input they run as one GEMM. A layer packs them
  again after each prefill if they were replaced or moved since (``model.to(...)`` after ``patch``).

All five are per instance and undone by ``drop_decode_speedups`` (``unpatch``).
"""

from __future__ import annotations

import torch

from . import attention_switch
from .base import ReplayMixin
from .fused_linear import fuse_decode_linears, unfuse_decode_linears
from .fused_norm import fuse_decoder_norms, unfuse_decoder_norms
from .latent_attention import restore_latent_decode, use_latent_decode
from .packed_linear import unpack_linears


def use_decode_speedups(model: torch.nn.Module) -> None:
    attention_switch.use_grouped_decode_attention(model)
    use_latent_decode(model, attention_switch.GROUPED_SDPA)
    fuse_decoder_norms(model)
    fuse_decode_linears(model)
    for module in model.modules():
        if isinstance(module, ReplayMixin):
            module._replay_pack()


def drop_decode_speedups(model: torch.nn.Module) -> None:
    restore_latent_decode(model)
    attention_switch.restore_decode_attention(model)
    unfuse_decoder_norms(model)
    unfuse_decode_linears(model)
    unpack_linears(model)
