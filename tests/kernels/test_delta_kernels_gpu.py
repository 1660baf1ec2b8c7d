"""Delta-rule Triton kernels on the GPU: production shapes, precisions, CUDA graphs, compile.

Run with ``bash scripts/gpu_check.sh`` (or ``pytest -m gpu``) on a CUDA machine.
Tolerances (rtol, atol) follow the upstream ReplaySSM GDN tests: fp32 output 1e-4/1e-4 and
checkpoint 1e-3/2e-3; any bf16/fp16 in play 1e-2/2e-2 for both.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

from delta_helpers import launch_config  # noqa: E402

from replayssm.kernels.delta import (  # noqa: E402
    delta_replay_decode,
    delta_replay_decode_reference,
    delta_replay_materialize,
    delta_step_decode,
    delta_step_decode_reference,
)

DEV = "cuda"
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16

SHAPES = {  # name: (Hk, HV, K, V, kda)
    "qwen35-4b": (16, 32, 128, 128, False),
    "qwen35-122b": (16, 64, 128, 128, False),
    "kimi-kda": (32, 32, 128, 128, True),
    "odd-gdn": (3, 6, 80, 72, False),
    "odd-kda": (4, 4, 72, 48, True),
}
# (checkpoint dtype, activation dtype = ring dtype for u and k)
DTYPES = [(F32, F32), (F32, BF16), (BF16, F32), (BF16, BF16), (F16, F32), (F16, BF16), (F16, F16)]


def _tol(state_dtype, act_dtype):
    if state_dtype == F32 and act_dtype == F32:
        return dict(rtol=1e-4, atol=1e-4), dict(rtol=1e-3, atol=2e-3)
    return dict(rtol=1e-2, atol=2e-2), dict(rtol=1e-2, atol=2e-2)


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _token(gen, Bt, Hk, HV, K, V, kda, act, packed=False):
    q = _l2n(torch.randn(Bt, Hk, K, generator=gen, device=DEV)) * K ** -0.5
    k = _l2n(torch.randn(Bt, Hk, K, generator=gen, device=DEV))
    v = torch.randn(Bt, HV, V, generator=gen, device=DEV)
    g = -torch.exp(torch.randn(*((Bt, HV, K) if kda else (Bt, HV)), generator=gen, device=DEV) - 2.0)
    beta = torch.sigmoid(torch.randn(Bt, HV, generator=gen, device=DEV))
    if packed:  # q, k, v as strided views of one projection output, as a layer hands them over
        qkv = torch.cat([q.reshape(Bt, -1), k.reshape(Bt, -1), v.reshape(Bt, -1)], dim=1).to(act)
        q = qkv[:, : Hk * K].view(Bt, Hk, K)
        k = qkv[:, Hk * K: 2 * Hk * K].view(Bt, Hk, K)
        v = qkv[:, 2 * Hk * K:].view(Bt, HV, V)
        return q, k, v, g, beta
    return q.to(act), k.to(act), v.to(act), g, beta


def _setup(gen, Bt, Hk, HV, K, V, L, kda, state_dtype, act, c0):
    """Checkpoint + rings with c0[b] valid entries per row; unused slots poisoned with NaN."""
    state = (torch.randn(Bt, HV, K, V, generator=gen, device=DEV) * 0.5).to(state_dtype)
    u_buf = torch.full((Bt, HV, L, V), float("nan"), device=DEV, dtype=act)
    k_buf = torch.full((Bt, Hk, L, K), float("nan"), device=DEV, dtype=act)
    g_buf = torch.full((Bt, HV, L, K) if kda else (Bt, HV, L), float("nan"), device=DEV)
    for b, c in enumerate(c0):
        for j in range(max(c, 0)):
            u_buf[b, :, j] = torch.randn(HV, V, generator=gen, device=DEV).to(act)
            k_buf[b, :, j] = _l2n(torch.randn(Hk, K, generator=gen, device=DEV)).to(act)
            g_buf[b, :, j] = -torch.rand(g_buf[b, :, j].shape, generator=gen, device=DEV) * 0.2
            if kda and j > 0:  # KDA's gate ring holds running sums
                g_buf[b, :, j] += g_buf[b, :, j - 1]
    cursor = torch.tensor(c0, dtype=torch.int32, device=DEV)
    return [state, u_buf, k_buf, g_buf, cursor]


def _close(a, b, tol):
    torch.testing.assert_close(a.float(), b.float(), equal_nan=True, **tol)


def _cycle_vs_reference(shape, state_dtype, act, L, seed=0, steps=None, **kw):
    Hk, HV, K, V, kda = SHAPES[shape]
    gen = torch.Generator(device=DEV).manual_seed(seed)
    Bt = 4
    c0 = [0, min(5, L - 1), L - 1, -1]
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, state_dtype, act, c0)
    ref = [t.clone() for t in ker]
    tol_o, tol_s = _tol(state_dtype, act)
    from replayssm.kernels.delta.launch import delta_replay_decode_triton

    cfg = launch_config(K, V, state_dtype, kda, **kw)  # batch 4: say which launches
    for step in range(2 * L + 1 if steps is None else steps):
        x = _token(gen, Bt, Hk, HV, K, V, kda, act, packed=(step % 3 == 2))
        o_k = delta_replay_decode_triton(*x, *ker, config=cfg)
        o_r = delta_replay_decode_reference(*x, *ref)
        assert o_k.dtype == act
        _close(o_k, o_r, tol_o)
        _close(ker[0], ref[0], tol_s)  # checkpoint
        _close(ker[1], ref[1], tol_o)  # u ring
        assert torch.equal(ker[2].nan_to_num(), ref[2].nan_to_num())  # k ring: exact copies
        assert torch.equal(ker[3].nan_to_num(), ref[3].nan_to_num())  # g ring: exact copies
        assert torch.equal(ker[4], ref[4])  # cursors
    assert torch.equal(o_k[3], torch.zeros_like(o_k[3]))  # idle row


@pytest.mark.parametrize("dtypes", DTYPES, ids=[f"s{str(s)[6:]}-a{str(a)[6:]}" for s, a in DTYPES])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_replay_matches_reference_L8(shape, dtypes):
    _cycle_vs_reference(shape, *dtypes, L=8)


@pytest.mark.parametrize("L", [4, 16])
@pytest.mark.parametrize("dtypes", [(F32, F32), (F32, BF16)], ids=["s32-a32", "s32-abf16"])
@pytest.mark.parametrize("shape", ["qwen35-4b", "kimi-kda"])
def test_replay_matches_reference_L(shape, dtypes, L):
    _cycle_vs_reference(shape, *dtypes, L=L)


VARIANTS = {"bv32": dict(block_v=32, num_warps=4), "bv128-w8": dict(block_v=128, num_warps=8),
            "ktiles": dict(block_k=64, flush_block_v=64), "one-launch": dict(one_launch=True),
            "coef-per-key-head": dict(coef_per_key_head=True),
            "coef-per-key-head-ktiles": dict(coef_per_key_head=True, block_k=64, coef_block_k=32),
            "coef-per-value-head": dict(coef_per_key_head=False),
            "coef-per-key-head-write-x": dict(coef_per_key_head=True, coef_write_x=True),
            "flush-tf32x3": dict(flush_bf16_split=False), "flush-bf16-split-bv64": dict(flush_block_v=64),
            "flush-bf16-split": dict(flush_bf16_split=True),
            "coef-windows-3": dict(coef_windows=3), "coef-whole-window": dict(coef_windows=1),
            "flush-head-items": dict(flush_head_items=True), "flush-column-items": dict(flush_head_items=False),
            "flush-head-items-bv32": dict(flush_head_items=True, flush_block_v=32),
            "flush-ktiles": dict(block_k=64, flush_output=False),
            "flush-ktiles-32": dict(block_k=32, flush_output=False),
            "flush-output": dict(flush_output=True), "no-flush-output": dict(flush_output=False),
            "flush-output-column-items": dict(flush_output=True, flush_head_items=False, flush_block_v=64),
            "flush-prefetch": dict(flush_prefetch=True),
            "flush-prefetch-no-output": dict(flush_prefetch=True, flush_output=False),
            "dependent-launch": dict(dependent_launch=True), "no-dependent-launch": dict(dependent_launch=False),
            "no-dependent-launch-no-flush-output": dict(dependent_launch=False, flush_output=False),
            "keys-scaled-in-output": dict(coef_per_key_head=True, coef_write_x=False),
            "coef-windows-2": dict(coef_windows=2)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtypes", [(F32, F32), (BF16, BF16)], ids=["s32-a32", "sbf16-abf16"])
@pytest.mark.parametrize("shape", ["qwen35-122b", "kimi-kda", "odd-gdn"])
def test_replay_variants_match_reference(shape, dtypes, variant):
    """The non-default kernel variants (the L8 suite runs the defaults)."""
    _cycle_vs_reference(shape, *dtypes, L=16, **VARIANTS[variant])


@pytest.mark.parametrize("head_items", [True, False], ids=["head-items", "column-items"])
@pytest.mark.parametrize("split", [True, False], ids=["bf16-split", "tf32x3"])
@pytest.mark.parametrize("shape", ["qwen35-4b", "odd-gdn", "kimi-kda", "odd-kda"])
def test_flush_product_exact_with_bf16_rings(shape, split, head_items):
    """fp32 checkpoint, bf16 rings, every row flushing: the new checkpoint is within 1e-6 (of
    its largest entry) of a float64 evaluation of the same checkpoint and ring values. On the
    H200 (2026-12-01, Gated DeltaNet) the three-term bf16 split was 4e-7 off and tf32x3 2e-7,
    while a single tf32 product was 4e-4 off and a two-term bf16 split 2e-6. KDA splits its
    per-channel weighted keys instead of the u's."""
    from replayssm.kernels.delta.launch import delta_replay_decode_triton

    Hk, HV, K, V, kda = SHAPES[shape]
    L, Bt, grp = 16, 4, HV // Hk
    gen = torch.Generator(device=DEV).manual_seed(4)
    state, u_buf, k_buf, g_buf, cursor = _setup(gen, Bt, Hk, HV, K, V, L, kda, F32, BF16, [L - 1] * Bt)
    q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, kda, BF16)
    # float64 oracle: A = exp(G_c) S0 + sum_j exp(G_c - G_j) k_j u_j^T; S_c = A + k_c u_c^T
    s0 = state.double()
    kr = k_buf.double().repeat_interleave(grp, 1)[:, :, : L - 1]  # (Bt, HV, L-1, K)
    ur, gr = u_buf.double()[:, :, : L - 1], g_buf.double()[:, :, : L - 1]
    gcum = gr if kda else gr.cumsum(2)  # KDA's ring holds the running sums G_j, GDN's the g_j
    gc = gcum[:, :, -1] + g.double()  # (Bt, HV) or, KDA, (Bt, HV, K)
    w = torch.exp(gc[:, :, None] - gcum)
    if kda:
        a = torch.exp(gc)[..., None] * s0 + torch.einsum("bhjk,bhjk,bhjv->bhkv", kr, w, ur)
    else:
        a = torch.exp(gc)[..., None, None] * s0 + torch.einsum("bhjk,bhj,bhjv->bhkv", kr, w, ur)
    kc = k.double().repeat_interleave(grp, 1)
    uc = beta.double()[..., None] * (v.double() - torch.einsum("bhkv,bhk->bhv", a, kc))
    new = a + kc[..., None] * uc[..., None, :]
    delta_replay_decode_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor,
                               config=launch_config(K, V, F32, kda, flush_bf16_split=split,
                                                    flush_head_items=head_items))
    err = ((state.double() - new).abs().max() / new.abs().max()).item()
    assert err < 1e-6, err
    assert torch.equal(cursor, torch.zeros_like(cursor))


