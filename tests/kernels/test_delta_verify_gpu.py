"""The delta-rule verify kernel on CUDA at real sizes (GDN: 32 value heads on 16 key heads, KDA: 32
heads, K = V = 128, L = 16; batches 1-256) against the PyTorch reference and the exact recurrence,
fp32 and bf16, and captured in a CUDA graph. Run: ``python3 -m pytest -m gpu FILE``."""

from __future__ import annotations

import pytest
import torch
from delta_verify_helpers import assert_same, capture, filled_layer, run_both
from verify_helpers import DeltaLayer, rollout

from replayssm.kernels.delta import delta_replay_verify
from replayssm.kernels.delta.config import VerifyConfig
from replayssm.kernels.speculation import rollback_cursor_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fp32_matmuls")]  # the reference's einsums in fp32

L = 16
SHAPES = {"gdn": dict(kda=False, Hk=16, HV=32, K=128, V=128), "kda": dict(kda=True, Hk=32, HV=32, K=128, V=128)}
#: (checkpoint, rings and activations)
DTYPES = {"fp32": (torch.float32, torch.float32), "fp32-state-bf16-act": (torch.float32, torch.bfloat16),
          "bf16": (torch.bfloat16, torch.bfloat16)}
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _cursors(Bt, T, seed):
    """Random cursors in [-1, L] with, from 3 rows on, an idle row, an empty one and a flush-first one."""
    c = torch.randint(-1, L + 1, (Bt,), generator=torch.Generator().manual_seed(seed))
    if Bt >= 3:
        c[:3] = torch.tensor([-1, 0, L - T + 1])
    elif Bt == 1:
        c[0] = L - T + 1  # flush-first
    return c.tolist()


@pytest.mark.parametrize("dtypes", list(DTYPES))
@pytest.mark.parametrize("Bt,T", [(1, 5), (7, 1), (7, 5), (7, L), (64, 5), (256, 4)])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_real_sizes_equal_the_reference(kind, Bt, T, dtypes):
    shape = dict(SHAPES[kind])
    kda = shape.pop("kda")
    state_dtype, act = DTYPES[dtypes]
    layer = filled_layer(kda, _cursors(Bt, T, Bt + T), L, state_dtype, act, seed=Bt, device="cuda", **shape)
    ref, got = run_both(layer, T)
    assert_same(ref, got, **TOL[act if state_dtype == torch.float32 else torch.bfloat16])
    if state_dtype == torch.bfloat16:  # flush-first rows: one rounding of the same fp32 fold, bit for bit
        flush = (layer.cursor + T > L).cpu()
        if flush.any():
            assert (got[1][flush] == ref[1][flush]).float().mean() > 0.98


@pytest.mark.parametrize("kind", list(SHAPES))
def test_commit_launch_equals_the_reference(kind):
    """The two-launch path (no arrivals on the cursor word) and untouched idle outputs."""
    shape = dict(SHAPES[kind])
    kda = shape.pop("kda")
    layer = filled_layer(kda, _cursors(9, 5, 1), L, torch.float32, torch.bfloat16, device="cuda", **shape)
    ref, got = run_both(layer, 5, write_idle=False, config=VerifyConfig(arrive=False))
    assert_same(ref, got, **TOL[torch.bfloat16])
    assert torch.isnan(got[0][0]).all()  # the idle row's output was not written


@pytest.mark.parametrize("kind", list(SHAPES))
def test_real_size_rollouts_follow_the_exact_recurrence(kind):
    shape = dict(SHAPES[kind])
    layer = DeltaLayer(7, L=L, seed=1, **shape).to("cuda")
    rollout(layer, lambda *a: delta_replay_verify(*a, backend="triton"), rounds=16, max_T=6, seed=2, atol=1e-3,
            rtol=1e-3)


@pytest.mark.parametrize("dtypes", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_verify_and_rollback_replay_from_a_cuda_graph(kind, dtypes):
    """A verify of 5 tokens and a per-row rollback captured once and replayed across flushes equal
    the same calls made eagerly on a copy, bit for bit (no host synchronisation, nothing baked in)."""
    shape = dict(SHAPES[kind])
    kda = shape.pop("kda")
    state_dtype, act = DTYPES[dtypes]
    cursors = [-1, 0, 3, 11, 12, 15, 16]
    layer, twin = (filled_layer(kda, cursors, L, state_dtype, act, device="cuda", **shape) for _ in range(2))
    toks = tuple(t.to(act) if i < 3 else t for i, t in enumerate(layer.tokens(5)))
    back = torch.tensor([0, 1, 4, 0, 2, 3, 1], dtype=torch.int32, device="cuda")

    def body(lay):
        y = delta_replay_verify(*toks, lay.state, *lay.rings, lay.cursor, backend="triton")
        rollback_cursor_reference(lay.cursor, back)
        return y

    graph, out = capture(lambda: body(layer))
    body(twin)  # the eager copy of the warm-up call
    for _ in range(6):
        graph.replay()
        ref = body(twin)
        assert torch.equal(out, ref)
        assert torch.equal(layer.cursor, twin.cursor)
        assert torch.equal(layer.state, twin.state)
        for a, b in zip(layer.rings, twin.rings):
            assert torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0))
