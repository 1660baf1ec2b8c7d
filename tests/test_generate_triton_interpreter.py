"""generate() with backend="triton" on CPU tensors, through the Triton interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 when there is no GPU, so the same Triton
kernels that run on CUDA run here (tiny fp32 shapes; slow, hence few tokens).
"""

import os

import pytest
import torch

import replayssm.kernels.delta as delta_kernels
import replayssm.kernels.mamba2 as mamba2_kernels
import replayssm.patches.delta as delta_patch

from helpers import generate, generate_patched, left_padded_batch, max_logit_diff, tiny

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU interpreter run (on a GPU the CUDA tests cover this)",
)


# one family per kernel kind, and OLMo-Hybrid's Gated DeltaNet (its own mixer code); qwen3_next's mixer
# takes the same ReplaySSM layer as qwen3_5's (patches/kinds.py; test_generate_parity.py covers it)
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "olmo_hybrid", "kimi_linear"])
def test_triton_backend_matches_stock(family, monkeypatch):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=1, batch=2)
    ref = generate(model, ids, mask, max_new_tokens=10, min_new_tokens=10)

    def no_reference(*args, **kwargs):
        raise AssertionError("the PyTorch reference ran instead of the Triton kernel")

    monkeypatch.setattr(mamba2_kernels, "mamba2_replay_decode_reference", no_reference)
    monkeypatch.setattr(delta_kernels, "delta_replay_decode_reference", no_reference)
    if family in ("qwen3_5", "olmo_hybrid"):  # Gated DeltaNet: the one-launch prologue
        def no_separate_norm(*args, **kwargs):
            raise AssertionError("the three-launch prologue ran instead of gdn_prologue")

        monkeypatch.setattr(delta_patch, "l2norm_qk", no_separate_norm)
    out = generate_patched(model, ids, mask, dict(buffer_len=4, backend="triton"), max_new_tokens=10,
                           min_new_tokens=10)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_triton_backend_speculative_equals_plain_greedy(family, monkeypatch):
    """Scripted drafts of 1..3 tokens (L = 4: windows that flush first, full and no acceptance) on
    the Triton window path: the window conv and the verify kernels, token for token plain greedy; each
    round's crop rolls every SSM layer back (or marks it committed) in one launch."""
    import replayssm
    import replayssm.kernels.rollback as rollback_kernels
    import replayssm.kernels.window_conv as window_conv
    from replayssm.patches.compat import assisted_generation_gap
    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny(family)
    if assisted_generation_gap(model):
        pytest.skip(assisted_generation_gap(model))
    ids = torch.randint(3, 512, (1, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    # plain greedy decoding: the stock model's (fp32; test_triton_backend_matches_stock has the patched
    # model's plain greedy equal to it), a fraction of the interpreter's time
    ref = generate(model, ids, mask, max_new_tokens=16, min_new_tokens=16)
    replayssm.patch(model, buffer_len=4, backend="triton")
    try:
        def no_reference(*args, **kwargs):
            raise AssertionError("the PyTorch window conv ran instead of the Triton kernel")

        monkeypatch.setattr(window_conv, "layer_window_conv_reference", no_reference)
        grouped, one_launch = [], rollback_kernels.layers_rollback_triton

        def counted(layers, n, table=None):
            grouped.append((len(layers), n))
            return one_launch(layers, n, table)

        def per_layer(*args, **kwargs):
            raise AssertionError("a layer rolled back alone, not in the cache's one launch")

        monkeypatch.setattr(rollback_kernels, "layers_rollback_triton", counted)
        monkeypatch.setattr(rollback_kernels, "layer_rollback_triton", per_layer)
        drafter = ScriptedDrafter(model, ref.sequences, 3, seed=1, min_draft=1)
        with drafting(model, drafter):
            out = generate(model, ids, mask, max_new_tokens=16, min_new_tokens=16, prompt_lookup_num_tokens=3)
        ssm_layers = sum(1 for m in model.modules() if hasattr(m, "replay_options"))
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert any(a == 0 for _, a in drafter.log) and any(a == k for k, a in drafter.log)
    # one launch per crop for every layer (rounds the drafter had no room for crop nothing, also at once)
    assert ssm_layers >= 2 and len(grouped) >= len(drafter.log) and all(n == ssm_layers for n, _ in grouped)
    assert [g for g in grouped if g[1]] == [(ssm_layers, k - a) for k, a in drafter.log if a < k], drafter.log


@pytest.mark.parametrize("family,state_dtype", [("nemotron_h", "int8")])
def test_triton_backend_speculative_on_an_8bit_checkpoint(family, state_dtype, monkeypatch):
    """A one-token prompt, then every draft of 3 accepted with L = 8 (windows on the flush grid, see
    test_speculative_generate): the verify kernels read the 8-bit checkpoint through its scales and
    fold it themselves (no reference verify or fold runs), token for token plain greedy decoding
    through the decode kernels."""
    import replayssm
    from replayssm.kernels.delta import verify_ops as delta_verify_ops
    from replayssm.kernels.mamba2 import verify_ops as mamba2_verify_ops
    from replayssm.patches.compat import assisted_generation_gap
    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny(family)
    if assisted_generation_gap(model):
        pytest.skip(assisted_generation_gap(model))
    ids = torch.randint(3, 512, (1, 1), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    replayssm.patch(model, buffer_len=8, state_dtype=state_dtype, backend="triton")
    try:
        ref = generate(model, ids, mask, max_new_tokens=13, min_new_tokens=13)

        def no_reference(*args, **kwargs):
            raise AssertionError("a PyTorch reference ran instead of the Triton verify")

        monkeypatch.setattr(mamba2_verify_ops, "mamba2_replay_verify_reference", no_reference)
        monkeypatch.setattr(delta_verify_ops, "delta_replay_verify_reference", no_reference)
        drafter = ScriptedDrafter(model, ref.sequences, 3, min_draft=3, agree_all=True, plain_first=True)
        with drafting(model, drafter):
            out = generate(model, ids, mask, max_new_tokens=13, min_new_tokens=13, prompt_lookup_num_tokens=3)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert [k for k, _ in drafter.log][:4] == [0, 3, 3, 3], drafter.log  # the third window folds first
