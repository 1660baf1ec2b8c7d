"""Shared helpers for the generation tests."""

from __future__ import annotations

import torch

from replayssm.patches.kinds import KINDS
from replayssm.tiny import TINY_FAMILIES, build_tiny_model


def families_of(*kinds: str) -> list[str]:
    """The tiny families whose SSM layers are of one of ``kinds``, in declaration order."""
    return [name for name, family in TINY_FAMILIES.items() if family.kind in kinds]


MAMBA2_FAMILIES = families_of("mamba2")
DELTA_FAMILIES = families_of("gated_deltanet", "kda")
#: every family whose layer kind has a replay mixin
REWRITABLE_FAMILIES = families_of(*(k.name for k in KINDS.values() if k.mixin is not None))

_MODELS: dict[tuple[str, torch.dtype], torch.nn.Module] = {}


def tiny(family: str, dtype: torch.dtype = torch.float32):
    """A fresh-enough tiny model (cached per family/dtype; tests must unpatch what they patch)."""
    import pytest

    key = (family, dtype)
    if key not in _MODELS:
        try:
            _MODELS[key] = build_tiny_model(f"tiny:{family}", dtype=dtype)
        except Exception as exc:
            pytest.skip(f"tiny:{family} unavailable with this transformers: {exc}")
    return _MODELS[key]


def left_padded_batch(seed: int = 0, batch: int = 3, length: int = 9, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 512, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        mask[row, : min(row * 2, length - 1)] = 0  # row 0 unpadded, later rows padded more
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def generate(model, ids, mask, **kwargs):
    kw = dict(attention_mask=mask, do_sample=False, output_logits=True, return_dict_in_generate=True,
              pad_token_id=0)
    kw.update(kwargs)
    return model.generate(ids, **kw)


@torch.no_grad()
def forced_logits(model, ids, mask, seq):
    """Logits of the next token at every decode step with the tokens of ``seq`` fed in
    (teacher forcing: every variant sees the same inputs). (steps, batch, vocab) fp32."""
    from replayssm.patches.compat import generate_cache_kwarg

    P = ids.shape[1]
    key = generate_cache_kwarg(model)  # pure Mamba-2 on transformers 5.17 takes and returns cache_params
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    cache = getattr(out, key, None) or out.past_key_values
    logits = [out.logits[:, -1].float()]
    for t in range(seq.shape[1] - P - 1):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=seq[:, P + t: P + t + 1], attention_mask=mask, use_cache=True, **{key: cache})
        cache = getattr(out, key, None) or out.past_key_values
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits)


def low_precision_errors(family, dtype, device, backend, state_dtype=None, steps=24):
    """Teacher-forced logit errors against the fp32 model: (stock in ``dtype``, patched in ``dtype``).

    The fp32 model's greedy continuation is fed to both, so the comparison never depends on
    a near-tie flipping a token; the fp32 model is the oracle for both."""
    import replayssm

    ids, mask = left_padded_batch(seed=2, device=device)
    m32 = tiny(family, torch.float32).to(device)
    seq = generate(m32, ids, mask, max_new_tokens=steps, min_new_tokens=steps).sequences
    ref = forced_logits(m32, ids, mask, seq)
    m16 = tiny(family, dtype).to(device)
    stock = (forced_logits(m16, ids, mask, seq) - ref).abs().max().item()
    replayssm.patch(m16, buffer_len=8, state_dtype=state_dtype, backend=backend)
    try:
        patched = (forced_logits(m16, ids, mask, seq) - ref).abs().max().item()
    finally:
        replayssm.unpatch(m16)
    return stock, patched


def generate_patched(model, ids, mask, patch_kw: dict, **kwargs):
    """``generate`` with ``replayssm.patch(model, **patch_kw)`` applied, and undone afterwards."""
    import replayssm

    replayssm.patch(model, **patch_kw)
    try:
        return generate(model, ids, mask, **kwargs)
    finally:
        replayssm.unpatch(model)


def max_logit_diff(a, b) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a.logits, b.logits))



def assert_close_until_near_tie(out, ref, prompt_len: int, tol: float) -> None:
    """Low-precision parity: logits agree within ``tol`` up to the first differing token, and
    that token may only differ where the reference's top-2 logits were within ``2 * tol``
    (a near-tie that rounding may flip; after it the continuations legitimately diverge)."""
    new_out, new_ref = out.sequences[:, prompt_len:], ref.sequences[:, prompt_len:]
    steps = min(new_out.shape[1], new_ref.shape[1])
    differs = (new_out[:, :steps] != new_ref[:, :steps]).any(dim=0).nonzero()
    first = int(differs[0]) if differs.numel() else steps
    for t in range(first):
        diff = (out.logits[t].float() - ref.logits[t].float()).abs().max().item()
        assert diff < tol, f"step {t}: logits differ by {diff} (tol {tol})"
    if first < steps:
        rows = (new_out[:, first] != new_ref[:, first]).nonzero().flatten()
        top2 = ref.logits[first].float()[rows].topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).max().item()
        assert margin < 2 * tol, f"step {first}: tokens differ although the reference margin was {margin}"


def explain_decode_step(model):
    """``torch._dynamo.explain`` of a patched model's first SSM mixer on one decode step (after a prefill of two
    rows and a first step, which allocates the buffers), in the model's dtype."""
    import transformers

    import replayssm

    prompt = torch.randint(3, 512, (2, 5), generator=torch.Generator().manual_seed(0))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
        model(prompt[:, :1], past_key_values=cache, use_cache=True)
        mixer = model.get_submodule(replayssm.find_ssm_layers(model)[0].name)
        torch._dynamo.reset()
        x = torch.randn(2, 1, model.config.hidden_size, dtype=model.dtype)
        try:
            return mixer, torch._dynamo.explain(mixer)(x, cache_params=cache)
        finally:
            torch._dynamo.reset()
