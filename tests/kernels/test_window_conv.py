"""The one-launch verify-window conv (``kernels/window_conv.py``) against its PyTorch reference and
against T single conv steps, under the Triton interpreter (or on a GPU): outputs, the history's
window columns, the new conv states and commit marks; idle rows untouched, rows that flush first,
strided inputs, channels over several blocks, windows of 1 to L tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from replayssm.kernels.speculation import verify_start  # noqa: E402
from replayssm.kernels.window_conv import (  # noqa: E402
    layer_window_conv,
    layer_window_conv_reference,
    layer_window_conv_triton,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(Bt, C, K, L, T, dtype, seed, strided):
    g = torch.Generator().manual_seed(seed)
    cursor = torch.randint(0, L + 1, (Bt,), generator=g, dtype=torch.int32)
    cursor[1] = -1  # an idle row
    cursor[2] = L - T + 1 if T > 1 else L  # cannot hold the window: starts at slot 0
    hist = torch.full((Bt, C, K + L), float("nan"), dtype=dtype)  # columns the window writes must be written
    state = torch.randn(Bt, C, K, generator=g).to(dtype)
    committed = torch.randint(0, L + 1, (Bt,), generator=g, dtype=torch.int32)
    wide = torch.randn(Bt, T, C + 7, generator=g).to(dtype)  # a projection's output, conv inputs a slice
    x = wide[:, :, 3:C + 3] if strided else wide[:, :, :C].contiguous()
    weight, bias = torch.randn(C, K, generator=g), torch.randn(C, generator=g)
    return [t.to(DEV) for t in (hist, state, cursor, committed, x, weight.to(dtype), bias.to(dtype))]


@pytest.mark.parametrize("T", [1, 3, 5, 8])
@pytest.mark.parametrize("C,K,strided,bias,activation", [(40, 4, True, True, "silu"), (300, 4, False, False, None),
                                                         (24, 3, True, True, "silu"), (20, 2, False, True, "swish")])
def test_window_conv_matches_reference(T, C, K, strided, bias, activation):
    Bt, L = 5, 8
    hist, state, cursor, committed, x, w, b = _inputs(Bt, C, K, L, T, torch.float32, C * 10 + T, strided)
    b = b if bias else None
    x_before = x.clone()
    ref = [t.clone() for t in (hist, state, committed)]
    counts = [torch.tensor(3, device=x.device) for _ in range(2)]  # the token count, advanced by T
    want = layer_window_conv_reference(ref[0], ref[1], cursor, ref[2], x, w, b, activation, L, counts[0])
    out = layer_window_conv_triton(hist, state, cursor, committed, x, w, b, activation, L, counts[1])
    assert [int(c) for c in counts] == [3 + T, 3 + T]
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hist, ref[0], rtol=0, atol=0, equal_nan=True)  # copies: exact, NaN where unwritten
    torch.testing.assert_close(state, ref[1], rtol=0, atol=0)
    assert torch.equal(committed, ref[2]) and torch.equal(x, x_before)
    start = verify_start(cursor, T, L)
    assert torch.isnan(hist[1]).all()  # the idle row: nothing written
    for row in (0, 2, 3, 4):  # active rows: the window's K + T history columns, nothing past them
        s = int(start[row])
        assert not torch.isnan(hist[row, :, s:s + K + T]).any() and torch.isnan(hist[row, :, s + K + T:]).all()
    assert int(start[2]) == 0 and int(committed[2]) == 0


def test_window_conv_follows_single_steps():
    """T window outputs and the conv state after them equal T one-token conv steps (bf16 state) on
    the active rows (an idle row's outputs are not used; its state stays)."""
    Bt, C, K, L, T = 3, 48, 4, 8, 5
    hist, state, cursor, committed, x, w, b = _inputs(Bt, C, K, L, T, torch.bfloat16, 7, True)
    cursor[2] = 0
    exact, active = state.clone(), cursor >= 0
    out = layer_window_conv_triton(hist, state, cursor, committed, x, w, b, "silu", L)
    for t in range(T):
        window = torch.cat([exact[:, :, 1:], x[:, t, :, None]], dim=-1)
        y = torch.nn.functional.silu((window.float() * w.float()).sum(-1) + b.float()).to(x.dtype)
        torch.testing.assert_close(out[active, t], y[active], rtol=2e-2, atol=2e-2)  # one bf16 rounding
        exact = torch.where(active.view(Bt, 1, 1), window, exact)
    assert torch.equal(state, exact)


def test_bad_input_is_refused():
    hist, state, cursor, committed, x, w, b = _inputs(3, 8, 4, 8, 2, torch.float32, 0, False)
    with pytest.raises(ValueError, match="activation None, 'silu' or 'swish'; got 'gelu'"):
        layer_window_conv(hist, state, cursor, committed, x, w, b, "gelu", 8)
    with pytest.raises(ValueError, match=r"expects x \(Bt, T, C\) and weight \(C, K\)"):
        layer_window_conv(hist, state, cursor, committed, x[:, :, :4], w, b, "silu", 8)
    with pytest.raises(ValueError, match=r"count must be None or a 0-d int64 tensor on \S+; got torch.int64 \(1,\)"):
        layer_window_conv(hist, state, cursor, committed, x, w, b, "silu", 8,
                          torch.zeros(1, dtype=torch.int64, device=x.device))
    with pytest.raises(ValueError, match="must be int32"):
        layer_window_conv_triton(hist, state, cursor.long(), committed, x, w, b, "silu", 8)
