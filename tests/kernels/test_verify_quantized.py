"""Verify windows on low-precision checkpoints (int8 / fp8 with scales, stochastically rounded
bf16 / int8): the PyTorch reference against the exact recurrence, which takes the stored
checkpoint wherever a verify folds once that is found within a quantum of it, and the Triton
kernels (under the interpreter on CPU: tiny fp32 shapes) against the reference. Rows at
different cursors, idle rows, flush-first rows, NaN-poisoned rejected suffixes and outputs."""

from __future__ import annotations

import pytest
import torch
from verify_helpers import DeltaLayer, Mamba2Layer, rollout

from replayssm.kernels.backend import triton_available, triton_interpreter_on
from replayssm.kernels.delta import verify_ops as delta_ops
from replayssm.kernels.delta.verify import delta_replay_verify_reference
from replayssm.kernels.mamba2 import verify_ops as mamba2_ops
from replayssm.kernels.mamba2.verify import mamba2_replay_verify_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CHECKPOINTS = [(torch.int8, False), (torch.float8_e4m3fn, False), (torch.bfloat16, True), (torch.int8, True)]
IDS = ["int8", "fp8", "bf16-stochastic", "int8-stochastic"]
KINDS = {
    "mamba2": (lambda Bt, L, seed: Mamba2Layer(Bt, L=L, seed=seed), mamba2_replay_verify_reference,
               lambda: mamba2_ops.mamba2_replay_verify_triton),
    "gdn": (lambda Bt, L, seed: DeltaLayer(Bt, L=L, seed=seed), delta_replay_verify_reference,
            lambda: delta_ops.delta_replay_verify_triton),
    "kda": (lambda Bt, L, seed: DeltaLayer(Bt, kda=True, L=L, seed=seed), delta_replay_verify_reference,
            lambda: delta_ops.delta_replay_verify_triton),
}


def _layer(kind, dtype, stochastic, Bt=3, L=6, seed=0, idle=(1,)):
    layer = KINDS[kind][0](Bt, L, seed).to(DEV).quantize(dtype, stochastic, seed=seed + 7)
    layer.cursor[list(idle)] = -1
    return layer


def _impl(kind, impl):
    if impl == "reference":
        return KINDS[kind][1]
    if not (triton_available() and (DEV == "cuda" or triton_interpreter_on())):
        pytest.skip("the Triton kernels need CUDA or TRITON_INTERPRET=1")
    return KINDS[kind][2]()


# every checkpoint on the reference; on the kernels (slow under the interpreter) the scaled reads
# of each kind, and a stochastic fold (the launch's own) on two kinds
CASES = [(k, c, "reference") for k in KINDS for c in IDS] + [(k, c, "triton") for k in KINDS for c in IDS[:2]] + [
    ("mamba2", "bf16-stochastic", "triton"), ("gdn", "int8-stochastic", "triton")]


@pytest.mark.parametrize("kind,checkpoint,impl", CASES, ids=["-".join(c) for c in CASES])
def test_verify_follows_the_recurrence_from_its_stored_folds(kind, checkpoint, impl):
    """Many rounds of T in 1..L with random per-row acceptance, one idle row, NaN-poisoned rejected
    tokens and outputs: every fold stores a rounding of the exact state (within a quantum), and
    every accepted output is the exact recurrence's from it (the Triton kernels through their
    custom operators: the checkpoint's codes read through its scales)."""
    dtype, stochastic = CHECKPOINTS[IDS.index(checkpoint)]
    layer = _layer(kind, dtype, stochastic, seed=1 if impl == "triton" else 0)
    counters = layer.rng[:, 1].clone() if stochastic else None
    folds, sync = [], layer.sync_folds
    layer.sync_folds = lambda rows: (folds.append(rows.clone()), sync(rows))
    rollout(layer, _impl(kind, impl), rounds=6 if impl == "triton" else 14, max_T=6, seed=3, atol=2e-4, rtol=1e-4,
            poison_out=True)
    folded = torch.stack(folds).sum(0)
    assert folded[1] == 0 and (folded[[0, 2]] >= 2).all(), f"folds per row: {folded.tolist()}"
    if stochastic:  # every fold drew anew: the active rows' counters moved, the idle row's did not
        moved = layer.rng[:, 1] - counters
        assert moved[1] == 0 and (moved[[0, 2]] > 1).all(), moved


@pytest.mark.parametrize("kind", KINDS)
def test_the_rounding_shows(kind):
    """Against the recurrence that never takes the stored checkpoints, the same run misses by far
    more than the tolerance: the rounding is really there, and an error of its size would show."""
    layer = _layer(kind, torch.int8, False, idle=())
    layer.sync_folds = lambda rows: None
    with pytest.raises(AssertionError, match="max error"):
        rollout(layer, KINDS[kind][1], rounds=14, max_T=6, seed=3, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_scales_are_refused(kind):
    layer = _layer(kind, torch.int8, False)
    toks = layer.tokens(2)
    for fn in (_impl(kind, "reference"), _impl(kind, "triton")):
        with pytest.raises(ValueError, match="needs state_scale"):
            fn(*layer.verify_args(toks))


def test_a_scaled_fold_needs_the_state_dim_in_one_tile():
    """The Mamba-2 verify quantizes a flush-first row's checkpoint over N in one tile: a launch
    configuration that splits N is refused before anything is written."""
    if not (triton_available() and (DEV == "cuda" or triton_interpreter_on())):
        pytest.skip("the Triton kernels need CUDA or TRITON_INTERPRET=1")
    from replayssm.kernels.mamba2.config import VerifyConfig
    from replayssm.kernels.mamba2.verify_launch import launch_verify

    layer = Mamba2Layer(2, N=32, L=4).to(DEV).quantize(torch.int8)
    toks = layer.tokens(2)
    before = layer.state.clone(), layer.cursor.clone()
    with pytest.raises(ValueError, match="expected block_n >= N = 32, found block_n = 16"):
        launch_verify(*layer.verify_args(toks), torch.empty_like(toks[0]), True, config=VerifyConfig(16, 1, 16, 4),
                      state_scale=layer.scale)
    assert torch.equal(layer.state, before[0]) and torch.equal(layer.cursor, before[1])
