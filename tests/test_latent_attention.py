"""Multi-head latent attention decode steps on the latent cache (patches/latent_attention.py).

The latent form against the expanded one transformers computes (the module's own ``expand_kv`` and
sdpa), in fp32 and in bf16 against an fp64 oracle; the probe that keeps the expanded form when the two
disagree; ``generate()`` of patched models against stock ones; the switch and its undoing."""

import pytest
import torch
import torch.nn.functional as F

import replayssm
from replayssm.patches import latent_attention

from helpers import generate, left_padded_batch, max_logit_diff, tiny

MLA_FAMILIES = ["kimi_linear", "bailing_hybrid"]


def _mla_modules(model):
    return [m for m in model.modules() if latent_attention.is_latent_attention(m)]


def _inputs(module, batch=3, length=11, dtype=torch.float32, seed=0):
    """query (B, H, 1, nope + rope), latents (B, 1, C, r), rope keys (B, 1, C, rope) and a bool mask
    (B, 1, 1, C) with each row's first positions masked (left padding) and its last 3 (unwritten slots
    of a static cache)."""
    g = torch.Generator().manual_seed(seed)
    heads, nope, rope, rank = module.num_heads, module.qk_nope_head_dim, module.qk_rope_head_dim, module.kv_lora_rank
    query = torch.randn(batch, heads, 1, nope + rope, generator=g).to(dtype)
    latents = torch.randn(batch, 1, length, rank, generator=g).to(dtype)
    rope_keys = torch.randn(batch, 1, length, rope, generator=g).to(dtype)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    for row in range(batch):
        mask[row, ..., :row] = False
    mask[..., length - 3:] = False
    return query, latents, rope_keys, mask


def _expanded(module, query, latents, rope_keys, mask, expand=None):
    """What transformers computes: keys and values expanded per head, then sdpa; (B, 1, H, v)."""
    key, value = (expand or module.expand_kv)(latents, rope_keys)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=module.scaling)
    return out.transpose(1, 2)


@pytest.mark.parametrize("family", MLA_FAMILIES)
def test_latent_form_equals_the_expanded_form(family):
    module = _mla_modules(tiny(family))[0]
    query, latents, rope_keys, mask = _inputs(module)
    got = latent_attention.latent_attention(module, query, latents, rope_keys, mask, module.scaling)
    want = _expanded(module, query, latents, rope_keys, mask)
    assert got.shape == want.shape == (3, 1, module.num_heads, module.v_head_dim) and got.is_contiguous()
    assert (got - want).abs().max() < 1e-5 * want.abs().max()
    # an additive mask, a mask over fewer rows (broadcast), no mask: as sdpa takes them
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert torch.allclose(latent_attention.latent_attention(module, query, latents, rope_keys, additive,
                                                            module.scaling), got, atol=1e-6)
    one = mask[:1].expand(3, -1, -1, -1)
    got = latent_attention.latent_attention(module, query, latents, rope_keys, mask[:1], module.scaling)
    assert (got - _expanded(module, query, latents, rope_keys, one)).abs().max() < 1e-5
    got = latent_attention.latent_attention(module, query, latents, rope_keys, None, module.scaling)
    assert (got - _expanded(module, query, latents, rope_keys, None)).abs().max() < 1e-5


def test_latent_form_in_bf16_is_no_further_from_exact_than_the_expanded_form():
    """bf16 inputs: the latent form sums in fp32 and rounds once, the expanded form rounds keys, values
    and weights; against fp64 on the same bf16 inputs, the latent form's error is the smaller."""
    model = tiny("kimi_linear", torch.bfloat16)
    module = _mla_modules(model)[0]
    query, latents, rope_keys, mask = _inputs(module, batch=4, length=64, dtype=torch.bfloat16, seed=3)
    weight = module.kv_b_proj.weight.double()

    def expand64(c, r):  # the expansion in fp64 from the same bf16 weight
        saved = module.kv_b_proj.weight.data
        module.kv_b_proj.to(torch.float64)
        try:
            return module.expand_kv(c.double(), r.double())
        finally:
            module.kv_b_proj.weight.data = saved

    exact = _expanded(module, query.double(), latents, rope_keys, mask, expand=expand64)
    assert module.kv_b_proj.weight.dtype == torch.bfloat16 and torch.equal(module.kv_b_proj.weight.double(), weight)
    latent = latent_attention.latent_attention(module, query, latents, rope_keys, mask, module.scaling)
    expanded = _expanded(module, query, latents, rope_keys, mask)
    err_latent, err_expanded = ((x.double() - exact).abs().mean().item() for x in (latent, expanded))
    assert latent.dtype == torch.bfloat16 and err_latent < err_expanded


def test_the_probe_keeps_the_expanded_form_where_the_two_disagree():
    """A module whose expansion does something the latent form does not follow (here: keys scaled) is
    caught at its first call: the expanded result is returned, then and after."""
    model = tiny("kimi_linear")
    replayssm.patch(model, buffer_len=4)
    try:
        module = _mla_modules(model)[0]
        original = module.__dict__[latent_attention._ORIGINAL]
        module.__dict__[latent_attention._ORIGINAL] = lambda c, r: (lambda k, v: (2 * k, v))(*original(c, r))
        query, latents, rope_keys, mask = _inputs(module)
        calls = []

        def expanded_attention(key, value):
            calls.append(1)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=module.scaling)
            return out.transpose(1, 2)

        for _ in range(2):
            got = latent_attention.attend(module, query, latents, rope_keys, mask, 0.0, module.scaling, {},
                                          expanded_attention)
            changed = module.__dict__[latent_attention._ORIGINAL]
            want = _expanded(module, query, latents, rope_keys, mask, expand=changed)
            assert torch.equal(got, want)
        assert module.__dict__[latent_attention._VERDICT] is False and len(calls) == 2
        # a multi-token query (a prefill, a verify window) always expands
        module.__dict__.pop(latent_attention._VERDICT)
        long = query.expand(-1, -1, 2, -1)
        assert not latent_attention.serves(module, long, latents, rope_keys, 0.0, {})
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family", MLA_FAMILIES)
def test_patched_generate_attends_on_latents_and_equals_stock(family):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=5, batch=3, length=7)
    kw = dict(max_new_tokens=6, min_new_tokens=6)
    want = generate(model, ids, mask, **kw)
    try:
        replayssm.patch(model, buffer_len=4)
        modules = _mla_modules(model)
        assert modules and all("expand_kv" in m.__dict__ for m in modules)
        calls = []
        for m in modules:
            m.__dict__["expand_kv"] = (lambda f: lambda *a: calls.append(1) or f(*a))(m.__dict__["expand_kv"])
        got = generate(model, ids, mask, **kw)
        assert all(m.__dict__[latent_attention._VERDICT] is True for m in modules)
    finally:
        replayssm.unpatch(model)
    assert not any(latent_attention._ORIGINAL in m.__dict__ or "expand_kv" in m.__dict__ for m in model.modules())
    assert len(calls) == 6 * len(modules)  # the prefill and five decode steps
    assert torch.equal(got.sequences, want.sequences) and max_logit_diff(got, want) < 1e-5


def test_modules_keeping_sdpa_are_not_wrapped():
    """glm5_next keeps ``sdpa`` (its code reads the name): its MLA modules expand as before."""
    model = tiny("glm5_next")
    replayssm.patch(model, buffer_len=4)
    try:
        mla = [m for m in model.modules() if callable(getattr(m, "expand_kv", None))]
        assert mla and not any("expand_kv" in m.__dict__ for m in mla)
    finally:
        replayssm.unpatch(model)
