"""The Mamba-2 verify Triton kernel (through its custom operator) against the PyTorch reference and
the exact per-step recurrence. Without CUDA it runs under the Triton interpreter (tiny fp32 shapes):
rows at different cursors in one launch, idle rows, flush-first rows, T in {1, 3, L}, NaN-poisoned
outputs and rejected ring slots, rollbacks; then a patched model's speculative generate() whose
verify forwards run the kernel. Real sizes and 16-bit dtypes: ``test_verify_mamba2_gpu.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from verify_helpers import Mamba2Layer, rollout

from replayssm.kernels.mamba2 import verify_launch, verify_ops
from replayssm.kernels.mamba2.verify import mamba2_replay_verify_reference
from replayssm.kernels.quant import QuantStateError

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch):
    """(cursors, T) of each Triton verify launch; the operator's reference path raises."""
    seen = []
    launch = verify_launch.launch_verify

    def counting(*args, **kwargs):
        seen.append((args[8].clone(), args[0].shape[1]))
        return launch(*args, **kwargs)

    def no_reference(*args, **kwargs):
        raise AssertionError("the verify operator ran the PyTorch reference instead of the Triton kernel")

    monkeypatch.setattr(verify_launch, "launch_verify", counting)
    monkeypatch.setattr(verify_ops, "mamba2_replay_verify_reference", no_reference)
    return seen


def _twins(Bt, L, idle=(), seed=0, **shape):
    layers = [Mamba2Layer(Bt, L=L, seed=seed, **shape).to(DEV) for _ in range(2)]
    for lay in layers:
        lay.cursor[list(idle)] = -1
    return layers


@pytest.mark.parametrize("L,T,rounds", [(4, 1, 10), (8, 3, 8), (6, 6, 4)], ids=["T1", "T3", "TL"])
def test_kernel_follows_reference_and_exact_recurrence(L, T, rounds, launches):
    """Random accepted counts per row (rows drift apart: different cursors in one launch), one idle
    row, NaN-poisoned outputs and rejected window inputs (which land in the ring and must stay
    unread after the rollback); the kernel equals the reference everywhere and the exact recurrence
    on every accepted token."""
    layer, twin = _twins(3, L, idle=[1], seed=L)
    rollout(layer, verify_ops.mamba2_replay_verify_triton, rounds=rounds, max_T=T, fixed_T=T, seed=T, twin=twin,
            twin_fn=mamba2_replay_verify_reference, poison_out=True)
    assert len(launches) == rounds
    active = [c[c >= 0] for c, _ in launches]
    assert any((c + T > L).any() for c in active), "no row flushed first"
    assert any(len(set(c.tolist())) > 1 for c in active), "the rows never stood at different cursors"


def _launching(cfg):
    """A verify function (the reference's signature) that launches the kernel with ``cfg``."""

    def fn(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None, sp=True, out=None):
        zero_idle = out is None
        out = torch.empty_like(x) if out is None else out
        verify_launch.launch_verify(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out,
                                    zero_idle, config=cfg)
        return out

    return fn


def test_several_state_tiles_lane_blocks_and_head_chunks(launches):
    """A launch whose programs split a row (two head chunks per group, two lane blocks per head) and
    walk the state dim in two tiles: the flushing rows' shared appends wait for every program's
    reads (under the interpreter the programs run one after the other, so an early append shows)."""
    from replayssm.kernels.mamba2.config import VerifyConfig

    cfg = VerifyConfig(block_p=16, heads_per_program=2, block_n=16, num_warps=4)
    layer, twin = _twins(2, 6, idle=[1], seed=9, H=4, P=32, N=32, G=1)
    rollout(layer, _launching(cfg), rounds=4, max_T=4, fixed_T=4, seed=4, twin=twin,
            twin_fn=mamba2_replay_verify_reference)
    assert any(c[0] + 4 > 6 for c, _ in launches), "no row flushed first"


def _packed(x, B, C, z):
    """x, B, C, z as views into one (Bt, T, width) tensor, as split from a projection."""
    parts = [x.flatten(2), B.flatten(2), C.flatten(2), z.flatten(2)]
    packed = torch.cat(parts, dim=-1)
    views, i = [], 0
    for t, p in zip((x, B, C, z), parts):
        views.append(packed[..., i:i + p.shape[-1]].unflatten(2, t.shape[2:]))
        i += p.shape[-1]
    return views


@pytest.mark.parametrize("cursor_dtype,optional", [(torch.int32, True), (torch.int64, False)],
                         ids=["int32-z-D-bias", "int64-bare"])
