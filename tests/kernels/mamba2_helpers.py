"""Shared set-up and checks for the Mamba-2 kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import json
import math
import os

import torch
from torch.testing import assert_close

from replayssm.kernels.mamba2.reference import (
    mamba2_replay_decode_reference,
    mamba2_replay_materialize_reference,
    mamba2_step_decode_reference,
)

SENTINEL = 7.0

# kernel vs reference tolerances (rtol, atol) by (state dtype, activation dtype)
FP32_TOL = (1e-4, 1e-3)
LOWP_TOL = (6e-2, 2e-1)


def record(tag: str, data) -> None:
    """Append the worst errors of a test to $REPLAYSSM_TEST_LOG (JSON lines), if set."""
    path = os.environ.get("REPLAYSSM_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": tag, **({"worst": data} if not isinstance(data, dict) else data)}) + "\n")


def tol_for(state_dtype, act_dtype):
    if state_dtype == torch.float32 and act_dtype == torch.float32:
        return FP32_TOL
    if state_dtype == torch.float32:
        # activations rounded to 16 bit: outputs carry one 16-bit rounding
        return (2e-2, 3e-2)
    return LOWP_TOL


def _strided(t: torch.Tensor, pad_dim: int, pad: int = 3) -> torch.Tensor:
    """Same values as ``t`` in a non-contiguous view (padded along ``pad_dim``)."""
    shape = list(t.shape)
    shape[pad_dim] += pad
    big = torch.full(shape, float("nan"), dtype=t.dtype, device=t.device)
    idx = [slice(None)] * t.dim()
    idx[pad_dim] = slice(0, t.shape[pad_dim])
    view = big[tuple(idx)]
    view.copy_(t)
    return view


class Problem:
    """Checkpoint, ring buffers, cursors and parameters of one layer for a batch of rows."""

    def __init__(self, Bt, H, P, N, G, L, state_dtype, act_dtype, device, cursors, seed=0, has_z=True, has_D=True,
                 has_bias=True, strided=False):
        self.dims = (Bt, H, P, N, G, L)
        self.state_dtype, self.act_dtype, self.device = state_dtype, act_dtype, device
        self.has_z, self.strided = has_z, strided
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.gen = g

        def rn(*s, scale=1.0):
            return torch.randn(*s, generator=g) * scale

        self.A = (-(0.5 + 1.5 * torch.rand(H, generator=g))).to(device)
        self.dt_bias = (rn(H, scale=0.5)).to(device) if has_bias else None
        self.D = rn(H).to(device) if has_D else None
        state = rn(Bt, H, P, N).to(state_dtype)
        x_buf = rn(Bt, H, L, P).to(act_dtype)
        dt_buf = (0.01 + 0.09 * torch.rand(Bt, H, L, generator=g)).float()
        B_buf = rn(Bt, G, L, N, scale=1 / math.sqrt(N)).to(act_dtype)
        cur = torch.tensor(cursors, dtype=torch.int32)
        assert cur.numel() == Bt
        # entries at or past the cursor are unwritten: poison them
        pos = torch.arange(L)
        unwritten = pos[None, :] >= cur.clamp(min=0)[:, None]  # (Bt, L)
        x_buf[unwritten[:, None, :, None].expand_as(x_buf)] = float("nan")
        dt_buf[unwritten[:, None, :].expand_as(dt_buf)] = float("nan")
        B_buf[unwritten[:, None, :, None].expand_as(B_buf)] = float("nan")
        state, x_buf, dt_buf, B_buf = (t.to(device) for t in (state, x_buf, dt_buf, B_buf))
        if strided:  # non-contiguous views, as when the cache is one packed allocation
            state = _strided(state, 1)
            x_buf = _strided(x_buf, 2, 1)
            dt_buf = _strided(dt_buf, 2, 2)
            B_buf = _strided(B_buf, 1, 1)
        self.state, self.x_buf, self.dt_buf, self.B_buf = state, x_buf, dt_buf, B_buf
        self.cursor = cur.to(device)

    def clone(self):
        """Deep copy of the mutable tensors (same strides)."""
        c = object.__new__(Problem)
        c.__dict__.update(self.__dict__)
        for name in ("state", "x_buf", "dt_buf", "B_buf", "cursor"):
            t = getattr(self, name)
            n = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
            n.copy_(t)
            setattr(c, name, n)
        return c

    def mutable(self):
        return self.state, self.x_buf, self.dt_buf, self.B_buf, self.cursor

    def inputs(self):
        """Fresh random (x, dt, B, C, z) for one step, strided views if requested."""
        Bt, H, P, N, G, L = self.dims
        g = self.gen
        x = torch.randn(Bt, H, P, generator=g)
        dt = torch.randn(Bt, H, generator=g) * 0.5 - 2.5
        B = torch.randn(Bt, G, N, generator=g) / math.sqrt(N)
        C = torch.randn(Bt, G, N, generator=g) / math.sqrt(N)
        z = torch.randn(Bt, H, P, generator=g) if self.has_z else None
        a, d = self.act_dtype, self.device
        x, dt, B, C = x.to(a).to(d), dt.to(a).to(d), B.to(a).to(d), C.to(a).to(d)
        z = z.to(a).to(d) if z is not None else None
        if self.strided:
            x = _strided(x, 1)
            dt = _strided(dt, 1, 5)
            BC = torch.cat([B, C], dim=-1)  # like a packed xBC projection
            B, C = BC[..., :N], BC[..., N:]
            if z is not None:
                z = _strided(z, 2, 2)
        return x, dt, B, C, z


def exact_state(prob: Problem) -> torch.Tensor:
    """fp32 state of every row after its buffered entries (the exact recurrence's start)."""
    p = prob.clone()
    s32 = p.state.float().clone()
    return mamba2_replay_materialize_reference(s32, p.x_buf.float(), p.dt_buf, p.B_buf.float(), p.cursor.clone(), p.A)


def check_replay_trajectory(kernel_fn, prob: Problem, steps: int, tol=None, check_exact=None, use_out=True,
                            log=None):
    """Step ``kernel_fn`` and the reference side by side; check everything after every step.

    Returns the worst errors seen (dict).
    """
    Bt, H, P, N, G, L = prob.dims
    rtol, atol = tol or tol_for(prob.state_dtype, prob.act_dtype)
    if check_exact is None:
        check_exact = prob.state_dtype == torch.float32 and prob.act_dtype == torch.float32
    ref = prob.clone()
    ker = prob.clone()
    rec = exact_state(prob) if check_exact else None
    worst = {"y_ref": 0.0, "y_exact": 0.0, "state_ref": 0.0, "state_exact": 0.0}
    flushes = 0
    for step in range(steps):
        x, dt, B, C, z = prob.inputs()
        c0 = ker.cursor.clone()
        active = c0 >= 0
        flush = c0 == L - 1
        flushes += int(flush.sum())
        state_before = ker.state.clone()
        if use_out:
            out_r = torch.full((Bt, H, P), SENTINEL, dtype=x.dtype, device=x.device)
            out_k = out_r.clone()
            mamba2_replay_decode_reference(x, dt, B, C, *ref.mutable(), prob.A, prob.dt_bias, prob.D, z, True, out_r)
            y_k = kernel_fn(x, dt, B, C, *ker.mutable(), prob.A, prob.dt_bias, prob.D, z, True, out_k)
            assert y_k is out_k
            # idle rows: out untouched
            assert torch.equal(out_k[~active], out_r[~active]), f"step {step}: idle rows' out was written"
        else:
            out_r = mamba2_replay_decode_reference(x, dt, B, C, *ref.mutable(), prob.A, prob.dt_bias, prob.D, z)
            out_k = kernel_fn(x, dt, B, C, *ker.mutable(), prob.A, prob.dt_bias, prob.D, z)
            assert torch.equal(out_k[~active], torch.zeros_like(out_k[~active])), f"step {step}: idle rows not zero"
        msg = f"step {step} cursors {c0.tolist()}"
        assert torch.isfinite(out_k[active].float()).all(), msg + ": non-finite output"
        assert_close(out_k.float(), out_r.float(), rtol=rtol, atol=atol, msg=lambda m: msg + " y vs reference\n" + m)
        worst["y_ref"] = max(worst["y_ref"], (out_k.float() - out_r.float()).abs().max().item())
        # cursor and buffers after every step
        assert torch.equal(ker.cursor, ref.cursor), msg + f": cursor {ker.cursor.tolist()} != {ref.cursor.tolist()}"
        assert torch.equal(ker.x_buf.isnan(), ref.x_buf.isnan()), msg + ": x_buf written where it should not be"
        assert torch.equal(ker.B_buf.isnan(), ref.B_buf.isnan()), msg + ": B_buf written where it should not be"
        assert torch.equal(ker.dt_buf.isnan(), ref.dt_buf.isnan()), msg + ": dt_buf written where it should not be"
        assert torch.equal(ker.x_buf.nan_to_num(0.0), ref.x_buf.nan_to_num(0.0)), msg + ": x_buf differs"
        assert torch.equal(ker.B_buf.nan_to_num(0.0), ref.B_buf.nan_to_num(0.0)), msg + ": B_buf differs"
        assert_close(ker.dt_buf.nan_to_num(0.0), ref.dt_buf.nan_to_num(0.0), rtol=2e-6, atol=1e-7,
                     msg=lambda m: msg + " dt_buf\n" + m)
        # checkpoint: bit-exactly unchanged except on flush rows, which match the reference
        keep = ~flush
        assert torch.equal(ker.state[keep], state_before[keep]), msg + ": checkpoint of a non-flush row changed"
        if flush.any():
            assert_close(ker.state[flush].float(), ref.state[flush].float(), rtol=rtol, atol=atol,
                         msg=lambda m: msg + " checkpoint vs reference\n" + m)
            worst["state_ref"] = max(worst["state_ref"],
                                     (ker.state[flush].float() - ref.state[flush].float()).abs().max().item())
        if check_exact:
            r_in = rec.clone()
            y_e = mamba2_step_decode_reference(x.float(), dt.float(), B.float(), C.float(), r_in, prob.A,
                                               prob.dt_bias, prob.D, z.float() if z is not None else None)
            rec = torch.where(active.view(Bt, 1, 1, 1), r_in, rec)
            assert_close(out_k[active].float(), y_e[active], rtol=rtol, atol=atol,
                         msg=lambda m: msg + " y vs exact recurrence\n" + m)
            worst["y_exact"] = max(worst["y_exact"], (out_k[active].float() - y_e[active]).abs().max().item())
            if flush.any():
                assert_close(ker.state[flush].float(), rec[flush], rtol=rtol, atol=atol,
                             msg=lambda m: msg + " checkpoint vs exact recurrence\n" + m)
                worst["state_exact"] = max(worst["state_exact"],
                                           (ker.state[flush].float() - rec[flush]).abs().max().item())
        if log is not None:
            log(msg, worst)
    assert flushes > 0 or steps < L, "trajectory crossed no flush"
    worst["flushes"] = flushes
    return worst


def check_step_kernel(kernel_fn, prob: Problem, steps: int = 3, tol=None):
    """Per-step fused kernel vs ``mamba2_step_decode_reference`` (state in place), several steps."""
    rtol, atol = tol or tol_for(prob.state_dtype, prob.act_dtype)
    s_k = prob.clone().state
    s_r = prob.clone().state
    worst = 0.0
    for step in range(steps):
        x, dt, B, C, z = prob.inputs()
        y_r = mamba2_step_decode_reference(x, dt, B, C, s_r, prob.A, prob.dt_bias, prob.D, z)
        y_k = kernel_fn(x, dt, B, C, s_k, prob.A, prob.dt_bias, prob.D, z)
        assert y_k.dtype == y_r.dtype and y_k.shape == y_r.shape
        assert_close(y_k.float(), y_r.float(), rtol=rtol, atol=atol)
        assert_close(s_k.float(), s_r.float(), rtol=rtol, atol=atol)
        worst = max(worst, (y_k.float() - y_r.float()).abs().max().item())
    return worst
