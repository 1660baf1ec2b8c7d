"""The PyTorch reference of the Mamba-2 replay decode against an independent float64 recurrence."""

import pytest
import torch
from speculation import draft_plan, step_rows

from replayssm.kernels.mamba2 import (
    mamba2_replay_decode_reference,
    mamba2_replay_materialize_reference,
    mamba2_step_decode_reference,
)


def oracle_step(S, x, dt, B, C, A, dt_bias, D, z):
    """float64 per-row recurrence, written without the package's helpers. S (B,H,P,N) float64."""
    H, G = x.shape[1], B.shape[1]
    d = torch.nn.functional.softplus(dt.double() + dt_bias.double())
    hg = torch.arange(H) // (H // G)
    Bh, Ch = B.double()[:, hg], C.double()[:, hg]
    S = S * torch.exp(A.double()[None, :, None, None] * d[..., None, None]) \
        + d[..., None, None] * x.double()[..., :, None] * Bh[:, :, None, :]
    y = (S * Ch[:, :, None, :]).sum(-1) + D.double()[None, :, None] * x.double()
    if z is not None:
        y = y * z.double() * torch.sigmoid(z.double())
    return S, y


def make_problem(Bsz, H, P, N, G, L, seed):
    g = torch.Generator().manual_seed(seed)
    A = -(torch.rand(H, generator=g) * 0.5 + 0.05)
    dt_bias = torch.randn(H, generator=g) * 0.3
    D = torch.randn(H, generator=g)
    S0 = torch.randn(Bsz, H, P, N, generator=g)
    bufs = (torch.full((Bsz, H, L, P), float("nan")), torch.full((Bsz, H, L), float("nan")),
            torch.full((Bsz, G, L, N), float("nan")))
    return g, A, dt_bias, D, S0, bufs


@pytest.mark.parametrize("L", [1, 3, 4, 16])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 5, 6, 2), (2, 6, 8, 4, 1), (2, 4, 3, 5, 4)])
def test_reference_matches_float64_recurrence(L, with_z, shape):
    Bsz, H, P, N, G = shape
    g, A, dt_bias, D, S0, (xb, dtb, bb) = make_problem(Bsz, H, P, N, G, L, seed=L * 7 + H)
    state = S0.clone()
    cursor = torch.zeros(Bsz, dtype=torch.int32)
    S_exact = S0.double()
    folded = 0
    for t in range(2 * L + 1):
        x = torch.randn(Bsz, H, P, generator=g)
        dt = torch.randn(Bsz, H, generator=g)
        B = torch.randn(Bsz, G, N, generator=g)
        C = torch.randn(Bsz, G, N, generator=g)
        z = torch.randn(Bsz, H, P, generator=g) if with_z else None
        y = mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D, z)
        S_exact, y_exact = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, z)
        torch.testing.assert_close(y.double(), y_exact, rtol=1e-4, atol=1e-4)
        assert torch.all(cursor == (t + 1) % L)
        if (t + 1) % L == 0:  # this step flushed: the checkpoint is the exact state
            folded = t + 1
            torch.testing.assert_close(state.double(), S_exact, rtol=1e-4, atol=1e-4)
        else:  # between flushes the checkpoint is untouched (still the last flush's)
            # buffer holds exactly the tokens since the last flush
            assert torch.isfinite(xb[:, :, : (t + 1 - folded)]).all()
    assert folded >= 2 * L
    # materialize folds the remaining buffered tokens
    exact = mamba2_replay_materialize_reference(state, xb, dtb, bb, cursor, A)
    torch.testing.assert_close(exact.double(), S_exact, rtol=1e-4, atol=1e-4)
    assert torch.all(cursor == 0)


