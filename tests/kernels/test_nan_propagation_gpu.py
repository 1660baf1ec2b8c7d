"""A NaN reaching a kernel's clamp, ReLU or softplus comes out NaN, as in the PyTorch references: on
a GPU Triton's plain ``minimum`` / ``maximum`` return the other operand for a NaN (the interpreter's
NumPy ones propagate it, so only a GPU tells). A silently finite value would hide a broken input."""

import pytest
import torch

from replayssm.kernels.delta.gdn_gates import gdn_gates
from replayssm.kernels.linear import linear_small_batch_gated

pytestmark = pytest.mark.gpu


def test_gated_relu_keeps_nan():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 1, 256, generator=g, device="cuda").bfloat16()
    gate, up = ((torch.randn(512, 256, generator=g, device="cuda") / 16).bfloat16() for _ in range(2))
    gate[7, 3] = float("nan")
    y = linear_small_batch_gated(x, gate, up, activation="relu", backend="triton")
    want = torch.relu(x.float() @ gate.float().T) * (x.float() @ up.float().T)
    assert torch.equal(y.isnan(), want.isnan()) and y[..., 7].isnan().all()


def test_gdn_gates_keep_nan():
    a = torch.randn(4, 32, device="cuda")
    a[1, 5] = float("nan")
    A_log, dt_bias = torch.randn(32, device="cuda"), torch.randn(32, device="cuda")
    g, beta = gdn_gates(a, torch.randn(4, 32, device="cuda"), A_log, dt_bias, backend="triton")
    g_ref, _ = gdn_gates(a, torch.zeros(4, 32, device="cuda"), A_log, dt_bias, backend="torch")
    assert torch.equal(g.isnan(), g_ref.isnan()) and g[1, 5].isnan()


def test_mamba2_replay_keeps_a_nan_decay():
    """A NaN in A (a broken checkpoint) makes its head's outputs NaN, as in the reference, where the
    decay's clamp would otherwise read it as A = 0 (no decay) and return finite values."""
    from replayssm.kernels.mamba2 import mamba2_replay_decode_reference
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    g = torch.Generator(device="cuda").manual_seed(1)
    Bsz, H, P, N, G, L = 2, 4, 16, 32, 2, 4
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    A = -torch.rand(H, generator=g, device="cuda")
    A[1] = float("nan")
    inputs = (rnd(Bsz, H, P), rnd(Bsz, H), rnd(Bsz, G, N), rnd(Bsz, G, N))
    state = rnd(Bsz, H, P, N)
    ys = []
    for fn in (mamba2_replay_decode_reference, mamba2_replay_decode_triton):
        bufs = (rnd(Bsz, H, L, P) * 0, torch.zeros(Bsz, H, L, device="cuda"), torch.zeros(Bsz, G, L, N, device="cuda"))
        cursor = torch.tensor([1, 3], dtype=torch.int32, device="cuda")  # an output-only row and a flushing one
        ys.append(fn(*inputs, state.clone(), *bufs, cursor, A, None, None, None, True))
    assert ys[0][:, 1].isnan().all() and torch.equal(ys[1].isnan(), ys[0].isnan())