@pytest.mark.parametrize("knobs", [dict(), dict(block_k=32), None],
                         ids=["separate-launches", "ktiles", "default-one-launch"])
@pytest.mark.parametrize("shape", ["qwen35-4b", "kimi-kda"])
def test_fp32_replay_equals_exact_recurrence(shape, knobs):
    """fp32 everywhere: the replay kernel tracks the ordinary recurrence to ~1e-5."""
    from replayssm.kernels.delta.launch import delta_replay_decode_triton

    Hk, HV, K, V, kda = SHAPES[shape]
    cfg = None if knobs is None else launch_config(K, V, F32, kda, **knobs)
    L, Bt = 16, 4
    gen = torch.Generator(device=DEV).manual_seed(1)
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, F32, F32, [0] * Bt)
    exact = ker[0].clone()
    worst_o = worst_s = 0.0
    for step in range(2 * L + 1):
        x = _token(gen, Bt, Hk, HV, K, V, kda, F32)
        o_k = delta_replay_decode_triton(*x, *ker, config=cfg)
        o_e = delta_step_decode_reference(*x, exact)
        worst_o = max(worst_o, ((o_k - o_e).norm() / o_e.norm()).item())
        if step % L == L - 1:
            worst_s = max(worst_s, ((ker[0] - exact).norm() / exact.norm()).item())
    s = delta_replay_materialize(*ker)
    worst_s = max(worst_s, ((s - exact).norm() / exact.norm()).item())
    assert worst_o < 2e-5 and worst_s < 2e-5, (worst_o, worst_s)


