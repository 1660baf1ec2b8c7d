"""Shared pieces of the low-precision checkpoint kernel tests (interpreter and GPU): run the Triton
kernel and the PyTorch reference side by side from one quantized checkpoint and compare the
outputs, the stored checkpoints (to within one quantum of the stored grid: the two sum the fp32
state in different orders, so a value on a rounding boundary may land on either side) and the
random-number state."""

from __future__ import annotations

import torch

from replayssm.kernels import quant as Q


def _quantum(state, scale, dim):
    """Spacing of the stored grid (an upper bound per element)."""
    if state.dtype == torch.int8:
        return scale.unsqueeze(dim)
    deq = Q.load_state(state, scale, dim).abs()
    mant = {torch.float8_e4m3fn: 3, torch.bfloat16: 7, torch.float16: 10}[state.dtype]
    floor = {torch.float8_e4m3fn: 2.0 ** -9, torch.bfloat16: 0.0, torch.float16: 2.0 ** -24}[state.dtype]
    s = scale.unsqueeze(dim) if scale is not None else torch.ones((), device=deq.device)
    return torch.maximum(deq * 2.0 ** -mant, floor * s) * 2 + 1e-30


def compare(family, dtype, sr, Bsz, steps, device, L=4, shape=None, seed=0, ring_dtype=torch.float32):
    """Run ``steps`` decode steps (rows at staggered cursors, so flushes happen every step) with the
    value / key rings in ``ring_dtype`` (decays stay fp32); return
    (max |y diff| / max |y|, fraction of checkpoint elements off by more than a quantum,
    whether the counters agree)."""
    from replayssm.kernels.delta import delta_replay_decode_reference
    from replayssm.kernels.delta.launch import delta_replay_decode_triton
    from replayssm.kernels.mamba2 import mamba2_replay_decode_reference
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    if family == "mamba2":
        H, P, N, G = shape or (4, 16, 32, 2)
        dim = -1
        A = -(torch.rand(H, generator=g) * 0.05 + 0.01).to(device)
        dtb, D = rnd(H) * 0.3, rnd(H)
        S0 = rnd(Bsz, H, P, N)
        bufs = lambda: (torch.zeros(Bsz, H, L, P, dtype=ring_dtype, device=device),  # noqa: E731
                        torch.zeros(Bsz, H, L, device=device), torch.zeros(Bsz, G, L, N, dtype=ring_dtype, device=device))
        inputs = lambda: (rnd(Bsz, H, P), rnd(Bsz, H), rnd(Bsz, G, N), rnd(Bsz, G, N))  # noqa: E731
        ref = lambda i, st, b, cur, sc, rg: mamba2_replay_decode_reference(  # noqa: E731
            *i, st, *b, cur, A, dtb, D, None, True, None, None, sc, rg)
        tri = lambda i, st, b, cur, sc, rg: mamba2_replay_decode_triton(  # noqa: E731
            *i, st, *b, cur, A, dtb, D, None, True, None, None, sc, rg)
    else:
        kda = family == "kda"
        HV, Hk, K, V = shape or (4, 2, 16, 16)
        dim = -2
        S0 = rnd(Bsz, HV, K, V) * 0.3
        bufs = lambda: (torch.zeros(Bsz, HV, L, V, dtype=ring_dtype, device=device),  # noqa: E731
                        torch.zeros(Bsz, Hk, L, K, dtype=ring_dtype, device=device),
                        torch.zeros(Bsz, HV, L, K, device=device) if kda else torch.zeros(Bsz, HV, L, device=device))

        def inputs():
            q = torch.nn.functional.normalize(rnd(Bsz, Hk, K), dim=-1) * K ** -0.5
            k = torch.nn.functional.normalize(rnd(Bsz, Hk, K), dim=-1)
            gg = -torch.rand((Bsz, HV, K) if kda else (Bsz, HV), generator=g).to(device) * 0.05
            return q, k, rnd(Bsz, HV, V), gg, torch.rand(Bsz, HV, generator=g).to(device)

        ref = lambda i, st, b, cur, sc, rg: delta_replay_decode_reference(*i, st, *b, cur, None, sc, rg)  # noqa: E731
        tri = lambda i, st, b, cur, sc, rg: delta_replay_decode_triton(  # noqa: E731
            *i, st, *b, cur, None, state_scale=sc, state_rng=rg)
    q, scale = Q.quantize(S0, dtype, dim)
    runs = []
    for fn in (ref, tri):
        runs.append(dict(fn=fn, st=q.clone(), sc=scale.clone() if scale is not None else None,
                         rg=Q.init_state_rng(Bsz, 5, 0, device) if sr else None, b=bufs(),
                         cur=(torch.arange(Bsz, dtype=torch.int32, device=device) % L)))
    y_err, off = 0.0, 0.0
    for _ in range(steps):
        inp = inputs()
        ys = [r["fn"](inp, r["st"], r["b"], r["cur"], r["sc"], r["rg"]) for r in runs]
        y_err = max(y_err, float((ys[0].float() - ys[1].float()).abs().max() / ys[0].float().abs().max()))
        a, b = (Q.load_state(r["st"], r["sc"], dim) for r in runs)
        off = max(off, float(((a - b).abs() > _quantum(runs[0]["st"], runs[0]["sc"], dim) * 1.01).float().mean()))
        # re-synchronise the Triton run to the reference's checkpoint, so that differences do not compound
        runs[1]["st"].copy_(runs[0]["st"])
        if scale is not None:
            runs[1]["sc"].copy_(runs[0]["sc"])
    same_rng = (not sr) or torch.equal(runs[0]["rg"], runs[1]["rg"])
    return y_err, off, same_rng
