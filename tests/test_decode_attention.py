"""The one-token decode attention kernel (Triton interpreter, fp32) and a patched model's use of it.

The kernel is checked against its reference (sdpa on repeated keys and values) and against a naive
float64 softmax written here; outputs are allocated NaN-poisoned, so an unwritten element fails. The
model tests force the kernel on CPU tensors (it serves only CUDA tensors otherwise) and compare a
patched model's logits with the stock model's.
"""

import copy
import io
import math
import os

import pytest
import torch

import replayssm
from replayssm.kernels.attention import (DecodeLaunch, decode_attention, decode_attention_reference,
                                         decode_attention_triton, default_launch, unsupported)
from replayssm.patches import attention_switch, latent_attention
from replayssm.patches import decode_attention as dispatch
from replayssm.tiny import build_tiny_model

from helpers import generate, left_padded_batch, max_logit_diff, tiny

#: the kernel on CPU tensors (conftest switches the interpreter on where CUDA is absent; GPU: the _gpu file)
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs the Triton kernel on CPU tensors: needs TRITON_INTERPRET=1")


@pytest.fixture
def poisoned(monkeypatch):
    """Every floating-point ``torch.empty`` returns NaNs (the kernel's outputs and workspaces)."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)


def naive(query, key, value, mask, scale):
    """float64 softmax(q k^T * scale) v per query head, masked positions left out; no position: zeros."""
    B, Hq, _, Dk = query.shape
    G = Hq // key.shape[1]
    q = query[:, :, 0].double()
    k = key.double().repeat_interleave(G, dim=1)
    v = value.double().repeat_interleave(G, dim=1)
    s = torch.einsum("bhd,bhcd->bhc", q, k) * (Dk ** -0.5 if scale is None else scale)
    keep = torch.ones_like(s, dtype=torch.bool) if mask is None else mask[:, :, 0].expand_as(s)
    s = s.masked_fill(~keep, -math.inf)
    p = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e300))  # a row without positions: all zeros
    p = p.masked_fill(~keep, 0.0)
    denom = p.sum(-1, keepdim=True)
    out = torch.einsum("bhc,bhcd->bhd", p / torch.where(denom > 0, denom, 1.0), v)
    return out[:, None]  # (B, 1, Hq, Dv)


def inputs(B, Hkv, G, C, Dk, Dv, seed=0, transposed=False):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # the layout transformers hands over: (B, T, H, D) projections viewed as (B, H, T, D)
        q = torch.randn(B, 1, Hkv * G, Dk, generator=g).transpose(1, 2)
        k = torch.randn(B, C, Hkv, Dk, generator=g).transpose(1, 2)
        v = torch.randn(B, C, Hkv, Dv, generator=g).transpose(1, 2)
    else:
        q = torch.randn(B, Hkv * G, 1, Dk, generator=g)
        k = torch.randn(B, Hkv, C, Dk, generator=g)
        v = torch.randn(B, Hkv, C, Dv, generator=g)
    return 2 * q, k, v


def masks(B, C, seed=0):
    """None, random holes, left padding (row b padded 5 b positions), a static cache's tail unused,
    one mask shared by the batch, a row with no position at all (last row), and a short prefix whose
    last row keeps the cache's last position too (a kept position after a long unused run)."""
    g = torch.Generator().manual_seed(seed)
    holes = torch.rand(B, 1, 1, C, generator=g) > 0.4
    holes[..., 0] = True
    pos = torch.arange(C)
    left = torch.stack([pos >= min(5 * b, C - 1) for b in range(B)])[:, None, None]
    tail = (pos < C - 3)[None, None, None].expand(B, 1, 1, C)
    empty_row = left.clone()
    empty_row[-1] = False
    prefix = (pos < min(7, C))[None, None, None].repeat(B, 1, 1, 1)
    prefix[-1, ..., -1] = True
    return {"none": None, "holes": holes, "left": left, "tail": tail, "shared": holes[:1], "empty_row": empty_row,
            "prefix": prefix}


CASES = [  # (B, Hkv, G, C, Dk, Dv, block_n, splits)
    (3, 2, 4, 37, 16, 16, 16, 1),
    (2, 1, 2, 40, 32, 32, 16, 3),
    (3, 3, 1, 8, 16, 16, 16, 1),
    (2, 2, 4, 23, 32, 32, 16, 2),
    (2, 2, 1, 29, 24, 16, 16, 2),  # Kimi-like: Dk != Dv, not powers of two
    (2, 1, 2, 1100, 16, 16, 64, 1),  # the mask read in more than one chunk before the tiles
]