def test_perturbation_fails_fp32_tolerance():
    """The fp32 tolerance has teeth: a 1e-2 change to one cached u must be caught."""
    Hk, HV, K, V, kda = SHAPES["qwen35-4b"]
    L, Bt = 8, 2
    gen = torch.Generator(device=DEV).manual_seed(2)
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, F32, F32, [5, 5])
    ref = [t.clone() for t in ker]
    ker[1][0, 3, 2] += 1e-2 * ker[1][0, 3, 2].abs().max()
    x = _token(gen, Bt, Hk, HV, K, V, kda, F32)
    o_k = delta_replay_decode(*x, *ker, backend="triton")
    o_r = delta_replay_decode_reference(*x, *ref)
    tol_o, _ = _tol(F32, F32)
    _close(o_k[1], o_r[1], tol_o)
    with pytest.raises(AssertionError):
        _close(o_k, o_r, tol_o)
    with pytest.raises(AssertionError):
        _close(o_r * (1 + 1e-2), o_r, tol_o)


@pytest.mark.parametrize("dtypes", [(F32, F32), (BF16, BF16), (F16, F32)], ids=["s32-a32", "sbf16-abf16", "s16-a32"])
@pytest.mark.parametrize("shape", ["qwen35-122b", "kimi-kda", "odd-gdn"])
def test_step_kernel_matches_reference(shape, dtypes):
    state_dtype, act = dtypes
    Hk, HV, K, V, kda = SHAPES[shape]
    Bt = 3
    gen = torch.Generator(device=DEV).manual_seed(3)
    state = (torch.randn(Bt, HV, K, V, generator=gen, device=DEV) * 0.5).to(state_dtype)
    ref = state.clone()
    tol_o, tol_s = _tol(state_dtype, act)
    for step in range(4):
        x = _token(gen, Bt, Hk, HV, K, V, kda, act, packed=(step == 1))
        _close(delta_step_decode(*x, state, backend="triton"), delta_step_decode_reference(*x, ref), tol_o)
        _close(state, ref, tol_s)


