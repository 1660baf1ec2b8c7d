"""Shared set-up of the verify / rollback tests: random layers, a speculative rollout against the
exact per-step recurrence, NaN-poisoned rejected suffixes. Used by the CPU reference tests, the
Triton-interpreter tests and the GPU tests (``verify_fn`` picks the implementation)."""

from __future__ import annotations

import torch

from replayssm.kernels.delta import delta_step_decode_reference
from replayssm.kernels.mamba2 import mamba2_step_decode_reference
from replayssm.kernels.speculation import rollback_cursor_reference


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


class Mamba2Layer:
    """A Mamba-2 layer's parameters, checkpoint and NaN-poisoned rings for ``Bt`` rows."""

    kind = "mamba2"

    def __init__(self, Bt, H=4, P=16, N=16, G=2, L=8, device="cpu", seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.dims = (Bt, H, P, N, G, L)
        self.A = -torch.rand(H, generator=gen) * 0.5 - 0.05
        self.dt_bias = torch.randn(H, generator=gen) * 0.3
        self.D = torch.randn(H, generator=gen)
        self.state = torch.randn(Bt, H, P, N, generator=gen) * 0.5
        self.exact = self.state.clone()
        nan = float("nan")
        self.rings = (torch.full((Bt, H, L, P), nan), torch.full((Bt, H, L), nan), torch.full((Bt, G, L, N), nan))
        self.cursor = torch.zeros(Bt, dtype=torch.int32)
        self.gen = gen
        self.to(device)

    def to(self, device):
        for name in ("A", "dt_bias", "D", "state", "exact", "cursor"):
            setattr(self, name, getattr(self, name).to(device))
        self.rings = tuple(r.to(device) for r in self.rings)
        self.device = torch.device(device)
        return self

    def tokens(self, T):
        """(x, dt, B, C, z) of T tokens per row."""
        Bt, H, P, N, G, _ = self.dims
        g = self.gen
        out = (torch.randn(Bt, T, H, P, generator=g), torch.randn(Bt, T, H, generator=g),
               torch.randn(Bt, T, G, N, generator=g) * 0.5, torch.randn(Bt, T, G, N, generator=g) * 0.5,
               torch.randn(Bt, T, H, P, generator=g))
        return tuple(t.to(self.device) for t in out)

    def verify_args(self, toks):
        x, dt, B, C, z = toks
        return (x, dt, B, C, self.state, *self.rings, self.cursor, self.A, self.dt_bias, self.D, z, True)

    def exact_step(self, toks, t, keep):
        """Step the exact recurrence by window token t on the rows in ``keep``; returns y (Bt, H, P)."""
        x, dt, B, C, z = toks
        s = self.exact.clone()
        y = mamba2_step_decode_reference(x[:, t], dt[:, t], B[:, t], C[:, t], s, self.A, self.dt_bias, self.D,
                                         z[:, t], True)
        self.exact = torch.where(keep.view(-1, 1, 1, 1), s, self.exact)
        return y

    def poison(self, toks, rejected):
        """NaN into the inputs of the rejected window tokens (bool (Bt, T))."""
        return tuple(torch.where(rejected.view(*rejected.shape, *([1] * (t.dim() - 2))), float("nan"), t)
                     for t in toks)


class DeltaLayer:
    """A GDN (``kda=False``) or KDA layer's checkpoint and NaN-poisoned rings for ``Bt`` rows."""

    def __init__(self, Bt, kda=False, Hk=2, HV=4, K=16, V=16, L=8, device="cpu", seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.kind = "kda" if kda else "gdn"
        self.kda = kda
        self.dims = (Bt, Hk, HV, K, V, L)
        self.state = torch.randn(Bt, HV, K, V, generator=gen) * 0.5
        self.exact = self.state.clone()
        nan = float("nan")
        self.rings = (torch.full((Bt, HV, L, V), nan), torch.full((Bt, Hk, L, K), nan),
                      torch.full((Bt, HV, L, K) if kda else (Bt, HV, L), nan))
        self.cursor = torch.zeros(Bt, dtype=torch.int32)
        self.gen = gen
        self.to(device)

    def to(self, device):
        self.state, self.exact, self.cursor = (t.to(device) for t in (self.state, self.exact, self.cursor))
        self.rings = tuple(r.to(device) for r in self.rings)
        self.device = torch.device(device)
        return self

    def tokens(self, T):
        """(q, k, v, g, beta) of T tokens per row, as the layer hands them over."""
        Bt, Hk, HV, K, V, _ = self.dims
        g = self.gen
        q = _l2n(torch.randn(Bt, T, Hk, K, generator=g)) * K ** -0.5
        k = _l2n(torch.randn(Bt, T, Hk, K, generator=g))
        v = torch.randn(Bt, T, HV, V, generator=g)
        gate = -torch.exp(torch.randn(*((Bt, T, HV, K) if self.kda else (Bt, T, HV)), generator=g) - 1.5)
        beta = torch.sigmoid(torch.randn(Bt, T, HV, generator=g))
        return tuple(t.to(self.device) for t in (q, k, v, gate, beta))

    def verify_args(self, toks):
        return (*toks, self.state, *self.rings, self.cursor)

    def exact_step(self, toks, t, keep):
        q, k, v, gate, beta = toks
        s = self.exact.clone()
        y = delta_step_decode_reference(q[:, t], k[:, t], v[:, t], gate[:, t], beta[:, t], s)
        self.exact = torch.where(keep.view(-1, 1, 1, 1), s, self.exact)
        return y

    def poison(self, toks, rejected):
        return tuple(torch.where(rejected.view(*rejected.shape, *([1] * (t.dim() - 2))), float("nan"), t)
                     for t in toks)


def rollout(layer, verify_fn, rounds: int, max_T: int, seed: int = 0, atol=2e-4, rtol=1e-4, fixed_T=None,
            full_acceptance_every: int = 5):
    """Speculative rounds: each verifies T tokens per row (T random in 1..max_T, the same for the
    batch), each row accepts a random count 0..T (every ``full_acceptance_every``-th round all T,
    every round some row none), the rejected suffix NaN-poisoned; the accepted outputs must equal
    the exact recurrence of the accepted stream and nothing NaN may ever reach a kept output.
    Returns the worst absolute error."""
    gen = torch.Generator().manual_seed(seed + 1000)
    Bt = layer.dims[0]
    worst = 0.0
    for r in range(rounds):
        T = fixed_T or int(torch.randint(1, max_T + 1, (1,), generator=gen))
        acc = torch.randint(0, T + 1, (Bt,), generator=gen)
        if full_acceptance_every and r % full_acceptance_every == 0:
            acc[:] = T
        acc[r % Bt] = 0 if r % full_acceptance_every else acc[r % Bt]
        acc = acc.to(layer.device)
        rejected = torch.arange(T, device=layer.device)[None, :] >= acc[:, None]
        toks = layer.poison(layer.tokens(T), rejected)
        y = verify_fn(*layer.verify_args(toks))
        for t in range(T):
            keep = t < acc
            ref = layer.exact_step(toks, t, keep)
            got = y[:, t][keep].float()
            want = ref[keep].float()
            assert torch.isfinite(got).all(), f"round {r}, token {t}: a NaN leaked into an accepted output"
            if got.numel():
                err = (got - want).abs()
                worst = max(worst, err.max().item())
                assert torch.allclose(got, want, atol=atol, rtol=rtol), \
                    f"round {r} (T={T}), token {t}: max error {err.max().item():.3g}"
        rollback_cursor_reference(layer.cursor, (T - acc).to(layer.cursor.dtype))
    return worst
