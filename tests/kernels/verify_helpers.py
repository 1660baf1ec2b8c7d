"""Shared set-up of the verify / rollback tests: random layers, a speculative rollout against the
exact per-step recurrence, NaN-poisoned rejected suffixes. Used by the CPU reference tests, the
Triton-interpreter tests and the GPU tests (``verify_fn`` picks the implementation)."""

from __future__ import annotations

import torch

from replayssm.kernels import quant as Q
from replayssm.kernels.delta import delta_step_decode_reference
from replayssm.kernels.mamba2 import mamba2_step_decode_reference
from replayssm.kernels.speculation import flush_first_counts, rollback_cursor_reference


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


class _Checkpoint:
    """A layer's checkpoint, plain fp32 or stored low-precision (``quantize``). For the latter the
    exact recurrence takes the stored checkpoint's value wherever a verify folds, once it is found
    within a quantum of the exact state there (``sync_folds``): a fold that rounds a wrong state,
    or a read that ignores the scales, shows in the outputs or in that check."""

    scale = rng = None

    def quantize(self, dtype, stochastic=False, seed=0):
        """Store the checkpoint as ``dtype`` (scales for int8 / fp8; ``stochastic``: a [seed,
        counter] per row); the exact state becomes the stored one's value."""
        Bt = self.state.shape[0]
        q = torch.empty(self.state.shape, dtype=dtype, device=self.device)
        if Q.is_scaled(dtype):
            self.scale = torch.empty(Q.scale_shape(tuple(self.state.shape), self.scale_dim), device=self.device)
        self.rng = Q.init_state_rng(Bt, seed, 0, self.device) if stochastic else None
        Q.store_state(q, self.scale, self.rng, self.exact, torch.ones(Bt, dtype=torch.bool, device=self.device),
                      self.scale_dim)
        self.state = q
        self.exact = Q.load_state(q, self.scale, self.scale_dim)
        return self

    def quant_kwargs(self) -> dict:
        return dict(state_scale=self.scale, state_rng=self.rng) if self.state.dtype != torch.float32 else {}

    def checkpoint(self) -> torch.Tensor:
        """The checkpoint's fp32 value."""
        return Q.load_state(self.state, self.scale, self.scale_dim)

    def quantum(self) -> torch.Tensor | float:
        """Spacing of the stored grid around the checkpoint (an upper bound; 0 for fp32)."""
        if self.state.dtype == torch.int8:
            return self.scale.unsqueeze(self.scale_dim)
        mant = {torch.float32: 23, torch.float8_e4m3fn: 3, torch.bfloat16: 7, torch.float16: 10}[self.state.dtype]
        return self.checkpoint().abs() * 2.0 ** -mant * 2

    def fold_rows(self, T):
        """The rows a T-token verify folds first (None for an fp32 checkpoint)."""
        if self.state.dtype == torch.float32:
            return None
        return flush_first_counts(self.cursor, T, self.dims[-1]) > 0

    def sync_folds(self, rows):
        """After the verify: the folded rows' stored checkpoints must lie within a quantum of the
        exact state; the exact recurrence goes on from them."""
        if rows is None:
            return
        ckpt = self.checkpoint()
        off = ((ckpt - self.exact).abs() > self.quantum() + 1e-6) & rows.view(-1, 1, 1, 1)
        assert not off.any(), f"{int(off.sum())} folded checkpoint values off the exact state by more than a quantum"
        self.exact = torch.where(rows.view(-1, 1, 1, 1), ckpt, self.exact)


class Mamba2Layer(_Checkpoint):
    """A Mamba-2 layer's parameters, checkpoint and NaN-poisoned rings for ``Bt`` rows."""

    kind = "mamba2"
    out_index = 0  # the token tensor whose shape the output has (x)
    scale_dim = -1

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


