"""The verify custom operators (the Triton-backend entry points) on CPU tensors equal the references,
and trace as single nodes under torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch
from verify_helpers import DeltaLayer, Mamba2Layer

from replayssm.kernels.delta.verify import delta_replay_verify_reference
from replayssm.kernels.delta.verify_ops import delta_replay_verify_triton
from replayssm.kernels.mamba2.verify import mamba2_replay_verify_reference
from replayssm.kernels.mamba2.verify_ops import mamba2_replay_verify_triton

CASES = {"mamba2": (lambda: Mamba2Layer(3, L=8), mamba2_replay_verify_reference, mamba2_replay_verify_triton),
         "gdn": (lambda: DeltaLayer(3, L=8), delta_replay_verify_reference, delta_replay_verify_triton),
         "kda": (lambda: DeltaLayer(3, kda=True, L=8), delta_replay_verify_reference, delta_replay_verify_triton)}


@pytest.mark.parametrize("kind", list(CASES))
def test_operator_equals_reference(kind):
    make, ref_fn, op_fn = CASES[kind]
    a, b = make(), make()
    a.cursor.copy_(torch.tensor([6, -1, 2], dtype=torch.int32))
    b.cursor.copy_(a.cursor)
    toks = a.tokens(3)
    y_ref = ref_fn(*a.verify_args(toks))
    y_op = op_fn(*b.verify_args(toks))
    torch.testing.assert_close(y_op, y_ref, equal_nan=True)
    assert torch.equal(a.cursor, b.cursor)
    torch.testing.assert_close(a.state, b.state, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_operator_compiles_fullgraph(kind):
    make, ref_fn, op_fn = CASES[kind]
    a, b = make(), make()
    toks = a.tokens(2)
    compiled = torch.compile(lambda *args: op_fn(*args), fullgraph=True, backend="eager")
    y = compiled(*b.verify_args(toks))
    torch.testing.assert_close(y, ref_fn(*a.verify_args(toks)), equal_nan=True)


@pytest.mark.parametrize("kind", ["mamba2", "kda"])
def test_operator_schema_with_scales_and_random_state(kind):
    """``torch.library.opcheck`` of the operator given an int8 checkpoint's scales and a stochastic
    fold's random-number state (both mutated on flush-first rows)."""
    from replayssm.kernels.delta import verify_ops as delta_ops  # noqa: F401
    from replayssm.kernels.mamba2 import verify_ops as mamba2_ops  # noqa: F401

    layer = CASES[kind][0]().quantize(torch.int8, stochastic=True)
    layer.cursor.copy_(torch.tensor([6, -1, 2], dtype=torch.int32))
    toks = layer.tokens(3)
    out = torch.zeros(toks[layer.out_index].shape)
    op = torch.ops.replayssm.mamba2_replay_verify if kind == "mamba2" else torch.ops.replayssm.delta_replay_verify
    torch.library.opcheck(op.default, (*layer.verify_args(toks), out, False, layer.scale, layer.rng))
