"""Delta-rule Triton kernels against the PyTorch references on tiny fp32 shapes.

Without CUDA, tests/conftest.py sets TRITON_INTERPRET=1 and the kernels run through the
Triton interpreter on CPU tensors (the same kernel source as on the GPU).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from replayssm.kernels.delta import (  # noqa: E402
    delta_replay_decode,
    delta_replay_decode_reference,
    delta_step_decode,
    delta_step_decode_reference,
)
from replayssm.kernels.delta.launch import delta_replay_decode_triton, delta_step_decode_triton  # noqa: E402
from delta_helpers import launch_config  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _token(gen, Bt, Hk, HV, K, V, kda, packed=False):
    """(q, k, v, g, beta); with ``packed`` q, k, v are strided views of one qkv tensor."""
    q = _l2n(torch.randn(Bt, Hk, K, generator=gen)) * K ** -0.5
    k = _l2n(torch.randn(Bt, Hk, K, generator=gen))
    v = torch.randn(Bt, HV, V, generator=gen)
    g = -torch.exp(torch.randn(*((Bt, HV, K) if kda else (Bt, HV)), generator=gen) - 1.5)
    beta = torch.sigmoid(torch.randn(Bt, HV, generator=gen))
    if packed:
        qkv = torch.cat([q.reshape(Bt, -1), k.reshape(Bt, -1), v.reshape(Bt, -1)], dim=1).to(DEV)
        q = qkv[:, : Hk * K].view(Bt, Hk, K)
        k = qkv[:, Hk * K: 2 * Hk * K].view(Bt, Hk, K)
        v = qkv[:, 2 * Hk * K:].view(Bt, HV, V)
        return q, k, v, g.to(DEV), beta.to(DEV)
    return tuple(t.to(DEV) for t in (q, k, v, g, beta))


def _setup(gen, Bt, Hk, HV, K, V, L, kda, c0):
    """Checkpoint plus rings holding c0[b] valid random entries per row (NaN elsewhere)."""
    state = torch.randn(Bt, HV, K, V, generator=gen)
    u_buf = torch.full((Bt, HV, L, V), float("nan"))
    k_buf = torch.full((Bt, Hk, L, K), float("nan"))
    g_buf = torch.full((Bt, HV, L, K) if kda else (Bt, HV, L), float("nan"))
    for b, c in enumerate(c0):
        for j in range(max(c, 0)):
            u_buf[b, :, j] = torch.randn(HV, V, generator=gen)
            k_buf[b, :, j] = _l2n(torch.randn(Hk, K, generator=gen))
            g_buf[b, :, j] = -torch.rand(g_buf[b, :, j].shape, generator=gen) * 0.3
            if kda and j > 0:  # KDA's gate ring holds running sums
                g_buf[b, :, j] += g_buf[b, :, j - 1]
    cursor = torch.tensor(c0, dtype=torch.int32)
    return [t.to(DEV) for t in (state, u_buf, k_buf, g_buf, cursor)]


def _same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, **TOL)


CASES = [
    # (name, Hk, HV, K, V, L, kda, knobs laid over the separate launches' defaults; "programs": flush
    # programs in all)
    ("gdn-gva-L4", 2, 4, 20, 24, 4, False, {}),
    ("gdn-gva-L4-2vblocks", 2, 4, 20, 24, 4, False, dict(block_v=16, flush_block_v=16)),
    ("gdn-gva-L4-flush-wide", 2, 4, 20, 24, 4, False, dict(flush_block_v=32, num_warps=2)),
    ("gdn-L3-ktiles", 1, 2, 40, 24, 3, False, dict(block_k=16)),
    ("gdn-L1", 2, 4, 20, 24, 1, False, {}),
    ("gdn-L3-bv64", 1, 2, 20, 72, 3, False, dict(block_v=64)),
    ("kda-L4", 2, 2, 20, 24, 4, True, {}),
    ("kda-L4-flush-narrow", 2, 2, 20, 24, 4, True, dict(flush_block_v=16)),
    ("kda-L4-2vblocks", 2, 2, 20, 24, 4, True, dict(block_v=16)),
    ("kda-L3-ktiles", 2, 2, 40, 24, 3, True, dict(block_k=16)),
    ("gdn-L4-one-flush-program", 2, 4, 20, 24, 4, False, dict(programs=1, flush_block_v=16)),
    ("gdn-gva-L4-one-launch", 2, 4, 20, 24, 4, False, dict(one_launch=True)),
    ("gdn-L1-one-launch", 2, 4, 20, 24, 1, False, dict(one_launch=True)),
    ("kda-L4-one-launch-2vblocks", 2, 2, 20, 24, 4, True, dict(one_launch=True, block_v=16)),
    ("kda-L3-two-flush-programs", 2, 2, 20, 24, 3, True, dict(programs=2)),
    ("gdn-gva-L4-coef-per-key-head-2vblocks", 2, 4, 20, 24, 4, False, dict(coef_per_key_head=True, block_v=16)),
    ("gdn-L1-coef-per-key-head", 2, 4, 20, 24, 1, False, dict(coef_per_key_head=True)),
    ("gdn-L3-coef-per-key-head-ktiles", 1, 2, 40, 24, 3, False, dict(coef_per_key_head=True, block_k=16,
                                                                      coef_block_k=16)),
    ("gdn-gva-L4-coef-per-value-head", 2, 4, 20, 24, 4, False, dict(coef_per_key_head=False)),
    ("gdn-gva-L4-coef-per-key-head-write-x", 2, 4, 20, 24, 4, False, dict(coef_per_key_head=True, coef_write_x=True)),
    # the bf16 split flush products never run under the interpreter (its bf16 tl.dot is not trusted): asking for
    # them there runs the fp32 product
    ("gdn-gva-L4-flush-bf16-split-asked", 2, 4, 20, 24, 4, False, dict(flush_bf16_split=True)),
    ("kda-L4-flush-bf16-split-asked", 2, 2, 20, 24, 4, True, dict(flush_bf16_split=True)),
    # coefficient windows picked by cursor: L=12 (window 16) runs the half (c <= 8) and the whole window, and with
    # three windows (the KDA default) the quarter (c <= 4) too
    ("kda-L12-coef-windows-2", 2, 2, 20, 24, 12, True, dict(coef_windows=2)),
    ("kda-L12-coef-windows-3-ktiles", 2, 2, 40, 24, 12, True, dict(coef_windows=3, coef_block_k=16)),
    # flush items of whole value heads: one program walks the head's column blocks (2 or 3 here)
    ("gdn-gva-L4-flush-head-items-2vblocks", 2, 4, 20, 24, 4, False, dict(flush_head_items=True, flush_block_v=16)),
    ("kda-L4-flush-head-items-2vblocks", 2, 2, 20, 24, 4, True, dict(flush_head_items=True, flush_block_v=16)),
    ("kda-L3-flush-head-items-ktiles-3vblocks", 2, 2, 40, 40, 3, True, dict(flush_head_items=True, block_k=16,
                                                                            flush_block_v=16, programs=3)),
    ("gdn-L3-flush-head-items-ktiles", 1, 2, 40, 24, 3, False, dict(flush_head_items=True, block_k=16,
                                                                     flush_block_v=16)),
    # flush key tiles (without flush_output: with it the flush launch takes the whole key dim in one tile),
    # with both kinds of work items
    ("kda-L3-flush-ktiles-head-items", 2, 2, 40, 24, 3, True, dict(block_k=16, flush_block_v=16,
                                                                    flush_output=False)),
    ("gdn-L3-flush-ktiles", 1, 2, 40, 24, 3, False, dict(block_k=16, flush_head_items=False, flush_output=False)),
    # the flush launch computing the flush rows' output (flush_output), or the output launch doing it
    ("gdn-gva-L4-no-flush-output", 2, 4, 20, 24, 4, False, dict(flush_output=False)),
    ("kda-L4-no-flush-output-2vblocks", 2, 2, 20, 24, 4, True, dict(flush_output=False, flush_block_v=16)),
    ("kda-L4-no-flush-output-two-flush-programs", 2, 2, 20, 24, 4, True, dict(flush_output=False, programs=2)),
    ("gdn-gva-L4-flush-output-column-items", 2, 4, 20, 24, 4, False, dict(flush_output=True, flush_block_v=16,
                                                                           flush_head_items=False)),
    ("kda-L1-flush-output-3vblocks", 2, 2, 20, 40, 1, True, dict(flush_output=True, flush_block_v=16,
                                                                  block_k=16)),
    ("gdn-L1-flush-output-coef-per-value-head", 2, 4, 20, 24, 1, False, dict(coef_per_key_head=False)),
    # neither the x scratch nor the u_c scratch in use: the scratch holds the coefficients only
    ("gdn-gva-L4-keys-scaled-in-output-flush-output", 2, 4, 20, 24, 4, False, dict(coef_per_key_head=True,
                                                                                    coef_write_x=False,
                                                                                    flush_output=True)),
    # the flush launch loading each column block's checkpoint tile one block ahead (flush_prefetch)
    ("gdn-gva-L4-flush-prefetch-2vblocks", 2, 4, 20, 24, 4, False, dict(flush_prefetch=True, flush_block_v=16)),
    ("kda-L3-flush-prefetch-ktiles-3vblocks", 2, 2, 40, 40, 3, True, dict(flush_prefetch=True, flush_output=False,
                                                                          block_k=16, flush_block_v=16)),
    # dependent launches need a CUDA device: asked for under the interpreter, the launches run one after another
    ("kda-L4-dependent-launch-asked", 2, 2, 20, 24, 4, True, dict(dependent_launch=True)),
    ("kda-L12-coef-windows-3", 2, 2, 20, 24, 12, True, dict(coef_windows=3)),
    ("kda-L12-coef-windows-1", 2, 2, 20, 24, 12, True, dict(coef_windows=1)),
]


@pytest.mark.parametrize("knobs, message", [
    (dict(coef_windows=4), "coef_windows must be 1, 2 or 3"),
    (dict(block_v=24), "block_v must be a power of two"),
    (dict(block_k=512), "block_k must be at most 256"),
    (dict(flush_programs=0), "flush_programs and flush_stages must be positive"),
])
def test_bad_launch_config(knobs, message):
    """Bad knobs are refused when the configuration is made, before anything is launched."""
    with pytest.raises(ValueError, match=message):
        launch_config(16, 16, torch.float32, True, **knobs)


def test_no_dependent_launch_off_the_gpu():
    """Programmatic dependent launch needs a CUDA device: the interpreter never asks for it
    (the knob is then ignored, as the interpreter cases with it show)."""
    from replayssm.kernels.backend import dependent_launch_supported

    assert not dependent_launch_supported("cpu")


def test_flush_rows_split_over_several_launches(monkeypatch):
    """More rows than one persistent flush launch holds: the rows go in several launches."""
    import replayssm.kernels.persistent as persistent

    monkeypatch.setattr(persistent, "FLUSH_ROWS", 2)
    test_replay_kernel_matches_reference(("gdn-L3-chunked", 1, 2, 16, 16, 3, False, dict(programs=1)), monkeypatch)
    test_replay_kernel_matches_reference(("kda-L3-chunked", 1, 2, 16, 16, 3, True, dict(programs=1)), monkeypatch)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_replay_kernel_matches_reference(case, monkeypatch):
    _, Hk, HV, K, V, L, kda, kw = case
    kw = dict(kw)
    if "programs" in kw:  # flush programs in all: one per multiprocessor, that many multiprocessors
        import replayssm.kernels.delta.launch as launch

        programs = kw.pop("programs")
        monkeypatch.setattr(launch, "num_sms", lambda *a: programs)
        kw["flush_programs"] = 1
    cfg = launch_config(K, V, torch.float32, kda, **kw)
    gen = torch.Generator().manual_seed(7)
    Bt = 4
    c0 = [0, min(2, L - 1), -1, L - 1]  # desynchronised, one idle row, one flushing at once
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, c0)
    ref = [t.clone() for t in ker]
    out_k = torch.full((Bt, HV, V), 3.0, device=DEV)
    out_r = out_k.clone()
    for step in range(2 * L + 1):
        x = _token(gen, Bt, Hk, HV, K, V, kda, packed=(step % 2 == 1))
        o_k = delta_replay_decode_triton(*x, *ker, out_k, config=cfg)
        o_r = delta_replay_decode_reference(*x, *ref, out_r)
        assert o_k is out_k
        _same(o_k, o_r)
        for a, b in zip(ker, ref):
            if a.dtype == torch.int32:
                assert torch.equal(a, b)
            else:
                _same(a, b)
    assert torch.all(out_k[2] == 3.0)  # the idle row's output was never written


@pytest.mark.parametrize("kda, advance", [(False, "kernel"), (True, "kernel"), (True, "cursor-first"),
                                         (True, "cursor"), (False, "cursor-first")],
                         ids=["gdn-kernel", "kda-kernel", "kda-cursor-first", "kda-cursor", "gdn-first"])
def test_one_launch_cursor_advance_variants(kda, advance, monkeypatch):
    """The one-launch kernel moves the cursors on inside its launch, arrivals counted on the cursor
    word (2 value blocks x 4 heads = 8 programs per row) and read by the arrival itself
    (``"cursor-first"``, here at batch 4, whose default is ``"cursor"``: the one-launch CASES and
    the rollback test at batch 2 run the defaults), or, where the cursor word cannot carry the
    count (buffers longer than 127, here pretended), with a second launch (``"kernel"``): outputs,
    rings, checkpoints and cursors equal the reference's over 2L + 1 steps; the idle row keeps its
    -1 and its output is never written."""
    import replayssm.kernels.delta.launch as launch

    if advance == "kernel":
        monkeypatch.setattr(launch, "cursor_word_counts_arrivals", lambda cursor, L: False)
    gen = torch.Generator().manual_seed(12)
    Bt, Hk, HV, K, V, L = 4, 2, 4, 20, 24, 4
    cfg = launch_config(K, V, torch.float32, kda, one_launch=True, block_v=16,
                        arrive_first=advance == "cursor-first")
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, [0, 2, -1, 3])
    ref = [t.clone() for t in ker]
    out_k = torch.full((Bt, HV, V), 3.0, device=DEV)
    out_r = out_k.clone()
    for _ in range(2 * L + 1):
        x = _token(gen, Bt, Hk, HV, K, V, kda)
        delta_replay_decode_triton(*x, *ker, out_k, config=cfg)
        _same(out_k, delta_replay_decode_reference(*x, *ref, out_r))
        for a, b in zip(ker, ref):
            if a.dtype == torch.int32:
                assert torch.equal(a, b)
            else:
                _same(a, b)
    assert ker[-1][2].item() == -1 and torch.all(out_k[2] == 3.0)


@pytest.mark.parametrize("one_launch", [False, True], ids=["separate-launches", "one-launch"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_rollback_matches_reference(kda, one_launch):
    """A speculative-decoding rollback (cursors moved back by 2 and 3 after 4 verified drafted
    tokens) followed by more steps, a flush among them: the kernels stay equal to the reference
    (whose rollback test compares with the exact recurrence over the accepted tokens)."""
    gen = torch.Generator().manual_seed(8)
    Bt, Hk, HV, K, V, L = 2, 2, 2, 20, 24, 8
    cfg = None if one_launch else launch_config(K, V, torch.float32, kda)  # batch 2: one launch by default
    ker = _setup(gen, Bt, Hk, HV, K, V, L, kda, [3, 2])
    ref = [t.clone() for t in ker]
    for step in range(4 + 2 * L):
        if step == 4:
            for bufs in (ker, ref):
                bufs[-1] -= torch.tensor([2, 3], dtype=torch.int32, device=DEV)
        x = _token(gen, Bt, Hk, HV, K, V, kda)
        _same(delta_replay_decode_triton(*x, *ker, config=cfg), delta_replay_decode_reference(*x, *ref))
        for a, b in zip(ker, ref):
            if a.dtype == torch.int32:
                assert torch.equal(a, b)
            else:
                _same(a, b)


def test_small_batches_default_to_one_launch(monkeypatch):
    """Batches up to SMALL_BATCH_MAX rows run the one-launch kernel unless the configuration says
    otherwise, with its own defaults (32 value columns, the atomic reading the cursor up to batch 2)."""
    import dataclasses

    import replayssm.kernels.delta.launch as launch
    from replayssm.kernels.delta.config import SMALL_BATCH_MAX, default_config

    calls = []  # (batch, block_v, arrive_first) of each one-launch step
    real = launch._launch_one

    def recording(t, io, lay, Bt, cfg, kda, write_idle, *quant):
        calls.append((Bt, cfg.block_v, cfg.arrive_first))
        return real(t, io, lay, Bt, cfg, kda, write_idle, *quant)

    monkeypatch.setattr(launch, "_launch_one", recording)
    gen = torch.Generator().manual_seed(10)
    small = default_config(1, 16, 24, torch.float32, False)
    for Bt, cfg, expect in ((SMALL_BATCH_MAX, None, (SMALL_BATCH_MAX, 32, False)), (2, None, (2, 32, True)),
                            (SMALL_BATCH_MAX + 1, None, None),
                            (1, launch_config(16, 24, torch.float32, False), None),
                            (SMALL_BATCH_MAX + 1, dataclasses.replace(small, block_v=16), (SMALL_BATCH_MAX + 1, 16, True))):
        ker = _setup(gen, Bt, 1, 2, 16, 24, 2, False, [0] * Bt)
        ref = [t.clone() for t in ker]
        x = _token(gen, Bt, 1, 2, 16, 24, False)
        n = len(calls)
        _same(delta_replay_decode_triton(*x, *ker, config=cfg), delta_replay_decode(*x, *ref, backend="torch"))
        assert (calls[n] if len(calls) > n else None) == expect, (Bt, cfg)


@pytest.mark.parametrize("one_launch", [False, True], ids=["separate-launches", "one-launch"])
def test_replay_kernel_out_none_zeroes_idle_rows(one_launch):
    gen = torch.Generator().manual_seed(8)
    Bt, Hk, HV, K, V, L = 2, 1, 2, 16, 16, 2
    ker = _setup(gen, Bt, Hk, HV, K, V, L, False, [1, -1])
    ref = [t.clone() for t in ker]
    x = _token(gen, Bt, Hk, HV, K, V, False)
    o_k = delta_replay_decode_triton(*x, *ker, config=None if one_launch else launch_config(K, V, torch.float32, False))
    o_r = delta_replay_decode(*x, *ref, backend="torch")
    _same(o_k, o_r)
    assert torch.equal(o_k[1], torch.zeros_like(o_k[1]))


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_step_kernel_matches_reference(kda):
    gen = torch.Generator().manual_seed(9)
    Bt, Hk, HV, K, V = 3, 2, 4 if not kda else 2, 20, 24
    state = torch.randn(Bt, HV, K, V, generator=gen).to(DEV)
    ref = state.clone()
    for step in range(3):
        x = _token(gen, Bt, Hk, HV, K, V, kda, packed=(step == 1))
        o_k = delta_step_decode_triton(*x, state)
        o_r = delta_step_decode_reference(*x, ref)
        _same(o_k, o_r)
        _same(state, ref)
    o = delta_step_decode(*x, state, backend="triton")
    assert o.shape == (Bt, HV, V)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("Bt,H,K", [(2, 3, 16), (3, 2, 10), (1, 4, 72)])
def test_l2norm_qk_kernel_matches_reference_and_oracle(Bt, H, K, dtype):
    """One launch normalises q (times its scale) and k: strided inputs of any float dtype, fp32
    outputs equal to the reference and to torch's own normalize (an independent oracle)."""
    from replayssm.kernels.delta import l2norm_qk, l2norm_qk_reference
    from replayssm.kernels.delta.norm import l2norm_qk_triton

    gen = torch.Generator().manual_seed(Bt * 100 + K)
    qk = (torch.randn(Bt, 2 * H * K + 5, generator=gen) * 3).to(dtype).to(DEV)  # packed, row stride 2HK+5
    q = qk[:, : H * K].view(Bt, H, K)
    k = qk[:, H * K: 2 * H * K].view(Bt, H, K)
    before = qk.clone()
    scale = K ** -0.5
    q_n, k_n = l2norm_qk_triton(q, k, scale)
    assert q_n.dtype == k_n.dtype == torch.float32 and q_n.shape == k_n.shape == (Bt, H, K)
    q_r, k_r = l2norm_qk_reference(q, k, scale)
    torch.testing.assert_close(q_n, q_r, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_n, k_r, atol=1e-6, rtol=1e-6)
    oracle = torch.nn.functional.normalize(k.float(), dim=-1)
    torch.testing.assert_close(k_n, oracle, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q_n, torch.nn.functional.normalize(q.float(), dim=-1) * scale, atol=1e-5, rtol=1e-5)
    q_d, k_d = l2norm_qk(q, k, scale, backend="triton")  # the dispatcher takes the same kernel
    assert torch.equal(q_d, q_n) and torch.equal(k_d, k_n)
    assert torch.equal(qk, before)  # the inputs are only read
    with pytest.raises(ValueError, match="q and k must both be"):
        l2norm_qk_triton(q, k[:, :1], scale)