@pytest.mark.parametrize(("Bt", "launches"),
                         [(4, "defaults"), (6, "defaults"), (6, "dependent"), (6, "flush-dependent")],
                         ids=["one-launch", "separate-launches", "separate-launches-dependent",
                              "separate-launches-flush-dependent"])
@pytest.mark.parametrize("shape", ["qwen35-4b", "kimi-kda"])
def test_cuda_graph_replay_equals_eager(shape, Bt, launches, monkeypatch):
    """Capture one whole L-step cycle (flushes included) and replay it twice (batch 4 runs
    the one-launch kernel, batch 6 the separate launches; ``dependent``: the output launch a
    programmatic dependent of the coefficient launch, ``flush-dependent``: the flush launch one
    of the output launch, whatever the defaults say)."""
    if launches != "defaults":
        import dataclasses

        import replayssm.kernels.delta.launch as launch

        base = launch.default_config
        monkeypatch.setattr(launch, "default_config", lambda *a: dataclasses.replace(
            base(*a), dependent_launch=launches == "dependent"))
    Hk, HV, K, V, kda = SHAPES[shape]
    L = 4
    gen = torch.Generator(device=DEV).manual_seed(4)
    bufs = _setup(gen, Bt, Hk, HV, K, V, L, kda, F32, BF16, [0, 1, 3, -1, 2, 3][:Bt])
    eager = [t.clone() for t in bufs]
    toks = [_token(gen, Bt, Hk, HV, K, V, kda, BF16) for _ in range(L)]
    outs = [torch.empty(Bt, HV, V, device=DEV, dtype=BF16) for _ in range(L)]
    st_state = torch.randn(Bt, HV, K, V, device=DEV, generator=gen)
    st_eager = st_state.clone()
    # Warm up (compiles) on scratch copies, then capture on the real buffers.
    scratch = [t.clone() for t in bufs]
    delta_replay_decode(*toks[0], *scratch, outs[0], backend="triton")
    delta_step_decode(*toks[0], st_state.clone(), backend="triton")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_outs = []
        for i in range(L):
            delta_replay_decode(*toks[i], *bufs, outs[i], backend="triton")
            step_outs.append(delta_step_decode(*toks[i], st_state, backend="triton"))
    for _ in range(2):
        graph.replay()
        for i in range(L):
            o_e = delta_replay_decode(*toks[i], *eager, backend="triton")
            s_e = delta_step_decode(*toks[i], st_eager, backend="triton")
            torch.cuda.synchronize()
            act = [r for r in range(Bt) if r != 3]  # row 3 is idle
            assert torch.equal(outs[i][act], o_e[act])
            assert torch.equal(step_outs[i], s_e)
        for a, b in zip(bufs, eager):
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
        assert torch.equal(st_state, st_eager)