def test_kernel_equals_reference_on_packed_inputs(cursor_dtype, optional, launches):
    """Inputs split from one packed tensor (strided), with and without z / D / dt_bias (dt without
    softplus then), int32 cursors (arrivals counted on the cursor word) and int64 ones (a counter
    vector): a window filling the ring, rollbacks to different cursors, then a window on which one
    row flushes first and another appends."""
    layer, twin = _twins(3, 8, idle=[1], seed=5)
    for lay in (layer, twin):
        lay.cursor = lay.cursor.to(cursor_dtype)
    for T, back in ((5, torch.tensor([0, 0, 3])), (4, None)):
        x, dt, B, C, z = layer.tokens(T)
        x, B, C, z = _packed(x, B, C, z)
        if not optional:
            dt = dt.abs() * 0.1
        opt = (layer.dt_bias, layer.D, z, True) if optional else (None, None, None, False)
        outs = []
        for lay, fn in ((layer, verify_ops.mamba2_replay_verify_triton), (twin, mamba2_replay_verify_reference)):
            outs.append(fn(x, dt, B, C, lay.state, *lay.rings, lay.cursor, lay.A, *opt))
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
        assert torch.equal(layer.cursor, twin.cursor)
        torch.testing.assert_close(layer.state, twin.state, atol=1e-4, rtol=1e-4)
        for a, b in zip(layer.rings, twin.rings):
            torch.testing.assert_close(a, b, equal_nan=True, atol=1e-6, rtol=1e-6)
        if back is not None:
            for lay in (layer, twin):
                lay.cursor -= torch.where(lay.cursor >= 0, back.to(lay.cursor.device), 0).to(cursor_dtype)
    assert [(c.tolist(), T) for c, T in launches] == [([0, -1, 0], 5), ([5, -1, 2], 4)]


def test_a_non_finite_window_input_reaches_later_tokens_only(launches):
    """A NaN / inf in one lane of window token 2's x alone (its C stays finite) makes that lane's
    outputs of tokens 2 and 3 non-finite, as in the reference, and leaves everything else exact."""
    layer, twin = _twins(2, 8, seed=3)
    x, dt, B, C, z = layer.tokens(4)
    x[0, 2, 1, 3] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    bad = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    bad[0, 2:, 1, 3] = bad[1, 2:, 0, 0] = True
    y_kernel = verify_ops.mamba2_replay_verify_triton(*layer.verify_args((x, dt, B, C, z)))
    y_ref = mamba2_replay_verify_reference(*twin.verify_args((x, dt, B, C, z)))
    for y in (y_kernel, y_ref):
        assert torch.equal(~torch.isfinite(y), bad)
    torch.testing.assert_close(y_kernel[~bad], y_ref[~bad], atol=1e-4, rtol=1e-4)


def test_scaled_checkpoints_without_scales_and_wrong_outputs_are_refused():
    layer = Mamba2Layer(2, L=4).to(DEV)
    toks = layer.tokens(2)
    args = list(layer.verify_args(toks))
    args[4] = layer.state.to(torch.int8)
    for fn in (verify_ops.mamba2_replay_verify_triton, mamba2_replay_verify_reference):
        with pytest.raises(QuantStateError, match="needs state_scale"):
            fn(*args)
    with pytest.raises(ValueError, match=r"out must be \(Bt, T, H, P\)"):
        verify_ops.mamba2_replay_verify_triton(*layer.verify_args(toks), out=torch.empty(2, 3, 4, 16))


@pytest.mark.skipif(DEV == "cuda", reason="the GPU suite runs generate() on CUDA")
@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1"])
def test_patched_model_verifies_through_the_kernel(family, launches):
    """Assisted greedy decoding of a patched tiny model (backend "triton": the verify forwards run the
    kernel under the interpreter; FalconH1 gates with z inside it) gives the plain greedy tokens of
    the reference backend."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import replayssm
    from helpers import generate, tiny
    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny(family)
    ids = torch.randint(3, 512, (1, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    new = 10
    try:
        replayssm.patch(model, buffer_len=4, backend="torch")
        ref = generate(model, ids, mask, max_new_tokens=new, min_new_tokens=new)
        replayssm.unpatch(model)
        replayssm.patch(model, buffer_len=4, backend="triton")
        drafter = ScriptedDrafter(model, ref.sequences, 3, seed=2)
        with drafting(model, drafter):
            out = generate(model, ids, mask, max_new_tokens=new, min_new_tokens=new, prompt_lookup_num_tokens=3)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert any(a < k for k, a in drafter.log) and any(a == k > 1 for k, a in drafter.log), drafter.log
    assert any((c + T > 4).any() for c, T in launches), "no verify flushed first"
