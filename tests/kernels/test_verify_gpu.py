"""The verify operators on CUDA (backend "triton": the custom ops) against the exact recurrence, a
verify + rollback captured in a CUDA graph, and assisted generate() with the Triton backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from verify_helpers import DeltaLayer, Mamba2Layer, check_graph_replays, rollout

from replayssm.kernels.delta import delta_replay_verify
from replayssm.kernels.mamba2 import mamba2_replay_verify
from replayssm.kernels.speculation import rollback_cursor_reference

pytestmark = pytest.mark.gpu


def _fn(kind):
    if kind == "mamba2":
        return lambda *a, **k: mamba2_replay_verify(*a, **k, backend="triton")
    return lambda *a, **k: delta_replay_verify(*a, **k, backend="triton")


def _layer(kind, Bt, L):
    return (Mamba2Layer(Bt, L=L) if kind == "mamba2" else DeltaLayer(Bt, kda=kind == "kda", L=L)).to("cuda")


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("L,max_T", [(8, 8), (16, 6)])
def test_verify_on_cuda_follows_the_exact_recurrence(kind, L, max_T, fp32_matmuls):
    rollout(_layer(kind, 5, L), _fn(kind), rounds=24, max_T=max_T, seed=L, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
def test_verify_and_rollback_capture_in_a_cuda_graph(kind):
    """No host synchronisation: the verify and a per-row rollback replay from a graph, and the
    replays equal eager calls on a copy."""
    layer, twin = _layer(kind, 3, 8), _layer(kind, 3, 8)
    toks = layer.tokens(4)
    back = torch.tensor([1, 3, 0], dtype=torch.int32, device="cuda")
    fn = _fn(kind)

    def body(lay):
        y = fn(*lay.verify_args(toks))
        rollback_cursor_reference(lay.cursor, back)
        return y

    def check(out, ref):
        torch.testing.assert_close(out, ref)
        assert torch.equal(layer.cursor, twin.cursor)
        torch.testing.assert_close(layer.state, twin.state)

    check_graph_replays(body, layer, twin, check)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_assisted_generate_on_cuda_with_the_triton_backend(family):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import replayssm
    from helpers import generate, tiny
    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny(family).to("cuda")
    ids = torch.randint(3, 512, (1, 9), generator=torch.Generator().manual_seed(0)).cuda()
    mask = torch.ones_like(ids)
    replayssm.patch(model, buffer_len=8, backend="triton")
    try:
        ref = generate(model, ids, mask, max_new_tokens=40, min_new_tokens=40)
        drafter = ScriptedDrafter(model, ref.sequences, 5, seed=1)
        with drafting(model, drafter):
            out = generate(model, ids, mask, max_new_tokens=40, min_new_tokens=40, prompt_lookup_num_tokens=5)
    finally:
        replayssm.unpatch(model)
        model.to("cpu")
    assert torch.equal(out.sequences, ref.sequences), drafter.log
