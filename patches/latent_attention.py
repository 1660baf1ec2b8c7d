"""One-token decode steps of multi-head latent attention (MLA) on the latent cache, per instance.

transformers' MLA modules (the ``expand_kv`` form: Kimi-Linear, Bailing-hybrid, ...) cache each
position's compressed latent c (``kv_lora_rank``, r) and shared rope key (``qk_rope_head_dim``), and at
every step expand the whole cache through ``kv_b_proj`` into per-head keys and values: a (B, C, r) x
(r, H (nope + v)) GEMM and a (B, H, C, nope + rope + v) tensor, both growing with the cache length C,
which for the static cache of a CUDA-graph decode is its capacity. A one-token query needs none of it:
with ``kv_b_proj``'s weight split per head into W_uk (nope, r) and W_uv (v, r),

    s_j = q_nope . (W_uk c_j) + q_rope . k_rope_j = (W_uk^T q_nope) . c_j + q_rope . k_rope_j
    o   = sum_j p_j (W_uv c_j) = W_uv (sum_j p_j c_j)

so the step reads each cached position's r + rope values once for all heads (the "absorbed" MLA
decode of DeepSeek's and the serving engines' kernels). Here in PyTorch ops: the latents upcast to
fp32, scores, softmax and both sums in fp32, the output rounded to the activation dtype once (the
expanded form rounds keys, values and the softmax weights to it).

``use_latent_decode`` wraps each such module's ``expand_kv`` (instance attribute): while the module's
attention function is ``attention_switch.GROUPED_SDPA`` it hands the latents through unexpanded and
marks the call; ``grouped_sdpa_attention`` then runs ``latent_attention`` for a one-token query and
expands (the module's own ``expand_kv``) for any other. The first one-token call of each module, outside
a CUDA-graph capture, also runs the expanded form and keeps the latent one only if the two agree within
rounding (else the module expands from then on): a modeling change that this form does not follow
falls back instead of computing something else. ``restore_latent_decode`` removes the wrappers.
"""

from __future__ import annotations

import torch

from .decode_attention import HARMLESS_KWARGS

#: module attributes: the wrapped ``expand_kv``'s original, the probe's verdict (None: not yet), the
#: mark that this call's ``expand_kv`` returned latents
_ORIGINAL = "_replayssm_expand_kv"
_VERDICT = "_replayssm_latent_ok"
_LATENT_CALL = "_replayssm_latent_call"


def is_latent_attention(module: torch.nn.Module) -> bool:
    """An MLA module of transformers' ``expand_kv`` form: ``kv_b_proj`` a bias-free Linear from
    ``kv_lora_rank`` to heads x (``qk_nope_head_dim`` + ``v_head_dim``)."""
    proj = getattr(module, "kv_b_proj", None)
    sizes = [getattr(module, name, None) for name in ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                                       "v_head_dim", "kv_lora_rank")]
    if not (callable(getattr(module, "expand_kv", None)) and isinstance(proj, torch.nn.Linear)
            and proj.bias is None and all(isinstance(s, int) and s > 0 for s in sizes)):
        return False
    heads, nope, _, v, rank = sizes
    return tuple(proj.weight.shape) == (heads * (nope + v), rank)


