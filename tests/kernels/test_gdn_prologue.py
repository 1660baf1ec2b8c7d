"""The Gated DeltaNet decode prologue (conv step, q / k norms, gates) in one launch against the three
steps it fuses (``gdn_prologue_reference``), under the interpreter on CPU and on the GPU when present."""

import pytest
import torch

from replayssm.kernels.delta.prologue import gdn_prologue, gdn_prologue_reference, gdn_prologue_triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(batch, heads, width, dtype, bias, seed=0):
    Hk, K, HV, V = heads
    C = 2 * Hk * K + HV * V
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)

    x = rnd(batch, C + 5)[:, 2:C + 2]  # a strided view, as a grouped projection's columns are
    state = rnd(batch, C, width)
    return dict(conv_state=state, x=x, conv_weight=rnd(C, width, scale=0.5), conv_bias=rnd(C) if bias else None,
                a=rnd(batch, HV), b=rnd(batch, HV), A_log=torch.randn(HV, generator=g).to(DEV),
                dt_bias=torch.randn(HV, generator=g).to(DEV), heads=heads, q_scale=K ** -0.5, beta_scale=2.0)


@pytest.mark.parametrize("heads", [(2, 16, 4, 16), (1, 8, 3, 32), (2, 32, 2, 8)])  # GQA, K < V, K > V
@pytest.mark.parametrize("width,bias", [(4, False), (3, True)])
def test_kernel_matches_the_three_steps(heads, width, bias):
    args = _inputs(3, heads, width, torch.float32, bias)
    state_ref = args["conv_state"].clone()
    counts = [torch.tensor(7, device=DEV) for _ in range(2)]  # the token count, advanced by one
    want = gdn_prologue_reference(**{**args, "conv_state": state_ref}, count=counts[0])
    got = gdn_prologue_triton(**args, count=counts[1])
    assert [int(c) for c in counts] == [8, 8]
    for name, w, o in zip(("q_n", "k_n", "v", "g", "beta"), want, got):
        assert o.shape == w.shape and o.dtype == w.dtype, name
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(args["conv_state"], state_ref)  # the window shifted in place, x appended
    norms = got[1].norm(dim=-1)  # every k head normalised (no unwritten head)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEV != "cuda", reason="bf16 conv outputs need the GPU (the interpreter's bf16 is emulated)")
def test_bf16_rounds_the_conv_output_before_the_norms():
    args = _inputs(4, (16, 128, 32, 128), 4, torch.bfloat16, False)
    state_ref = args["conv_state"].clone()
    want = gdn_prologue_reference(**{**args, "conv_state": state_ref})
    got = gdn_prologue_triton(**args)
    assert torch.equal(got[2], want[2]) and torch.equal(args["conv_state"], state_ref)
    for w, o in zip(want[:2] + want[3:], got[:2] + got[3:]):
        torch.testing.assert_close(o, w, rtol=2e-6, atol=1e-6)


def test_bad_shapes_raise():
    args = _inputs(2, (2, 16, 4, 16), 4, torch.float32, False)
    with pytest.raises(ValueError, match="gdn_prologue expects x"):
        gdn_prologue(**{**args, "heads": (2, 16, 4, 8)})
    with pytest.raises(ValueError, match="gdn_prologue expects a, b"):
        gdn_prologue(**{**args, "a": args["a"][:, :3]})
