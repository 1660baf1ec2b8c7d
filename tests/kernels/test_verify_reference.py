"""The multi-token verify references and the rollback against the exact per-step recurrence (CPU):
random accepted counts per row over many rounds, rows at different cursors, flushes crossed,
NaN-poisoned rejected suffixes that must never reach a kept output."""

from __future__ import annotations

import pytest
import torch
from verify_helpers import DeltaLayer, Mamba2Layer, rollout

from replayssm.kernels.delta.verify import delta_replay_verify_reference
from replayssm.kernels.mamba2.verify import mamba2_replay_verify_reference
from replayssm.kernels.speculation import conv_rollback_reference, conv_verify_reference, verify_start


def _layer(kind, Bt, L):
    if kind == "mamba2":
        return Mamba2Layer(Bt, L=L), mamba2_replay_verify_reference
    return DeltaLayer(Bt, kda=kind == "kda", L=L), delta_replay_verify_reference


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("L,max_T", [(8, 8), (5, 3), (16, 6)])
def test_verify_and_rollback_follow_the_exact_recurrence(kind, L, max_T):
    layer, fn = _layer(kind, 3, L)
    rollout(layer, fn, rounds=30, max_T=max_T, seed=L)


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("T", range(1, 9))
def test_every_window_length_up_to_L(kind, T):
    layer, fn = _layer(kind, 2, 8)
    rollout(layer, fn, rounds=6, max_T=T, fixed_T=T, seed=T)


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
def test_a_non_flushing_verify_leaves_the_checkpoint_untouched(kind):
    layer, fn = _layer(kind, 2, 8)
    layer.cursor.copy_(torch.tensor([0, 2], dtype=torch.int32))
    before = layer.state.clone()
    fn(*layer.verify_args(layer.tokens(4)))
    assert torch.equal(layer.state, before)
    assert layer.cursor.tolist() == [4, 6]


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
def test_idle_rows_are_untouched(kind):
    layer, fn = _layer(kind, 3, 8)
    layer.cursor.copy_(torch.tensor([1, -1, 7], dtype=torch.int32))
    rings = [r.clone() for r in layer.rings]
    state = layer.state.clone()
    toks = layer.tokens(4)
    out = torch.full_like(toks[0] if kind == "mamba2" else toks[2], 5.0)  # x or v: (Bt, T, heads, dim)
    fn(*layer.verify_args(toks), out=out)
    assert layer.cursor.tolist() == [5, -1, 4]  # row 2 flushed first (7 + 4 > 8)
    assert torch.equal(out[1], torch.full_like(out[1], 5.0))
    assert torch.equal(layer.state[1], state[1])
    assert all(torch.allclose(r[1], r0[1], equal_nan=True, rtol=0, atol=0) for r, r0 in zip(layer.rings, rings))


def test_verify_start_flushes_rows_that_cannot_hold_the_window():
    cursor = torch.tensor([0, 3, 4, 5, 8, -1], dtype=torch.int32)
    assert verify_start(cursor, 4, 8).tolist() == [0, 3, 4, 0, 0, 0]


def test_window_longer_than_the_ring_is_refused():
    layer, fn = _layer("mamba2", 1, 4)
    with pytest.raises(ValueError, match="1..L=4 tokens; got T=5"):
        fn(*layer.verify_args(layer.tokens(5)))


def _conv_step(state, x, w, b):
    window = torch.cat([state[:, :, 1:], x[:, :, None]], dim=-1)
    return window, torch.nn.functional.silu((window * w).sum(-1) + b)


def test_conv_over_a_window_and_its_rollback_follow_single_steps():
    """Conv over T tokens equals T single conv steps; a rollback restores the conv state of the
    kept prefix, across flush-first restarts of the history."""
    gen = torch.Generator().manual_seed(0)
    Bt, C, K, L = 2, 6, 4, 8
    w, b = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    state = torch.randn(Bt, C, K, generator=gen)
    exact = state.clone()
    hist = torch.full((Bt, C, K + L), float("nan"))
    cursor = torch.zeros(Bt, dtype=torch.int32)
    for r in range(25):
        T = int(torch.randint(1, 6, (1,), generator=gen))
        acc = torch.randint(0, T + 1, (Bt,), generator=gen)
        x = torch.randn(Bt, T, C, generator=gen)
        start = verify_start(cursor, T, L)
        out = conv_verify_reference(hist, state, start, cursor >= 0, x, w, b, "silu")
        for t in range(T):
            new, y = _conv_step(exact, x[:, t], w, b)
            keep = t < acc
            torch.testing.assert_close(out[keep, t], y[keep])
            exact = torch.where(keep.view(Bt, 1, 1), new, exact)
        cursor = (start + acc).to(torch.int32)
        conv_rollback_reference(hist, state, cursor)
        torch.testing.assert_close(state, exact)