def test_8bit_checkpoint_launch_rules():
    """Gated DeltaNet with an 8-bit checkpoint at serving batches: 64-column output programs and
    32-column flush items on 8 programs per SM; KDA int8: 64-column output programs; e4m3 from
    batch 256: 128-column output programs over 32-key tiles (both); the 16-bit rules stay as they were."""
    from replayssm.kernels.delta.config import default_config

    for dtype in (torch.int8, torch.float8_e4m3fn):
        c = default_config(128, 128, 128, dtype, False)
        assert (c.block_v, c.num_warps, c.flush_block_v, c.flush_programs, c.flush_output) == (64, 1, 32, 8, False)
        assert c.block_k == 128
    c = default_config(256, 128, 128, torch.int8, False)
    assert (c.block_v, c.block_k, c.num_warps, c.flush_block_v, c.flush_programs) == (64, 128, 1, 32, 8)
    c = default_config(256, 128, 128, torch.bfloat16, False)
    assert (c.block_v, c.flush_block_v, c.flush_programs) == (32, 128, 2)
    # KDA: 64-column output programs for int8 only (e4m3 below batch 256 and 16-bit keep 32)
    assert default_config(256, 128, 128, torch.int8, True).block_v == 64
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        assert default_config(128, 128, 128, dtype, True).block_v == 32
    for kda in (False, True):
        c = default_config(256, 128, 128, torch.float8_e4m3fn, kda)
        assert (c.block_v, c.block_k, c.num_warps) == (128, 32, 1)