def test_checkpoint_untouched_between_flushes_and_desynchronised_cursors():
    Bsz, H, P, N, G, L = 4, 4, 4, 4, 2, 4
    g, A, dt_bias, D, S0, (xb, dtb, bb) = make_problem(Bsz, H, P, N, G, L, seed=3)
    state = S0.clone()
    # rows start at different fill levels: replay the first k tokens of each row into its buffer
    start = [0, 1, 2, 3]
    cursor = torch.zeros(Bsz, dtype=torch.int32)
    S_exact = S0.double()
    history = []
    for t in range(max(start)):
        x, dt = torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g)
        B, C = torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g)
        history.append((x, dt, B, C))
    # feed row r its first start[r] tokens while other rows idle (cursor -1)
    for t, (x, dt, B, C) in enumerate(history):
        active = torch.tensor([t < s for s in start])
        saved = cursor.clone()
        cursor.copy_(torch.where(active, cursor, torch.full_like(cursor, -1)))
        before = (state.clone(), xb.clone(), dtb.clone(), bb.clone())
        out = torch.full((Bsz, H, P), 123.0)
        mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D, None, True, out)
        idle = ~active
        assert torch.all(out[idle] == 123.0)  # idle rows' outputs untouched
        assert torch.equal(state[idle], before[0][idle])
        assert torch.equal(xb[idle].nan_to_num(7.0), before[1][idle].nan_to_num(7.0))
        assert torch.all(cursor[idle] == -1)
        cursor.copy_(torch.where(active, cursor, saved))
        S_new, _ = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, None)
        S_exact = torch.where(active[:, None, None, None], S_new, S_exact)
    assert cursor.tolist() == start
    ck = state.clone()
    for t in range(2 * L + 1):
        x, dt = torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g)
        B, C = torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g)
        flush = cursor == L - 1
        y = mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D)
        S_exact, y_exact = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, None)
        torch.testing.assert_close(y.double(), y_exact, rtol=1e-4, atol=1e-4)
        # flush rows get the exact state; the others keep their checkpoint bit for bit
        torch.testing.assert_close(state[flush].double(), S_exact[flush], rtol=1e-4, atol=1e-4)
        assert torch.equal(state[~flush], ck[~flush])
        ck = state.clone()


def test_l1_equals_the_per_step_recurrence_bitwise_close():
    Bsz, H, P, N, G = 2, 4, 4, 8, 2
    g, A, dt_bias, D, S0, _ = make_problem(Bsz, H, P, N, G, 1, seed=11)
    s_replay, s_step = S0.clone(), S0.clone()
    bufs = (torch.zeros(Bsz, H, 1, P), torch.zeros(Bsz, H, 1), torch.zeros(Bsz, G, 1, N))
    cursor = torch.zeros(Bsz, dtype=torch.int32)
    for _ in range(6):
        x, dt = torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g)
        B, C = torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g)
        y1 = mamba2_replay_decode_reference(x, dt, B, C, s_replay, *bufs, cursor, A, dt_bias, D)
        y2 = mamba2_step_decode_reference(x, dt, B, C, s_step, A, dt_bias, D)
        torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(s_replay, s_step, rtol=1e-6, atol=1e-6)


def test_tolerance_catches_a_wrong_flush():
    """Teeth: dropping the current token from a flush must fail the comparison."""
    Bsz, H, P, N, G, L = 2, 4, 4, 4, 2, 4
    g, A, dt_bias, D, S0, (xb, dtb, bb) = make_problem(Bsz, H, P, N, G, L, seed=5)
    state, cursor, S_exact = S0.clone(), torch.zeros(Bsz, dtype=torch.int32), S0.double()
    for t in range(L):
        x, dt = torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g)
        B, C = torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g)
        if t == L - 1:
            # a buggy flush: fold the buffer only, not the current token
            c = cursor.clone() - 1
            wrong = state.clone()
            mamba2_replay_materialize_reference(wrong, xb, dtb, bb, cursor.clone(), A)
        mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D)
        S_exact, _ = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, None)
    torch.testing.assert_close(state.double(), S_exact, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong.double(), S_exact, rtol=1e-4, atol=1e-4)


