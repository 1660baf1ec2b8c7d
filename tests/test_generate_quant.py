"""generate() with low-precision checkpoints on every rewritable tiny family (CPU, the PyTorch
reference): teacher-forced fidelity to the fp32 stock model, determinism, beam search, and the
carry-over of a live int8 cache across a re-patch and an unpatch."""

import pytest
import torch

import replayssm
from replayssm.patches.cache_state import get_buffers

from helpers import REWRITABLE_FAMILIES, forced_logits, generate, generate_patched, left_padded_batch, tiny

STEPS = 24  # with L = 4: five flushes
#: teacher-forced bounds against the fp32 stock model, in units of the fp32 logits' std: the tiny
#: models' states are O(1) and their logits sensitive, so an 8-bit checkpoint moves logits by a
#: few hundredths of a std; a broken scale or a wrong read moves them by whole stds
MEAN_BOUND = {"int8": 0.03, "fp8": 0.06, "bf16": 0.01, "fp16": 0.01}
ARGMAX_BOUND = 0.8  # random tiny models have many near ties between their top-2 tokens


def _fidelity(model, ids, mask, seq, ref):
    logits = forced_logits(model, ids, mask, seq)
    std = ref.std()
    mean = float(((logits - ref).abs() / std).mean())
    agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    return mean, agree, logits


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_teacher_forced_fidelity_of_quantized_checkpoints(family):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=4)
    seq = generate(model, ids, mask, max_new_tokens=STEPS, min_new_tokens=STEPS).sequences
    ref = forced_logits(model, ids, mask, seq)
    for dtype, rounding in [("int8", "nearest"), ("int8", "stochastic"), ("fp8", "nearest"),
                            ("fp8", "stochastic"), ("bf16", "stochastic")]:
        replayssm.patch(model, buffer_len=4, state_dtype=dtype, state_rounding=rounding)
        try:
            mean, agree, logits = _fidelity(model, ids, mask, seq, ref)
            layer = next(l for l in replayssm.find_ssm_layers(model))
            assert layer.patched
        finally:
            replayssm.unpatch(model)
        assert torch.isfinite(logits).all()
        assert mean < MEAN_BOUND[dtype], (dtype, rounding, mean)
        assert agree >= ARGMAX_BOUND, (dtype, rounding, agree)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_quantized_generation_is_deterministic(family):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=6)
    kw = dict(max_new_tokens=12, min_new_tokens=12)
    for opts in (dict(state_dtype="int8"), dict(state_dtype="fp8", state_rounding="stochastic", state_seed=3)):
        a = generate_patched(model, ids, mask, dict(buffer_len=4, **opts), **kw)
        b = generate_patched(model, ids, mask, dict(buffer_len=4, **opts), **kw)
        assert torch.equal(a.sequences, b.sequences)
        assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))
    c = generate_patched(model, ids, mask, dict(buffer_len=4, state_dtype="fp8", state_rounding="stochastic",
                                                state_seed=4), **kw)
    assert not all(torch.equal(x, y) for x, y in zip(b.logits, c.logits)), "the seed changed nothing"


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_beam_search_keeps_scales_with_their_rows(family):
    """Beam search reorders the cache every step: scales and random streams must move with their
    rows. A 1-beam search equals greedy, and a 3-beam search's best beam stays close to fp32."""
    model = tiny(family)
    ids, mask = left_padded_batch(seed=2, batch=2)
    kw = dict(max_new_tokens=16, min_new_tokens=16, num_beams=3, num_return_sequences=1, output_logits=False)
    ref = generate(model, ids, mask, **kw)
    out = generate_patched(model, ids, mask, dict(buffer_len=4, state_dtype="int8", state_rounding="stochastic"),
                           **kw)
    agree = float((out.sequences == ref.sequences).float().mean())
    assert agree >= 0.9, agree


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_live_int8_cache_carries_over(family):
    """Decode with an int8 checkpoint (rows hold pending entries), re-patch with another L, then
    unpatch: the stock cache gets the exact fold of the dequantized checkpoint and the rings."""
    model = tiny(family)
    ids, mask = left_padded_batch(seed=5, batch=3)
    replayssm.patch(model, buffer_len=4, state_dtype="int8")
    try:
        first = generate(model, ids, mask, max_new_tokens=7, min_new_tokens=7)
        cache = first.past_key_values
        layer = next(l for l in cache.layers if get_buffers(l) is not None)
        assert layer.recurrent_states[0].dtype == torch.int8 and "state_scale" in get_buffers(layer).tensors
        replayssm.patch(model, buffer_len=7, state_dtype="int8")  # folds: every cursor back to 0
        assert int(get_buffers(layer).cursor.abs().sum()) == 0
        assert layer.recurrent_states[0].dtype == torch.int8
        from replayssm.patches.quant_state import decode_state

        mixer = next(m for m in model.modules() if hasattr(m, "state_scale_dim"))
        expected = decode_state(layer.recurrent_states[0], get_buffers(layer).tensors, mixer.state_scale_dim)
        replayssm.unpatch(model)
        assert layer.recurrent_states[0].dtype == torch.float32
        torch.testing.assert_close(layer.recurrent_states[0], expected, rtol=0, atol=0)
    finally:
        replayssm.unpatch(model)


def test_cli_refuses_stochastic_fp32(tmp_path, capsys):
    from replayssm.cli.main import main

    code = main(["convert", "tiny:mamba2", str(tmp_path / "out"), "--state-rounding", "stochastic", "--dry-run"])
    assert code != 0
    err = capsys.readouterr().err
    assert "state_rounding" in err and "below fp32" in err