@interpreted
@pytest.mark.parametrize("B,Hkv,G,C,Dk,Dv,block_n,splits", CASES)
def test_kernel_matches_reference_and_naive_softmax(B, Hkv, G, C, Dk, Dv, block_n, splits, poisoned):
    q, k, v = inputs(B, Hkv, G, C, Dk, Dv, seed=C, transposed=splits == 2)
    scale = None if G != 2 else 0.3
    for name, mask in masks(B, C, seed=G).items():
        got = decode_attention_triton(q, k, v, mask, scale, launch=DecodeLaunch(block_n=block_n, splits=splits))
        assert got.shape == (B, 1, Hkv * G, Dv) and got.is_contiguous()
        want = naive(q, k, v, mask, scale)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(got, decode_attention_reference(q, k, v, mask, scale), rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")
        if name == "empty_row":  # what sdpa gives for a bool mask without a True: zeros
            assert torch.equal(got[-1], torch.zeros_like(got[-1]))


def test_default_launch_splits_long_caches_of_few_pairs_only():
    cpu = torch.device("cpu")  # 132 multiprocessors assumed off the GPU
    assert default_launch(256, 4, 64, 256, cpu) == DecodeLaunch(block_n=32, splits=1)
    assert default_launch(256, 4, 1024, 256, cpu).splits == 1
    assert default_launch(8, 8, 64, 128, cpu).splits == 1  # one tile: nothing to split
    one = default_launch(1, 4, 1024, 256, cpu)
    assert one.block_n == 32 and one.splits == 16  # 2 tiles per split, 64 programs
    assert default_launch(1, 4, 100, 128, cpu).splits == 1  # 2 tiles
    assert default_launch(1, 4, 300, 128, cpu).splits == 2  # 5 tiles: splits of 3 and 2


def test_refused_inputs_say_why():
    q, k, v = inputs(2, 2, 2, 8, 16, 16)
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    assert unsupported(q, k, v, mask) is None and unsupported(q, k, v, None) is None
    bad = {
        "one query token": (q.expand(2, 4, 2, 16), k, v, mask),
        "a multiple of Hkv": (q[:, :3], k, v, mask),
        "head dims up to 256": (torch.randn(2, 4, 1, 320), torch.randn(2, 2, 8, 320), v, mask),
        "one dtype": (q, k.double(), v, mask),
        "a bool mask": (q, k, v, mask.float()),
        "broadcastable to (B, 1, 1, C)": (q, k, v, mask.expand(2, 4, 1, 8)),
    }
    for reason, args in bad.items():
        assert reason in unsupported(*args), reason
        with pytest.raises(ValueError, match="decode_attention: expected"):
            decode_attention(*args, None, backend="triton")


# ------------------------------------------------------------------ a patched model's attention

def _attention_layers(model):
    return [m for m in model.modules() if hasattr(m, "num_key_value_groups")]


@pytest.fixture
def forced_kernel(monkeypatch):
    """Serve CPU tensors with the kernel (the interpreter runs it); returns the list of its calls' shapes."""
    calls = []
    kernel = dispatch.decode_attention_triton

    def counted(q, k, v, mask, scale):
        calls.append((tuple(q.shape), tuple(k.shape), None if mask is None else tuple(mask.shape)))
        return kernel(q, k, v, mask, scale)

    monkeypatch.setattr(dispatch, "resolve_backend", lambda backend, device: "triton")
    monkeypatch.setattr(dispatch, "decode_attention_triton", counted)
    return calls


@interpreted
@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "kimi_linear"])
def test_patched_generate_runs_the_kernel_and_equals_stock(family, forced_kernel):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=11, batch=3, length=7)
    kw = dict(max_new_tokens=6, min_new_tokens=6)
    want = generate(model, ids, mask, **kw)
    try:
        replayssm.patch(model, buffer_len=4)
        assert model.config._attn_implementation == "sdpa"  # the switch is the attention modules' own
        assert all(m.config._attn_implementation == attention_switch.GROUPED_SDPA for m in _attention_layers(model))
        got = generate(model, ids, mask, **kw)
    finally:
        replayssm.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(got.sequences, want.sequences) and max_logit_diff(got, want) < 1e-5
    # every decode step of every layer, no prefill; multi-head latent attention (Kimi-Linear) attends on
    # its latent cache instead (tests/test_latent_attention.py), after checking that against the kernel
    latent = [m for m in _attention_layers(model) if latent_attention.is_latent_attention(m)]
    assert len(forced_kernel) == 5 * (len(_attention_layers(model)) - len(latent)) + len(latent)
    heads = {m.num_key_value_groups * m.config.num_key_value_heads for m in _attention_layers(model)}
    assert all(q[0] == 3 and q[1] in heads and q[2] == 1 and m == (3, 1, 1, k[2]) for q, k, m in forced_kernel)
    assert (family == "kimi_linear") == bool(latent)