def latent_attention(module: torch.nn.Module, query: torch.Tensor, latents: torch.Tensor,
                     rope_keys: torch.Tensor, mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Attention of a one-token query on the latent cache: query (B, H, 1, nope + rope), latents
    (B, 1, C, r), rope_keys (B, 1, C, rope), mask None, bool (True = attend) or additive, broadcastable
    to (B, 1, 1, C); returns (B, 1, H, v) in query's dtype, the layout of transformers' attention
    functions. The CPU and GPU path alike (PyTorch ops, no host synchronisation)."""
    batch, heads = query.shape[:2]
    nope, rank = module.qk_nope_head_dim, latents.shape[-1]
    weight = module.kv_b_proj.weight.view(heads, nope + module.v_head_dim, rank).float()
    q = query[:, :, 0].float()
    lat, rope = latents[:, 0].float(), rope_keys[:, 0].float()
    q_lat = torch.einsum("bhn,hnr->bhr", q[..., :nope], weight[:, :nope])
    scores = torch.bmm(q_lat, lat.transpose(1, 2)) + torch.bmm(q[..., nope:], rope.transpose(1, 2))
    scores = scores * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if mask is not None:
        mask = mask[..., -1:, : lat.shape[1]].reshape(mask.shape[0], 1, -1)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    mixed = torch.bmm(torch.softmax(scores, dim=-1), lat)
    out = torch.einsum("bhr,hvr->bhv", mixed, weight[:, nope:])
    return out.to(query.dtype).unsqueeze(1).contiguous()


def serves(module, query, latents, rope_keys, dropout, kwargs) -> bool:
    """Whether ``latent_attention`` computes this call as the expanded form would."""
    return (query.dim() == 4 and query.shape[2] == 1 and not dropout and not module.training
            and latents.dim() == 4 and latents.shape[1] == 1 and rope_keys.shape[:3] == latents.shape[:3]
            and query.shape[-1] == module.qk_nope_head_dim + rope_keys.shape[-1]
            and all(v is None or k in HARMLESS_KWARGS for k, v in kwargs.items()))


def latent_call(module) -> bool:
    """Whether this attention call's key and value are latents (consumes the mark ``expand_kv`` set)."""
    return module.__dict__.pop(_LATENT_CALL, False)


def expand(module, latents: torch.Tensor, rope_keys: torch.Tensor):
    """The module's own ``expand_kv`` of the latents: per-head keys and values."""
    return module.__dict__[_ORIGINAL](latents, rope_keys)


def attend(module, query, latents, rope_keys, mask, dropout, scaling, kwargs, expanded_attention):
    """The attention of a call whose ``expand_kv`` handed latents through: the latent form for a
    one-token query it serves (once the probe agreed), else ``expanded_attention(key, value)``."""
    verdict = module.__dict__.get(_VERDICT)
    if verdict is False or not serves(module, query, latents, rope_keys, dropout, kwargs):
        return expanded_attention(*expand(module, latents, rope_keys))
    out = latent_attention(module, query, latents, rope_keys, mask, scaling)
    if verdict is None:
        if _capturing(query) or torch.compiler.is_compiling():  # the probe reads a value on the host
            return expanded_attention(*expand(module, latents, rope_keys))
        ref = expanded_attention(*expand(module, latents, rope_keys))
        module.__dict__[_VERDICT] = _agrees(out, ref)
        return out if module.__dict__[_VERDICT] else ref
    return out


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def _agrees(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Within rounding of the expanded form: 1e-4 of the output's scale in fp32, 2^-5 in 16 bits (which
    rounds keys, values and weights there); a different computation misses by far more."""
    if out.shape != ref.shape:
        return False
    tol = 1e-4 if ref.dtype == torch.float32 else 2.0 ** -5
    scale = ref.float().abs().max().item() + 1e-6
    return bool(((out.float() - ref.float()).abs() <= tol * scale).all())


def _wrapped_expand_kv(module, original, attention_name: str):
    def expand_kv(latents, rope_keys):
        if module.config._attn_implementation != attention_name or torch.compiler.is_compiling():
            return original(latents, rope_keys)
        module.__dict__[_LATENT_CALL] = True  # the attention function that the module calls next is ours
        return latents, rope_keys

    return expand_kv


def use_latent_decode(model: torch.nn.Module, attention_name: str) -> int:
    """Wrap ``expand_kv`` of every MLA module of ``model`` whose attention function is ``attention_name``
    (``attention_switch``'s, which calls ``attend``); returns the number wrapped."""
    count = 0
    for module in model.modules():
        if (is_latent_attention(module) and _ORIGINAL not in module.__dict__
                and getattr(getattr(module, "config", None), "_attn_implementation", None) == attention_name):
            original = module.expand_kv
            module.__dict__[_ORIGINAL] = original
            module.expand_kv = _wrapped_expand_kv(module, original, attention_name)
            count += 1
    return count


def restore_latent_decode(model: torch.nn.Module) -> None:
    for module in model.modules():
        if module.__dict__.pop(_ORIGINAL, None) is not None:
            module.__dict__.pop("expand_kv", None)
            module.__dict__.pop(_VERDICT, None)
            module.__dict__.pop(_LATENT_CALL, None)