def test_verify_launch_rule():
    """The verify step runs Gated DeltaNet on one warp (16 value columns below batch 32, 32 from
    there), KDA on 16 columns and 4 warps below batch 32 and 64 columns and 2 warps from there; wide
    key tiles keep the 8 warps of the one-launch decode tile."""
    from replayssm.kernels.delta.config import VerifyConfig, default_verify_config

    assert default_verify_config(128, 64, False) == VerifyConfig(block_v=32, num_warps=1)
    assert default_verify_config(128, 1, False) == VerifyConfig(block_v=16, num_warps=1)
    assert default_verify_config(128, 1, True) == VerifyConfig(block_v=16, num_warps=4)
    assert default_verify_config(128, 31, True) == VerifyConfig(block_v=16, num_warps=4)
    assert default_verify_config(128, 32, True) == VerifyConfig(block_v=64, num_warps=2)
    assert default_verify_config(256, 64, False) == VerifyConfig(block_v=32, num_warps=8)
    assert default_verify_config(256, 64, True) == VerifyConfig(block_v=32, num_warps=8)
    # a fold that rounds (a checkpoint below fp32): twice the warps on programs of one or two
    assert default_verify_config(128, 64, False, rounds=True) == VerifyConfig(block_v=32, num_warps=2)
    assert default_verify_config(128, 1, False, rounds=True) == VerifyConfig(block_v=16, num_warps=2)
    assert default_verify_config(128, 32, True, rounds=True) == VerifyConfig(block_v=64, num_warps=4)
    assert default_verify_config(128, 1, True, rounds=True) == VerifyConfig(block_v=16, num_warps=4)