def _configs(model):
    """module name -> the config object the module holds itself."""
    return {name: m.__dict__["config"] for name, m in model.named_modules() if "config" in m.__dict__}


@interpreted
def test_the_switch_is_per_instance_and_leaves_the_config_object_on_sdpa(forced_kernel):
    """The config object says "sdpa" (transformers' test_sdpa_can_dispatch_non_composite_models checks
    it) and a second model built from it runs stock sdpa; the patched model's decode runs the kernel."""
    model = tiny("qwen3_5")
    ids, mask = left_padded_batch(seed=3, batch=2, length=5)
    kw = dict(max_new_tokens=3, min_new_tokens=3)
    try:
        replayssm.patch(model, buffer_len=4)
        other = type(model)(model.config).eval()
        assert other.config is model.config and model.config._attn_implementation == "sdpa"
        assert all(m.config._attn_implementation == "sdpa" for m in other.modules() if hasattr(m, "config"))
        generate(other, ids, mask, **kw)
        assert not forced_kernel
        generate(model, ids, mask, **kw)
        assert len(forced_kernel) == 2 * len(_attention_layers(model))
    finally:
        replayssm.unpatch(model)


def test_an_attention_set_later_takes_effect_and_unpatch_gives_the_config_objects_back():
    from transformers import PreTrainedModel

    model = tiny("qwen3_5")
    before = _configs(model)
    ids, mask = left_padded_batch(seed=4, batch=2, length=5)
    try:
        replayssm.patch(model, buffer_len=4)
        viewed = {n for n, c in _configs(model).items() if c is not before[n]}
        assert {n for n, m in model.named_modules() if m in _attention_layers(model)} <= viewed
        assert not {n for n in viewed if isinstance(model.get_submodule(n), PreTrainedModel)}
        assert all(model.get_submodule(n).config == before[n] for n in viewed)
        with torch.no_grad():
            weights = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
            assert not [w for w in weights or () if w is not None]  # sdpa (ours included) returns none
            model.set_attn_implementation("eager")
            assert all(m.config._attn_implementation == "eager" for m in _attention_layers(model))
            (weights,) = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        assert weights.shape == (2, model.config.num_attention_heads, 5, 5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, model.config.num_attention_heads, 5))
        replayssm.unpatch(model)
        assert all(c is before[n] for n, c in _configs(model).items()) and _configs(model).keys() == before.keys()
    finally:
        replayssm.unpatch(model)
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_switched_model_copies_with_views_of_its_own_configs(how):
    """deepcopy of a patched model; torch.save / torch.load of a model with the attention switch only
    (a patched model's replay mixer classes are made at run time and do not pickle) of a fresh model
    (``output_attentions`` leaves hooks of local functions on a model)."""
    model = tiny("qwen3_5") if how == "deepcopy" else build_tiny_model("tiny:qwen3_5")
    ids, mask = left_padded_batch(seed=5, batch=2, length=5)
    try:
        if how == "deepcopy":
            replayssm.patch(model, buffer_len=4)
            new = copy.deepcopy(model)
        else:
            assert attention_switch.use_grouped_decode_attention(model)
            buffer = io.BytesIO()
            torch.save(model, buffer)
            buffer.seek(0)
            new = torch.load(buffer, weights_only=False)
        attention = _attention_layers(new)
        assert attention and new.config._attn_implementation == "sdpa"
        assert all(m.config._attn_implementation == attention_switch.GROUPED_SDPA for m in attention)
        assert all(attention_switch._viewed(m.config) is new.config for m in attention)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
            assert torch.equal(new(input_ids=ids, attention_mask=mask).logits, want)
        new.set_attn_implementation("eager")  # the copy's views follow the copy's configs, not the model's
        assert all(m.config._attn_implementation == "eager" for m in attention)
        assert all(m.config._attn_implementation == attention_switch.GROUPED_SDPA for m in _attention_layers(model))
        attention_switch.restore_decode_attention(new)
        assert all(m.config is new.config for m in attention)
    finally:
        if how == "deepcopy":
            replayssm.unpatch(model)
        attention_switch.restore_decode_attention(model)
    assert all(m.config is model.config for m in _attention_layers(model))


