"""The delta-rule ReplaySSM reference against an exact fp32 per-step recurrence (CPU)."""

from __future__ import annotations

import pytest
import torch
from speculation import draft_plan, step_rows

from replayssm.kernels.delta import (
    delta_replay_decode_reference,
    delta_replay_materialize_reference,
    delta_step_decode_reference,
)

ATOL, RTOL = 3e-5, 1e-5


# ----------------------------------------------------------------------------- helpers


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _token(gen, Bt, Hk, HV, K, V, kda, dtype=torch.float32):
    """One token's (q, k, v, g, beta) as the layer would hand them over."""
    q = (_l2n(torch.randn(Bt, Hk, K, generator=gen)) * K ** -0.5).to(dtype)
    k = _l2n(torch.randn(Bt, Hk, K, generator=gen)).to(dtype)
    v = torch.randn(Bt, HV, V, generator=gen).to(dtype)
    shape = (Bt, HV, K) if kda else (Bt, HV)
    g = -torch.exp(torch.randn(*shape, generator=gen) - 1.5)  # log-decays, about -0.2
    beta = torch.sigmoid(torch.randn(Bt, HV, generator=gen))
    return q, k, v, g, beta


def _recurrence(S, q, k, v, g, beta):
    """Exact fp32 step in Hugging Face's order; S (Bt, HV, K, V) fp32 is updated in place.

    Written independently of the package: explicit loop over value heads.
    Returns o (Bt, HV, V) fp32 and the corrected value u = beta (v - kv).
    """
    Bt, HV, K, V = S.shape
    Hk = k.shape[1]
    o = torch.empty(Bt, HV, V)
    us = torch.empty(Bt, HV, V)
    for h in range(HV):
        kh = k[:, h // (HV // Hk)].float()
        qh = q[:, h // (HV // Hk)].float()
        if g.dim() == 3:
            s = S[:, h] * torch.exp(g[:, h])[:, :, None]
        else:
            s = S[:, h] * torch.exp(g[:, h])[:, None, None]
        kv = (s * kh[:, :, None]).sum(1)
        u = (v[:, h].float() - kv) * beta[:, h, None]
        s = s + kh[:, :, None] * u[:, None, :]
        o[:, h] = (s * qh[:, :, None]).sum(1)
        us[:, h] = u
        S[:, h] = s
    return o, us


def _empty_ring(Bt, Hk, HV, K, V, L, kda, buf_dtype=torch.float32):
    """Ring buffers poisoned with NaN: unused slots must never be read."""
    u_buf = torch.full((Bt, HV, L, V), float("nan"), dtype=buf_dtype)
    k_buf = torch.full((Bt, Hk, L, K), float("nan"), dtype=buf_dtype)
    g_buf = torch.full((Bt, HV, L, K) if kda else (Bt, HV, L), float("nan"))
    return u_buf, k_buf, g_buf


def _fresh_layer(gen, Bt, Hk, HV, K, V, L, kda):
    """A random checkpoint, its exact copy, empty NaN-poisoned rings and cursors at 0."""
    state = torch.randn(Bt, HV, K, V, generator=gen)
    return state, state.clone(), _empty_ring(Bt, Hk, HV, K, V, L, kda), torch.zeros(Bt, dtype=torch.int32)


def _run_cycle(Bt, Hk, HV, K, V, L, kda, c0, idle_rows=(), steps=None, seed=0):
    """Steps the reference and the exact recurrence side by side and checks everything."""
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(Bt, HV, K, V, generator=gen)
    u_buf, k_buf, g_buf = _empty_ring(Bt, Hk, HV, K, V, L, kda)
    exact = state.clone()
    # Prefill each row's ring with c0[b] random (valid) entries; the exact state folds them.
    for b in range(Bt):
        for j in range(int(c0[b])):
            _, kj, _, gj, _ = _token(gen, 1, Hk, HV, K, V, kda)
            uj = torch.randn(1, HV, V, generator=gen)
            k_buf[b, :, j] = kj[0]
            u_buf[b, :, j] = uj[0]
            # KDA's ring holds the running sums of the decays (G_j = G_{j-1} + g_j), GDN's the decays
            g_buf[b, :, j] = gj[0] + (g_buf[b, :, j - 1] if kda and j > 0 else 0.0)
            for h in range(HV):
                kh = kj[0, h // (HV // Hk)]
                dec = torch.exp(gj[0, h])
                dec = dec[:, None] if kda else dec
                exact[b, h] = dec * exact[b, h] + kh[:, None] * uj[0, h][None, :]
    cursor = torch.tensor(c0, dtype=torch.int32)
    for b in idle_rows:
        cursor[b] = -1
    idle = torch.zeros(Bt, dtype=torch.bool)
    idle[list(idle_rows)] = True
    act = ~idle
    out = torch.full((Bt, HV, V), 7.0)
    steps = 2 * L + 1 if steps is None else steps
    flushes = 0
    for _ in range(steps):
        q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, kda)
        before = (state.clone(), u_buf.clone(), k_buf.clone(), g_buf.clone(), cursor.clone())
        c = cursor.clone()
        o_exact, u_exact = _recurrence(exact, q, k, v, g, beta)
        exact[idle] = before[0][idle]  # idle rows do not advance
        o = delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out)
        assert o is out
        torch.testing.assert_close(o[act], o_exact[act], atol=ATOL, rtol=RTOL)
        assert torch.equal(o[idle], torch.full_like(o[idle], 7.0))
        for b in range(Bt):
            if idle[b]:
                assert int(cursor[b]) == -1
                continue
            cb = int(c[b])
            assert int(cursor[b]) == (cb + 1) % L
            if cb == L - 1:  # flush: checkpoint equals the exact state
                flushes += 1
                torch.testing.assert_close(state[b], exact[b], atol=ATOL, rtol=RTOL)
            else:  # append at slot cb; checkpoint untouched
                assert torch.equal(state[b], before[0][b])
                torch.testing.assert_close(u_buf[b, :, cb], u_exact[b], atol=ATOL, rtol=RTOL)
                assert torch.equal(k_buf[b, :, cb], k[b])
                if kda:  # G_c = G_{c-1} + g_c
                    prev = before[3][b, :, cb - 1] if cb > 0 else torch.zeros_like(g[b])
                    assert torch.equal(g_buf[b, :, cb], prev + g[b])
                else:
                    assert torch.equal(g_buf[b, :, cb], g[b])
                others = [j for j in range(L) if j != cb]
                assert torch.allclose(u_buf[b, :, others], before[1][b, :, others], equal_nan=True, rtol=0, atol=0)
        # Idle rows: nothing of theirs changed (NaN-aware equality).
        for t_new, t_old in zip((state, u_buf, k_buf, g_buf, cursor), before):
            assert torch.allclose(t_new[idle].double(), t_old[idle].double(), equal_nan=True, rtol=0, atol=0)
    # Materialize folds what is buffered.
    st = delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, cursor)
    torch.testing.assert_close(st[act], exact[act], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(state[act], exact[act], atol=ATOL, rtol=RTOL)
    assert torch.all(cursor[act] == 0)
    assert torch.all(cursor[idle] == -1)
    return flushes


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("L", [1, 3, 4, 16])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_reference_matches_recurrence(L, kda):
    Hk, HV = (2, 4) if not kda else (3, 3)  # GDN with grouped value heads (HV = 2 Hk)
    flushes = _run_cycle(Bt=2, Hk=Hk, HV=HV, K=8, V=6, L=L, kda=kda, c0=[0, 0])
    assert flushes == 2 * (2 if L > 1 else 2 * L + 1)  # two rows, 2L+1 steps from 0


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_desynchronised_cursors_and_idle_rows(kda):
    L = 4
    Hk, HV = (2, 4) if not kda else (2, 2)
    _run_cycle(Bt=5, Hk=Hk, HV=HV, K=8, V=5, L=L, kda=kda, c0=[0, 1, 3, 2, 2], idle_rows=(3,), steps=2 * L + 3,
               seed=1)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_l1_equals_recurrence(kda):
    """L = 1: every step flushes, so the checkpoint is the state after every step."""
    gen = torch.Generator().manual_seed(3)
    Bt, Hk, HV, K, V = 2, 2, 4, 16, 8
    state = torch.randn(Bt, HV, K, V, generator=gen)
    exact = state.clone()
    u_buf, k_buf, g_buf = _empty_ring(Bt, Hk, HV, K, V, 1, kda)
    cursor = torch.zeros(Bt, dtype=torch.int32)
    for _ in range(6):
        q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, kda)
        o_exact, _ = _recurrence(exact, q, k, v, g, beta)
        o = delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor)
        torch.testing.assert_close(o, o_exact, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(state, exact, atol=ATOL, rtol=RTOL)
        assert torch.all(cursor == 0)
        assert torch.isnan(u_buf).all() and torch.isnan(k_buf).all() and torch.isnan(g_buf).all()


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_step_reference_matches_recurrence(kda):
    gen = torch.Generator().manual_seed(4)
    Bt, Hk, HV, K, V = 3, 2, 4, 8, 6
    state = torch.randn(Bt, HV, K, V, generator=gen)
    exact = state.clone()
    for _ in range(5):
        q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, kda)
        o_exact, _ = _recurrence(exact, q, k, v, g, beta)
        o = delta_step_decode_reference(q, k, v, g, beta, state)
        torch.testing.assert_close(o, o_exact, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(state, exact, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_low_precision_buffers_track_recurrence(kda):
    """bf16 activations and ring, bf16 checkpoint: close to the fp32 recurrence."""
    gen = torch.Generator().manual_seed(5)
    Bt, Hk, HV, K, V, L = 2, 2, 4, 16, 8, 4
    state32 = torch.randn(Bt, HV, K, V, generator=gen) * 0.5
    state = state32.to(torch.bfloat16)
    exact = state.float()
    u_buf, k_buf, g_buf = _empty_ring(Bt, Hk, HV, K, V, L, kda, torch.bfloat16)
    cursor = torch.zeros(Bt, dtype=torch.int32)
    for _ in range(2 * L + 1):
        q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, kda, dtype=torch.bfloat16)
        o_exact, _ = _recurrence(exact, q, k, v, g, beta)
        o = delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor)
        assert o.dtype == torch.bfloat16
        torch.testing.assert_close(o.float(), o_exact, atol=2e-2, rtol=2e-2)
    st = delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, cursor)
    torch.testing.assert_close(st, exact, atol=3e-2, rtol=3e-2)


