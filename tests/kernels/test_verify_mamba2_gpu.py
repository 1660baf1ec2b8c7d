"""GPU suite of the Mamba-2 verify Triton kernel (``python3 -m pytest -m gpu FILE``).

Production shapes (Nemotron-3-Nano-like H=96 P=80 N=128 G=8, Nemotron-3-Super-like H=128 P=64 N=128
G=1), L = 16, batches 1 to 256, fp32 / bf16 checkpoints and activations: the kernel against the
reference on rings whose stale slots hold NaN, rows at every kind of cursor in one launch (empty,
mid-ring, flush-first, full ring, idle), then a rollback and a second verify; every (state,
activation) dtype pair; the exact recurrence at a real size; a CUDA-graph capture; opcheck.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from verify_helpers import Mamba2Layer, check_graph_replays, rollout

from mamba2_helpers import record
from replayssm.kernels.mamba2 import mamba2_replay_verify
from replayssm.kernels.mamba2.verify import mamba2_replay_verify_reference
from replayssm.kernels.speculation import rollback_cursor_reference

pytestmark = pytest.mark.gpu

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
SHAPES = {"nano": (96, 80, 128, 8), "super": (128, 64, 128, 1)}


def _kernel(*args, **kwargs):
    return mamba2_replay_verify(*args, **kwargs, backend="triton")


def _tol(state_dtype, act_dtype):
    """(rtol, atol) of kernel vs reference: fp32 products at tf32x3; 16-bit outputs and checkpoints
    round once (a tie may round either way), so they may differ by an ulp."""
    if state_dtype == F32 and act_dtype == F32:
        return 1e-4, 1e-3
    return 2e-2, 5e-2


class Window:
    """One layer's checkpoint, rings (finite below each cursor, NaN at and above it) and cursors,
    with inputs of T tokens; ``clone`` gives the twin the reference runs on."""

    def __init__(self, Bt, H, P, N, G, L, state_dtype, act_dtype, cursors, seed=0, optional=True):
        g = torch.Generator().manual_seed(seed)
        self.dims, self.dtypes, self.gen, self.optional = (Bt, H, P, N, G, L), (state_dtype, act_dtype), g, optional
        self.A = (-torch.rand(H, generator=g) * 0.5 - 0.05).cuda()
        self.dt_bias = (torch.randn(H, generator=g) * 0.3).cuda()
        self.D = torch.randn(H, generator=g).cuda()
        self.state = (torch.randn(Bt, H, P, N, generator=g) * 0.3).to(state_dtype).cuda()
        cur = torch.tensor(cursors, dtype=torch.int32)
        stale = torch.arange(L)[None, :] >= cur.clamp(min=0)[:, None]  # (Bt, L)
        x_buf = torch.randn(Bt, H, L, P, generator=g)
        dt_buf = torch.nn.functional.softplus(torch.randn(Bt, H, L, generator=g) - 2)
        B_buf = torch.randn(Bt, G, L, N, generator=g) / N ** 0.5
        x_buf[stale[:, None, :, None].expand_as(x_buf)] = float("nan")
        dt_buf[stale[:, None, :].expand_as(dt_buf)] = float("nan")
        B_buf[stale[:, None, :, None].expand_as(B_buf)] = float("nan")
        self.rings = (x_buf.to(act_dtype).cuda(), dt_buf.cuda(), B_buf.to(act_dtype).cuda())
        self.cursor = cur.cuda()

    def clone(self):
        twin = object.__new__(Window)
        twin.__dict__.update(self.__dict__)
        twin.state, twin.cursor = self.state.clone(), self.cursor.clone()
        twin.rings = tuple(r.clone() for r in self.rings)
        return twin

    def tokens(self, T):
        Bt, H, P, N, G, _ = self.dims
        g, act = self.gen, self.dtypes[1]
        x = torch.randn(Bt, T, H, P, generator=g)
        dt = torch.randn(Bt, T, H, generator=g) * 0.5 - 2.0
        B, C = (torch.randn(Bt, T, G, N, generator=g) / N ** 0.5 for _ in range(2))
        z = torch.randn(Bt, T, H, P, generator=g)
        return tuple(t.to(act).cuda() for t in (x, dt, B, C, z))

    def verify(self, fn, toks, out):
        x, dt, B, C, z = toks
        opt = (self.dt_bias, self.D, z, True) if self.optional else (None, None, None, True)
        return fn(x, dt, B, C, self.state, *self.rings, self.cursor, self.A, *opt, out=out)


def _cursors(Bt, L, T, seed):
    """Random cursors in [0, L] with, where the batch allows, a row that must flush first, an idle
    row, an empty ring and a full ring."""
    c = torch.randint(0, L + 1, (Bt,), generator=torch.Generator().manual_seed(seed))
    for i, v in enumerate([L - T + 1, -1, 0, L][:Bt]):
        c[(i * 7919) % Bt] = v
    return c.tolist()


def _check(ker: Window, ref: Window, y_k, y_r, before: Window, tag: str):
    rtol, atol = _tol(*ker.dtypes)
    L = ker.dims[-1]
    c0 = before.cursor
    idle, flush = c0 < 0, (c0 >= 0) & (c0 + y_k.shape[1] > L)
    assert torch.equal(ker.cursor, ref.cursor), tag + ": cursors"
    assert torch.isnan(y_k[idle]).all(), tag + ": an idle row's output was written"
    assert torch.isfinite(y_k[~idle].float()).all(), tag + ": an output left unwritten or a stale slot read"
    assert_close(y_k.float(), y_r.float(), rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{tag}: outputs\n{m}")
    assert torch.equal(ker.state[~flush], before.state[~flush]), tag + ": a checkpoint without a flush changed"
    assert_close(ker.state.float(), ref.state.float(), rtol=rtol, atol=atol, msg=lambda m: f"{tag}: checkpoint\n{m}")
    for name, a, b in zip(("x_buf", "dt_buf", "B_buf"), ker.rings, ref.rings):
        assert torch.equal(a.isnan(), b.isnan()), f"{tag}: {name} written where the reference does not"
        assert_close(a.nan_to_num(0.0), b.nan_to_num(0.0), rtol=2e-6, atol=1e-6, msg=lambda m: f"{tag}: {name}\n{m}")
    return (y_k.float() - y_r.float()).nan_to_num(0.0).abs().max().item()


def _two_verifies(win: Window, T: int, seed: int, tag: str):
    """Verify T tokens, roll every row back by a random count, verify again: kernel vs reference."""
    ref = win.clone()
    worst = 0.0
    Bt = win.dims[0]
    for step in range(2):
        toks = win.tokens(T)
        before = win.clone()
        out_k = torch.full(toks[0].shape, float("nan"), dtype=toks[0].dtype, device="cuda")
        out_r = out_k.clone()
        y_k = win.verify(_kernel, toks, out_k)
        y_r = ref.verify(mamba2_replay_verify_reference, toks, out_r)
        worst = max(worst, _check(win, ref, y_k, y_r, before, f"{tag} verify {step}"))
        back = torch.randint(0, T + 1, (Bt,), generator=torch.Generator().manual_seed(seed + step)).cuda()
        for w in (win, ref):
            rollback_cursor_reference(w.cursor, back.to(torch.int32))
    return worst


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("Bt", [1, 7, 64, 256])
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F32, BF16), (BF16, BF16)],
                         ids=["s32-a32", "s32-abf16", "sbf16-abf16"])
@pytest.mark.parametrize("T", [1, 5, 16])
def test_real_sizes_against_reference(shape, Bt, state_dtype, act_dtype, T):
    H, P, N, G = SHAPES[shape]
    L = 16
    win = Window(Bt, H, P, N, G, L, state_dtype, act_dtype, _cursors(Bt, L, T, seed=Bt + T), seed=Bt * T)
    worst = _two_verifies(win, T, seed=T, tag=f"{shape} Bt={Bt} T={T}")
    record(f"verify_real_{shape}_{Bt}_{state_dtype}_{act_dtype}_{T}", worst)


@pytest.mark.parametrize("state_dtype", [F32, BF16, F16], ids=lambda d: f"s{str(d)[-7:]}")
@pytest.mark.parametrize("act_dtype", [F32, BF16, F16], ids=lambda d: f"a{str(d)[-7:]}")
@pytest.mark.parametrize("optional", [True, False], ids=["z-D-bias", "bare"])
def test_dtype_pairs(state_dtype, act_dtype, optional):
    Bt, L, T = 9, 8, 3
    win = Window(Bt, 16, 32, 64, 4, L, state_dtype, act_dtype, _cursors(Bt, L, T, seed=3), seed=4, optional=optional)
    _two_verifies(win, T, seed=5, tag=f"{state_dtype}/{act_dtype}")


def test_int64_cursors_count_arrivals_in_a_vector():
    """int64 cursors cannot carry arrival counts: the per-row counter vector serves (real concurrency:
    flush-first rows of many programs each)."""
    Bt, L, T = 64, 16, 6
    win = Window(Bt, 96, 80, 128, 8, L, F32, BF16, _cursors(Bt, L, T, seed=8), seed=8)
    win.cursor = win.cursor.long()
    _two_verifies(win, T, seed=9, tag="int64 cursors")


def test_exact_recurrence_at_a_real_size(fp32_matmuls):
    """Speculative rounds (random acceptance per row, NaN-poisoned rejected inputs, rollbacks) at the
    Nemotron-3-Nano shape in fp32: accepted outputs equal the exact per-step recurrence."""
    layer = Mamba2Layer(7, H=96, P=80, N=128, G=8, L=16, seed=1).to("cuda")
    worst = rollout(layer, _kernel, rounds=16, max_T=8, seed=2, atol=2e-3, rtol=1e-3, poison_out=True)
    record("verify_exact_real", worst)


def test_verify_and_rollback_capture_in_a_cuda_graph():
    """No host synchronisation at a real size: verify + per-row rollback replay from one graph (the
    cursors move between replays, so rows flush first on some replays only) and equal eager calls."""
    Bt, L, T = 7, 16, 5
    win = Window(Bt, 96, 80, 128, 8, L, F32, BF16, _cursors(Bt, L, T, seed=11), seed=11)
    twin = win.clone()
    toks = win.tokens(T)
    back = torch.tensor([1, 3, 0, 4, 2, 5, 1], dtype=torch.int32, device="cuda")

    def body(w):
        y = w.verify(_kernel, toks, None)
        rollback_cursor_reference(w.cursor, back)
        return y

    def check(out, ref):
        assert torch.equal(win.cursor, twin.cursor) and torch.equal(out, ref) and torch.equal(win.state, twin.state)
        for a, b in zip(win.rings, twin.rings):
            assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) and torch.equal(a.isnan(), b.isnan())

    check_graph_replays(body, win, twin, check, replays=8)


def test_opcheck():
    from replayssm.kernels.mamba2 import verify_ops  # noqa: F401

    win = Window(3, 8, 32, 64, 2, 8, F32, BF16, [0, 6, -1], seed=15)
    x, dt, B, C, z = win.tokens(3)
    out = torch.zeros(x.shape, dtype=x.dtype, device="cuda")
    args = (x, dt, B, C, win.state, *win.rings, win.cursor, win.A, win.dt_bias, win.D, z, True, out, False, None, None)
    torch.library.opcheck(torch.ops.replayssm.mamba2_replay_verify.default, args)
    # an int8 checkpoint with its scales and a stochastic fold's random-number state
    from replayssm.kernels import quant as Q

    state = torch.empty(win.state.shape, dtype=torch.int8, device="cuda")
    scale = torch.empty(win.state.shape[:3], device="cuda")
    rng = Q.init_state_rng(3, 1, 0, "cuda")
    Q.store_state(state, scale, rng, win.state.float(), torch.ones(3, dtype=torch.bool, device="cuda"), -1)
    args = (x, dt, B, C, state, *win.rings, win.cursor, win.A, win.dt_bias, win.D, z, True, out, False, scale, rng)
    torch.library.opcheck(torch.ops.replayssm.mamba2_replay_verify.default, args)
