"""The small one-launch helpers of a decode step: the conv step (against F.conv1d) and the GDN gates."""

import os

import pytest
import torch
import torch.nn.functional as F

from replayssm.kernels.conv import conv_update, conv_update_reference

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                       reason="Triton kernels need TRITON_INTERPRET=1 or a GPU")


def _oracle(state, x, weight, bias, activation):
    """Depthwise causal conv over [state, x] with F.conv1d, last position; and the shifted state."""
    window = torch.cat([state, x[:, :, None]], dim=-1)[:, :, 1:]
    out = F.conv1d(window.double(), weight.double()[:, None, :], None if bias is None else bias.double(),
                   groups=weight.shape[0])[:, :, -1]
    if activation == "silu":
        out = F.silu(out)
    return out, window


def _case(batch, channels, width, seed, strided):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(batch, channels, width, generator=g)
    wide = torch.randn(batch, channels + 7, generator=g)
    x = wide[:, 3:3 + channels] if strided else wide[:, :channels].contiguous()
    return state, x, torch.randn(channels, width, generator=g), torch.randn(channels, generator=g)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
@pytest.mark.parametrize("batch,channels,width,strided,bias,activation", [
    (3, 40, 4, True, True, "silu"), (2, 1100, 4, False, False, None), (1, 17, 2, True, True, "silu")])
def test_conv_update_matches_conv1d(backend, batch, channels, width, strided, bias, activation):
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    state, x, weight, b = (t.to(device) for t in _case(batch, channels, width, batch + channels, strided))
    b = b if bias else None
    x_before = x.clone()
    want, window = _oracle(state, x, weight, b, activation)
    count = torch.tensor(5, device=device)  # a cache layer's token count, advanced in the same launch
    got = conv_update(state, x, weight, b, activation, count, backend=backend)
    assert int(count) == 6
    assert got.dtype == x.dtype and got.shape == (batch, channels)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(state, window.to(state.dtype)), "the state must hold the last K inputs"
    assert torch.equal(x, x_before)


def test_conv_update_rejects_bad_shapes():
    state, x, weight, b = _case(2, 8, 4, 0, False)
    with pytest.raises(ValueError, match="conv_state"):
        conv_update(state, x[:, :4], weight, b, "silu", backend="torch")
    with pytest.raises(ValueError, match="activation"):
        conv_update(state, x, weight, b, "gelu", backend="torch")
    with pytest.raises(ValueError, match=r"count must be None or a 0-d int64 tensor on cpu; got torch.int32 \(\)"):
        conv_update(state, x, weight, b, "silu", torch.tensor(0, dtype=torch.int32), backend="torch")


def test_reference_rounds_once_in_low_precision():
    state, x, weight, b = _case(2, 16, 4, 1, False)
    got = conv_update_reference(state.bfloat16(), x.bfloat16(), weight.bfloat16(), b.bfloat16(), "silu")
    want, _ = _oracle(state.bfloat16().float(), x.bfloat16().float(), weight.bfloat16().float(),
                      b.bfloat16().float(), "silu")
    torch.testing.assert_close(got.float(), want.float().bfloat16().float(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_gdn_gates_match_their_definition(backend):
    from replayssm.kernels.delta.gdn_gates import gdn_gates

    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    g0 = torch.Generator().manual_seed(3)
    wide = torch.randn(5, 40, generator=g0) * 12  # reaches past softplus's linear threshold (20)
    a, b = wide[:, :6].to(device), wide[:, 10:16].to(device)  # row-strided views
    A_log, dt_bias = torch.randn(6, generator=g0).to(device), torch.randn(6, generator=g0).to(device)
    g, beta = gdn_gates(a, b, A_log, dt_bias, 2.0, backend=backend)
    x = (a + dt_bias).double()
    want_g = -A_log.double().exp() * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    torch.testing.assert_close(g.double(), want_g, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(beta.double(), 2.0 / (1 + torch.exp(-b.double())), rtol=2e-6, atol=1e-7)
    assert g.dtype == beta.dtype == torch.float32