def test_rollback_is_a_cursor_move():
    """Speculative decoding: 4 drafted tokens are verified, then row 0 rejects the last 2 and
    row 1 the last 3. Moving each cursor back by that much (no flush in between) leaves the layer
    exactly where the accepted tokens alone would have: the later steps (a flush among them) and
    the materialized state match the float64 recurrence over the accepted tokens only."""
    Bsz, H, P, N, G, L = 2, 4, 4, 6, 2, 8
    g, A, dt_bias, D, S0, (xb, dtb, bb) = make_problem(Bsz, H, P, N, G, L, seed=11)
    state = S0.clone()
    cursor = torch.zeros(Bsz, dtype=torch.int32)
    S_exact = S0.double()

    def token():
        return (torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g),
                torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g))

    for _ in range(3):  # accepted by both rows
        x, dt, B, C = token()
        mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D, None)
        S_exact, _ = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, None)
    drafted = [token() for _ in range(4)]
    for x, dt, B, C in drafted:  # the verification pass, one step per drafted token
        mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D, None)
    assert cursor.tolist() == [7, 7]
    accepted = [2, 1]
    for b, n in enumerate(accepted):
        for tok in drafted[:n]:
            row, _ = oracle_step(S_exact[b:b + 1], *[t[b:b + 1] for t in tok], A, dt_bias, D, None)
            S_exact[b] = row[0]
    cursor -= torch.tensor([4 - n for n in accepted], dtype=torch.int32)  # the rollback
    for _ in range(2 * L):
        x, dt, B, C = token()
        y = mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor, A, dt_bias, D, None)
        S_exact, y_exact = oracle_step(S_exact, x, dt, B, C, A, dt_bias, D, None)
        torch.testing.assert_close(y.double(), y_exact, rtol=1e-4, atol=1e-4)
    exact = mamba2_replay_materialize_reference(state, xb, dtb, bb, cursor, A)
    torch.testing.assert_close(exact.double(), S_exact, rtol=1e-4, atol=1e-4)


def test_random_rollbacks_track_the_accepted_stream():
    """40 rounds of speculation: each row drafts 1-4 tokens when they fit before its flush slot
    (else it takes one ordinary step), verifies them one step each, accepts a random prefix and
    moves its cursor back over the rest. Every accepted token's output, and the materialized
    state at the end, equal the float64 recurrence over the accepted stream alone."""
    Bsz, H, P, N, G, L = 3, 4, 4, 6, 2, 6
    g, A, dt_bias, D, S0, (xb, dtb, bb) = make_problem(Bsz, H, P, N, G, L, seed=12)
    state = S0.clone()
    cursor = torch.zeros(Bsz, dtype=torch.int32)
    S_exact = S0.double()
    rollbacks = 0
    for _ in range(40):
        drafts, accepted = draft_plan(g, cursor, L)
        for t in range(int(drafts.max())):
            x, dt = torch.randn(Bsz, H, P, generator=g), torch.randn(Bsz, H, generator=g)
            B, C = torch.randn(Bsz, G, N, generator=g), torch.randn(Bsz, G, N, generator=g)
            run = t < drafts  # rows still verifying; the others sit idle
            y = step_rows(cursor, run, lambda: mamba2_replay_decode_reference(x, dt, B, C, state, xb, dtb, bb, cursor,
                                                                             A, dt_bias, D, None))
            for b in range(Bsz):
                if run[b] and t < accepted[b]:
                    row, y_e = oracle_step(S_exact[b:b + 1], x[b:b + 1], dt[b:b + 1], B[b:b + 1], C[b:b + 1], A,
                                           dt_bias, D, None)
                    S_exact[b] = row[0]
                    torch.testing.assert_close(y[b:b + 1].double(), y_e, rtol=1e-4, atol=1e-4)
        rollbacks += int((drafts - accepted).gt(0).sum())
        cursor -= (drafts - accepted).to(torch.int32)  # the rollback (0 for rows that flushed)
    assert rollbacks >= 20
    exact = mamba2_replay_materialize_reference(state, xb, dtb, bb, cursor, A)
    torch.testing.assert_close(exact.double(), S_exact, rtol=1e-4, atol=1e-4)