def test_a_model_whose_code_reads_the_sdpa_name_keeps_sdpa_and_stock_outputs():
    """glm5_next builds its top-k attention mask by the implementation's name (booleans under "sdpa",
    additive floats otherwise): patched, it keeps sdpa and gives stock's logits at every position,
    the padded ones included (renamed, its padded query rows attended to every key)."""
    model = tiny("glm5_next")
    ids, mask = left_padded_batch(seed=11, batch=3, length=9)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        try:
            replayssm.patch(model, buffer_len=4)
            assert all(m.config._attn_implementation == "sdpa" for m in model.modules() if hasattr(m, "config"))
            got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        finally:
            replayssm.unpatch(model)
    assert torch.equal(got, want)
    assert not attention_switch.reads_sdpa_name(tiny("qwen3_5"))  # the other families switch (the test above)


@interpreted
def test_graph_decode_static_cache_runs_the_kernel(forced_kernel, monkeypatch):
    """The CUDA-graph path's static cache (64 positions, most of them masked), with the CPU stand-in
    for graphs of tests/test_graph_decode.py: same tokens and logits as the stock model."""
    from test_graph_decode import ReplayByCall

    from replayssm.patches import graph_decode

    monkeypatch.setattr(graph_decode, "CudaGraph", ReplayByCall)
    monkeypatch.setattr(graph_decode, "cuda_graphs_available", lambda device: True)
    model = tiny("qwen3_5")
    ids, mask = left_padded_batch(seed=12, batch=2, length=6)
    kw = dict(max_new_tokens=5, min_new_tokens=5)
    want = generate(model, ids, mask, **kw)
    try:
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        got = generate(model, ids, mask, **kw)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(got.sequences, want.sequences) and max_logit_diff(got, want) < 1e-5
    assert forced_kernel and all(k[2] == 64 and m == (2, 1, 1, 64) for _, k, m in forced_kernel)


@interpreted
def test_calls_the_kernel_does_not_serve_run_sdpa(forced_kernel):
    """Dropout, a sliding window, a softcap, attention sinks, a float mask, several query tokens: sdpa's result."""
    model = tiny("qwen3_5")
    (attn,) = _attention_layers(model)
    q, k, v = inputs(2, 2, 2, 9, 16, 16)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :4] = False
    served, _ = attention_switch.grouped_sdpa_attention(attn, q, k, v, mask, scaling=0.25, position_ids=torch.zeros(2, 1),
                                             use_cache=True, output_router_logits=False, sliding_window=None,
                                             position_embeddings=(torch.ones(2, 1, 16), torch.zeros(2, 1, 16)))
    assert len(forced_kernel) == 1
    torch.testing.assert_close(served, decode_attention_reference(q, k, v, mask, 0.25), rtol=1e-5, atol=1e-6)
    for extra in (dict(sliding_window=4), dict(softcap=30.0), dict(s_aux=torch.zeros(4))):
        try:
            attention_switch.grouped_sdpa_attention(attn, q, k, v, mask, scaling=0.25, **extra)
        except Exception:
            pass  # sdpa may refuse it itself; the point is that the kernel did not take it
    attention_switch.grouped_sdpa_attention(attn, q, k, v, torch.zeros(2, 1, 1, 9), scaling=0.25)
    attention_switch.grouped_sdpa_attention(attn, torch.cat([q, q], dim=2), k, v, None, scaling=0.25)
    torch.manual_seed(0)
    attention_switch.grouped_sdpa_attention(attn, q, k, v, mask, dropout=0.5, scaling=0.25)
    assert len(forced_kernel) == 1