@pytest.mark.parametrize("Bt", [3, 5], ids=["one-launch", "separate-launches"])
@pytest.mark.parametrize("shape", ["qwen35-4b", "kimi-kda"])
def test_torch_compile_fullgraph(shape, Bt):
    Hk, HV, K, V, kda = SHAPES[shape]
    L = 4
    gen = torch.Generator(device=DEV).manual_seed(5)
    comp = _setup(gen, Bt, Hk, HV, K, V, L, kda, F32, BF16, [0, 2, -1, 1, 3][:Bt])
    eager = [t.clone() for t in comp]
    st_c = torch.randn(Bt, HV, K, V, device=DEV, generator=gen)
    st_e = st_c.clone()

    def layer(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, step_state):
        o = delta_replay_decode(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, backend="triton")
        o2 = delta_step_decode(q, k, v, g, beta, step_state, backend="triton")
        return o.float() + 1.0, o2

    compiled = torch.compile(layer, fullgraph=True)
    for _ in range(2 * L + 1):
        x = _token(gen, Bt, Hk, HV, K, V, kda, BF16)
        oc, o2c = compiled(*x, *comp, st_c)
        oe, o2e = layer(*x, *eager, st_e)
        assert torch.equal(oc, oe) and torch.equal(o2c, o2e)
        for a, b in zip(comp, eager):
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
        assert torch.equal(st_c, st_e)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("Bt,H,K", [(1, 16, 128), (256, 32, 128), (7, 3, 80)])
def test_l2norm_qk_kernel_gpu(Bt, H, K, dtype):
    """The fused q/k L2 normalisation on the GPU against the PyTorch reference (packed, strided inputs)."""
    from replayssm.kernels.delta import l2norm_qk, l2norm_qk_reference

    gen = torch.Generator(device=DEV).manual_seed(K)
    qk = (torch.randn(Bt, 2 * H * K + 3, generator=gen, device=DEV) * 3).to(dtype)
    q = qk[:, : H * K].view(Bt, H, K)
    k = qk[:, H * K: 2 * H * K].view(Bt, H, K)
    q_n, k_n = l2norm_qk(q, k, K ** -0.5, backend="triton")
    q_r, k_r = l2norm_qk_reference(q, k, K ** -0.5)
    torch.testing.assert_close(q_n, q_r, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(k_n, k_r, atol=2e-6, rtol=2e-6)
