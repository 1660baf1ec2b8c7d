"""The delta-rule verify kernel (Triton, run by the interpreter on CPU tensors; tiny fp32 shapes)
against the PyTorch reference and the exact per-step recurrence: rows at different cursors in one
launch (idle, empty, mid-ring, flush-first, a full ring after the step), T = 1, 3 and L, GDN and
KDA, both ways the cursors move on (arrivals in the launch, or the per-row commit launch),
NaN-poisoned outputs and ring slots, rollbacks over NaN-poisoned rejected tokens, 16-bit
checkpoints and rings, and a patched model's speculative generate() running through it."""

from __future__ import annotations

import os

import pytest
import torch
from delta_verify_helpers import assert_same, filled_layer, run_both
from verify_helpers import DeltaLayer, rollout

import replayssm.kernels.delta.verify_ops as verify_ops
from replayssm.kernels.delta.config import VerifyConfig
from replayssm.kernels.delta.verify_launch import launch_verify
from replayssm.kernels.delta.verify_ops import delta_replay_verify_triton
from replayssm.kernels.quant import QuantStateError

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available(),
                                reason="Triton interpreter run (the GPU tests cover CUDA)")

L = 8
#: one row per case: idle, empty ring, mid-ring, flush-first unless T is small, flush-first
CURSORS = [-1, 0, 3, 6, 7]
FP32 = dict(atol=2e-6, rtol=2e-5)


def _run_both(kda, T, cursors=CURSORS, state_dtype=torch.float32, ring_dtype=torch.float32, **kw):
    layer = filled_layer(kda, cursors, L, state_dtype, ring_dtype, Hk=1, HV=2)  # two value heads on one key head
    return run_both(layer, T, **kw)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("T", [1, 3, L])
def test_kernel_equals_reference(kda, T):
    ref, got = _run_both(kda, T)
    assert_same(ref, got, **FP32)
    out, _, _, cursor = got
    assert torch.isfinite(out[1:]).all() and torch.equal(out[0], torch.zeros_like(out[0]))  # idle row: zeros
    flush = [c + T > L for c in CURSORS[1:]]
    assert cursor.tolist() == [-1] + [T if f else c + T for c, f in zip(CURSORS[1:], flush)]


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_large_batch_launch_rule_equals_reference(kda):
    """The launch the rules pick from batch 32 (KDA: 64 value columns on 2 warps, wider than this
    layer's value dim) on the small layer: the same outputs, checkpoints and cursors."""
    from replayssm.kernels.delta.config import default_verify_config

    ref, got = _run_both(kda, 3, config=default_verify_config(16, 32, kda))
    assert_same(ref, got, **FP32)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_commit_launch_and_untouched_idle_outputs(kda):
    """Without arrivals on the cursor word the per-row commit launch moves the cursors and writes the
    flush rows' keys and gates; an ``out`` passed in keeps the idle row's contents (NaN here)."""
    ref, got = _run_both(kda, 3, config=VerifyConfig(block_v=16, arrive=False), write_idle=False,
                         cursors=[6, -1, 2, 0])
    assert_same(ref, got, **FP32)
    assert torch.isnan(got[0][1]).all()


@pytest.mark.parametrize("state_dtype,ring_dtype", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_16_bit_checkpoints_and_rings(kda, state_dtype, ring_dtype):
    """16-bit checkpoints (the flush rounds the fp32 fold once) with 16-bit rings and activations.
    (The interpreter rounds to bf16 toward zero, a GPU to nearest: bf16 values agree to one unit
    in the last place here; the GPU tests compare them bit for bit.)"""
    ref, got = _run_both(kda, 3, state_dtype=state_dtype, ring_dtype=ring_dtype)
    assert_same(ref, got, atol=1e-2, rtol=1e-2)
    (_, s_ref, _, _), (_, s_got, _, _) = ref, got
    assert s_got.dtype == state_dtype
    if state_dtype == torch.float16:  # the flush-first rows (6, 7 + 3 > L): one rounding of the same fold
        assert (s_got[3:] == s_ref[3:]).float().mean() > 0.98


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_rollouts_follow_the_exact_recurrence(kda):
    """Speculative rounds through the custom op (random windows and acceptances per row, rejected
    tokens NaN-poisoned and rolled back, flushes crossed) equal the exact per-step recurrence of the
    accepted stream; the op's Triton path runs (the reference is unavailable)."""
    layer = DeltaLayer(3, kda=kda, Hk=1, HV=2, L=5, seed=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify_ops, "delta_replay_verify_reference", None)
        rollout(layer, delta_replay_verify_triton, rounds=7, max_T=4, seed=3)


def test_refusals():
    layer = filled_layer(False, CURSORS, L)
    toks = layer.tokens(2)
    out = torch.empty_like(toks[2])
    with pytest.raises(QuantStateError, match="needs state_scale"):
        launch_verify(*toks, layer.state.to(torch.int8), *layer.rings, layer.cursor, out, write_idle=True)
    with pytest.raises(ValueError, match="cursor must be int32"):
        launch_verify(*toks, layer.state, *layer.rings, layer.cursor.long(), out, write_idle=True)
    with pytest.raises(ValueError, match=r"out must be \(Bt, T, HV, V\)"):
        launch_verify(*toks, layer.state, *layer.rings, layer.cursor, out[:, :1], write_idle=True)


def test_patched_model_verifies_through_the_kernel():
    """Assisted generate() on a patched tiny Qwen3.5 (grouped value heads) with backend "triton":
    every verify window goes through the Triton kernel (the PyTorch reference is unavailable) and
    the tokens equal plain greedy decoding's. (KDA's layout is the kernel tests'; one family keeps
    this interpreter run short.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import replayssm
    from helpers import generate, tiny
    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny("qwen3_5")
    ids = torch.randint(3, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    replayssm.patch(model, buffer_len=4)
    try:
        ref = generate(model, ids, mask, max_new_tokens=12, min_new_tokens=12)
    finally:
        replayssm.unpatch(model)
    replayssm.patch(model, buffer_len=4, backend="triton")
    drafter = ScriptedDrafter(model, ref.sequences, 3, seed=1)
    try:
        with drafting(model, drafter), pytest.MonkeyPatch.context() as mp:
            mp.setattr(verify_ops, "delta_replay_verify_reference", None)
            out = generate(model, ids, mask, max_new_tokens=12, min_new_tokens=12, prompt_lookup_num_tokens=3)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert any(a == k > 1 for k, a in drafter.log) and any(a == 0 for _, a in drafter.log)
