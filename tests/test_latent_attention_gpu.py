"""The latent MLA decode on CUDA at the Kimi-Linear-like preset's attention sizes (32 heads, r = 512,
rope 64, nope 128, v 128), bf16: no further from an fp64 oracle than the expanded form, in a CUDA graph
as outside one; and a patched Kimi-Linear tiny model's graph decode equals its eager decode."""

import pytest
import torch
import torch.nn.functional as F

import replayssm
from replayssm.patches import latent_attention

from helpers import left_padded_batch, tiny

pytestmark = pytest.mark.gpu


class _Mla(torch.nn.Module):
    """The sizes and ``expand_kv`` of transformers' Kimi-Linear attention (the preset's numbers)."""

    def __init__(self, heads=32, nope=128, rope=64, v=128, rank=512):
        super().__init__()
        self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = heads, nope, rope, v
        self.kv_lora_rank, self.scaling, self.training = rank, (nope + rope) ** -0.5, False
        self.kv_b_proj = torch.nn.Linear(rank, heads * (nope + v), bias=False)

    def expand_kv(self, latents, rope_keys):
        b, _, c, _ = latents.shape
        kv = self.kv_b_proj(latents).view(b, c, -1, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
        k_nope, value = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        return torch.cat([k_nope, rope_keys.expand(-1, k_nope.shape[1], -1, -1)], dim=-1), value


@pytest.mark.parametrize("batch,length", [(1, 4096), (64, 512)])
def test_latent_decode_at_real_sizes(batch, length):
    torch.manual_seed(0)
    module = _Mla().cuda().to(torch.bfloat16)
    q = torch.randn(batch, 32, 1, 192, device="cuda", dtype=torch.bfloat16)
    lat = torch.randn(batch, 1, length, 512, device="cuda", dtype=torch.bfloat16)
    rope = torch.randn(batch, 1, length, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool, device="cuda")
    mask[..., length // 2:] = False  # a half-filled static cache
    args = (module, q, lat, rope, mask, module.scaling)

    def expanded(m, dtype):
        k, v = m.expand_kv(lat.to(dtype), rope.to(dtype))
        return F.scaled_dot_product_attention(q.to(dtype), k, v, attn_mask=mask, scale=m.scaling).transpose(1, 2)

    exact = expanded(_copy64(module), torch.float64)
    latent = latent_attention.latent_attention(*args)
    err_latent = (latent.double() - exact).abs().mean().item()
    err_expanded = (expanded(module, torch.bfloat16).double() - exact).abs().mean().item()
    assert err_latent <= err_expanded
    out = torch.full_like(latent, float("nan"))
    graph = torch.cuda.CUDAGraph()
    latent_attention.latent_attention(*args)  # warm (cuBLAS picks its kernels outside the capture)
    with torch.cuda.graph(graph):
        out.copy_(latent_attention.latent_attention(*args))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, latent)


def _copy64(module):
    twin = _Mla().cuda().double()
    twin.kv_b_proj.weight.data.copy_(module.kv_b_proj.weight.double())
    return twin


def test_kimi_graph_decode_equals_eager_with_latent_attention():
    model = tiny("kimi_linear").cuda()
    ids, mask = left_padded_batch(seed=2, batch=3, length=7, device="cuda")
    kw = dict(attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    try:
        replayssm.patch(model, buffer_len=4)
        eager = model.generate(ids, **kw)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        graphs = model.generate(ids, **kw)
        modules = [m for m in model.modules() if latent_attention.is_latent_attention(m)]
        assert modules and all(m.__dict__.get(latent_attention._VERDICT) is True for m in modules)
    finally:
        replayssm.unpatch(model)
        model.cpu()
    assert torch.equal(eager, graphs)