class DeltaLayer(_Checkpoint):
    """A GDN (``kda=False``) or KDA layer's checkpoint and NaN-poisoned rings for ``Bt`` rows."""

    scale_dim = -2

    def __init__(self, Bt, kda=False, Hk=2, HV=4, K=16, V=16, L=8, device="cpu", seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.kind = "kda" if kda else "gdn"
        self.out_index = 2  # the output has v's shape
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


def _same(a, b, atol, rtol, what):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def rollout(layer, verify_fn, rounds: int, max_T: int, seed: int = 0, atol=2e-4, rtol=1e-4, fixed_T=None,
            full_acceptance_every: int = 5, twin=None, twin_fn=None, poison_out: bool = False):
    """Speculative rounds: each verifies T tokens per row (T random in 1..max_T, the same for the
    batch), each row accepts a random count 0..T (every ``full_acceptance_every``-th round all T,
    every round some row none), the rejected suffix NaN-poisoned; the accepted outputs must equal
    the exact recurrence of the accepted stream and nothing NaN may ever reach a kept output.
    Rows with a negative cursor are idle: their checkpoint, rings and outputs must stay as they were
    (outputs: zeros, or the NaN of ``poison_out``). With ``twin`` (a copy of ``layer``), ``twin_fn``
    verifies the same tokens on it every round and every output (NaN included), cursor, checkpoint
    and ring entry must agree with ``verify_fn``'s to (atol, rtol). ``poison_out``: the outputs go
    into NaN-filled buffers (an output left unwritten shows). A low-precision checkpoint
    (``layer.quantize``) passes its stored value to the exact recurrence where a verify folds
    (``sync_folds``), and the twins' checkpoints agree to within a quantum of its grid. Returns the worst absolute error."""
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
        idle = layer.cursor < 0
        before = [t[idle].clone() for t in (layer.checkpoint(), *layer.rings)]
        folds = layer.fold_rows(T)
        kw = dict(out=torch.full_like(toks[layer.out_index], float("nan"))) if poison_out else {}
        y = verify_fn(*layer.verify_args(toks), **kw, **layer.quant_kwargs())
        layer.sync_folds(folds)
        if twin is not None:
            twin_kw = dict(out=torch.full_like(toks[layer.out_index], float("nan"))) if poison_out else {}
            y_twin = twin_fn(*twin.verify_args(toks), **twin_kw, **twin.quant_kwargs())
            _same(y, y_twin, atol, rtol, f"round {r} (T={T}): outputs")
            assert torch.equal(layer.cursor, twin.cursor), f"round {r}: cursors {layer.cursor} != {twin.cursor}"
            if layer.state.dtype == torch.float32:
                _same(layer.state, twin.state, atol, rtol, f"round {r}: checkpoint")
            else:
                off = (layer.checkpoint() - twin.checkpoint()).abs() > layer.quantum() + atol
                assert not off.any(), f"round {r}: {int(off.sum())} checkpoint values apart by more than a quantum"
                if layer.rng is not None:
                    assert torch.equal(layer.rng, twin.rng), f"round {r}: random-number states differ"
            for name, a, b in zip(("x/u", "dt/k", "B/g"), layer.rings, twin.rings):
                _same(a, b, atol, rtol, f"round {r}: ring {name}")
        for t0, t1 in zip(before, (layer.checkpoint(), *layer.rings)):
            assert torch.equal(t0.isnan(), t1[idle].isnan()) and torch.equal(t0.nan_to_num(), t1[idle].nan_to_num()), \
                f"round {r}: an idle row was written"
        idle_out = y[idle]
        assert (idle_out.isnan() if poison_out else idle_out == 0).all(), f"round {r}: an idle row's output was written"
        for t in range(T):
            keep = (t < acc) & ~idle
            ref = layer.exact_step(toks, t, keep)
            got = y[:, t][keep].float()
            want = ref[keep].float()
            assert torch.isfinite(got).all(), f"round {r}, token {t}: a NaN leaked into an accepted output"
            if got.numel():
                err = (got - want).abs()
                worst = max(worst, err.max().item())
                assert torch.allclose(got, want, atol=atol, rtol=rtol), \
                    f"round {r} (T={T}), token {t}: max error {err.max().item():.3g}"
        back = (T - acc).to(layer.cursor.dtype)
        rollback_cursor_reference(layer.cursor, back)
        if twin is not None:
            rollback_cursor_reference(twin.cursor, back)
    return worst


def check_graph_replays(body, layer, twin, check, replays: int = 5) -> None:
    """Capture ``body(layer)`` in a CUDA graph (after one eager call on each of ``layer`` and ``twin``
    on a side stream) and replay it ``replays`` times, each after which ``body(twin)`` runs eagerly
    and ``check(graph_output, eager_output)`` compares them."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body(layer)
        body(twin)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body(layer)
    for _ in range(replays):
        graph.replay()
        check(out, body(twin))