def test_out_none_zeroes_idle_rows_and_shapes_are_checked():
    gen = torch.Generator().manual_seed(6)
    Bt, Hk, HV, K, V, L = 2, 1, 2, 4, 4, 2
    q, k, v, g, beta = _token(gen, Bt, Hk, HV, K, V, False)
    state = torch.randn(Bt, HV, K, V, generator=gen)
    u_buf, k_buf, g_buf = _empty_ring(Bt, Hk, HV, K, V, L, False)
    cursor = torch.tensor([0, -1], dtype=torch.int32)
    o = delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor)
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    with pytest.raises(ValueError):
        delta_replay_decode_reference(q, k, v[:, :1], g, beta, state, u_buf, k_buf, g_buf, cursor)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_rollback_is_a_cursor_move(kda):
    """Speculative decoding: 4 drafted tokens are verified, then row 0 rejects the last 2 and
    row 1 the last 3. Moving each cursor back by that much (no flush in between) leaves the layer
    exactly where the accepted tokens alone would have: the later steps (a flush among them) and
    the materialized state match the exact recurrence over the accepted tokens only. For KDA this
    also shows that the kept slots' running gate sums stay valid."""
    gen = torch.Generator().manual_seed(6)
    Bt, Hk, HV, K, V, L = 2, 2, (2 if kda else 4), 8, 6, 8
    state, exact, (u_buf, k_buf, g_buf), cursor = _fresh_layer(gen, Bt, Hk, HV, K, V, L, kda)
    for _ in range(3):  # accepted by both rows
        tok = _token(gen, Bt, Hk, HV, K, V, kda)
        _recurrence(exact, *tok)
        delta_replay_decode_reference(*tok, state, u_buf, k_buf, g_buf, cursor)
    drafted = [_token(gen, Bt, Hk, HV, K, V, kda) for _ in range(4)]
    for tok in drafted:  # the verification pass, one step per drafted token
        delta_replay_decode_reference(*tok, state, u_buf, k_buf, g_buf, cursor)
    assert cursor.tolist() == [7, 7]
    accepted = [2, 1]
    for b, n in enumerate(accepted):
        for tok in drafted[:n]:
            _recurrence(exact[b:b + 1], *[t[b:b + 1] for t in tok])
    cursor -= torch.tensor([4 - n for n in accepted], dtype=torch.int32)  # the rollback
    for step in range(2 * L):
        tok = _token(gen, Bt, Hk, HV, K, V, kda)
        o_exact, _ = _recurrence(exact, *tok)
        o = delta_replay_decode_reference(*tok, state, u_buf, k_buf, g_buf, cursor)
        torch.testing.assert_close(o, o_exact, atol=ATOL, rtol=RTOL)
    st = delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, cursor)
    torch.testing.assert_close(st, exact, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_random_rollbacks_track_the_accepted_stream(kda):
    """40 rounds of speculation: each row drafts 1-4 tokens when they fit before its flush slot
    (else it takes one ordinary step), verifies them one step each, accepts a random prefix and
    moves its cursor back over the rest. Every accepted token's output, and the materialized
    state at the end, equal the exact recurrence over the accepted stream alone."""
    gen = torch.Generator().manual_seed(9)
    Bt, Hk, HV, K, V, L = 3, 2, (2 if kda else 4), 8, 6, 6
    state, exact, (u_buf, k_buf, g_buf), cursor = _fresh_layer(gen, Bt, Hk, HV, K, V, L, kda)
    rollbacks = 0
    for _ in range(40):
        drafts, accepted = draft_plan(gen, cursor, L)
        for t in range(int(drafts.max())):
            tok = _token(gen, Bt, Hk, HV, K, V, kda)
            run = t < drafts  # rows still verifying; the others sit idle
            o = step_rows(cursor, run, lambda: delta_replay_decode_reference(*tok, state, u_buf, k_buf, g_buf, cursor))
            for b in range(Bt):
                if run[b] and t < accepted[b]:
                    o_e, _ = _recurrence(exact[b:b + 1], *[x[b:b + 1] for x in tok])
                    torch.testing.assert_close(o[b:b + 1], o_e, atol=ATOL, rtol=RTOL)
        rollbacks += int((drafts - accepted).gt(0).sum())
        cursor -= (drafts - accepted).to(torch.int32)  # the rollback (0 for rows that flushed)
    assert rollbacks >= 20
    st = delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, cursor)
    torch.testing.assert_close(st, exact, atol=ATOL, rtol=RTOL)
