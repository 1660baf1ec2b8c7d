"""The Gated DeltaNet decode prologue (conv step, q / k norms, gates) in one launch against the three
steps it fuses (``gdn_prologue_reference``), under the interpreter on CPU and on the GPU when present."""

import pytest
import torch

from replayssm.kernels.delta.prologue import (gdn_prologue, gdn_prologue_reference, gdn_prologue_triton,
                                             gdn_window_prologue, gdn_window_prologue_reference,
                                             gdn_window_prologue_triton)

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
    want = gdn_prologue_reference(**{**args, "conv_state": state_ref})
    got = gdn_prologue_triton(**args)
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


def _window_inputs(batch, heads, width, T, L, dtype, bias, seed=0):
    """A verify window's inputs: row 1 idle, row 2 too near the end of its ring to hold the window (it
    starts at slot 0), the history NaN-filled (columns the window writes must be written)."""
    Hk, K, HV, V = heads
    C = 2 * Hk * K + HV * V
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)

    cursor = torch.randint(0, L - T + 1, (batch,), generator=g, dtype=torch.int32)
    cursor[1], cursor[2] = -1, L - T + 1
    wide = rnd(batch, T, C + 7 + 2 * HV)  # the projections' output: conv inputs, then a and b, strided views
    return dict(conv_hist=torch.full((batch, C, width + L), float("nan"), dtype=dtype, device=DEV),
                conv_state=rnd(batch, C, width), cursor=cursor.to(DEV),
                committed=torch.randint(0, L + 1, (batch,), generator=g, dtype=torch.int32).to(DEV),
                x=wide[:, :, 3:C + 3], conv_weight=rnd(C, width, scale=0.5), conv_bias=rnd(C) if bias else None,
                a=wide[:, :, C + 7:C + 7 + HV], b=wide[:, :, C + 7 + HV:], A_log=torch.randn(HV, generator=g).to(DEV),
                dt_bias=torch.randn(HV, generator=g).to(DEV), heads=heads, q_scale=K ** -0.5, ring_len=L,
                beta_scale=2.0)


@pytest.mark.parametrize("heads", [(2, 16, 4, 16), (1, 8, 3, 32), (2, 32, 2, 8)])  # GQA, K < V, K > V
@pytest.mark.parametrize("width,bias,T", [(4, False, 5), (3, True, 1), (4, True, 3)])
def test_window_kernel_matches_the_three_steps(heads, width, bias, T):
    args = _window_inputs(4, heads, width, T, 8, torch.float32, bias, seed=T)
    x_before = args["x"].clone()
    ref = {n: args[n].clone() for n in ("conv_hist", "conv_state", "committed")}
    want = gdn_window_prologue_reference(**{**args, **ref})
    got = gdn_window_prologue_triton(**args)
    for name, w, o in zip(("q_n", "k_n", "v", "g", "beta"), want, got):
        assert o.shape == w.shape and o.dtype == w.dtype, name
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-6, msg=name)
    for name in ref:  # copies: exact, NaN where the window writes nothing (the idle row)
        torch.testing.assert_close(args[name], ref[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert torch.isnan(args["conv_hist"][1]).all() and not torch.isnan(args["conv_hist"][2, :, :width + T]).any()
    assert torch.equal(args["x"], x_before)
    norms = got[1].norm(dim=-1)  # every k head of every token normalised (none unwritten)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=1e-5, atol=1e-5)


def test_window_bad_shapes_raise():
    args = _window_inputs(3, (2, 16, 4, 16), 4, 3, 8, torch.float32, False)
    with pytest.raises(ValueError, match="gdn_window_prologue expects x"):
        gdn_window_prologue(**{**args, "heads": (2, 16, 4, 8)})
    with pytest.raises(ValueError, match="gdn_window_prologue expects a, b"):
        gdn_window_prologue(**{**args, "a": args["a"][:, :2]})
