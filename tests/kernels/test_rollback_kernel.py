"""The one-launch layer rollback (``kernels/rollback.py``) against its PyTorch reference and an
independent gather, under the Triton interpreter (or on a GPU): cursors, restored conv states and
commit marks, idle rows untouched, per-row and shared counts, conv channels over several blocks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from replayssm.kernels.rollback import layer_rollback_reference, layer_rollback_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _layer(Bt, C, K, L, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    cursor = torch.randint(0, L + 1, (Bt,), generator=g, dtype=torch.int32)
    cursor[1] = -1  # an idle row
    hist = torch.randn(Bt, C, K + L, generator=g).to(dtype)
    state = torch.full((Bt, C, K), float("nan"), dtype=dtype)  # rows that roll back must be overwritten
    state[1] = 7.0
    committed = torch.full((Bt,), 99, dtype=torch.int32)
    return [t.to(DEV) for t in (cursor, hist, state, committed)]


@pytest.mark.parametrize("per_row", [False, True, "int"])
@pytest.mark.parametrize("C,K,dtype", [(40, 4, torch.float32), (1100, 4, torch.bfloat16), (24, 3, torch.float32)])
def test_layer_rollback_matches_reference_and_gather(per_row, C, K, dtype):
    Bt, L = 5, 8
    cursor, hist, state, committed = _layer(Bt, C, K, L, dtype, seed=C + K)
    if per_row is True:
        n = (torch.arange(Bt, dtype=torch.int32, device=DEV) % 3).minimum(cursor.clamp(min=0))
    else:  # one count for every row: a scalar tensor, or an int (a crop's, passed as a kernel argument)
        cursor[cursor >= 0] = cursor[cursor >= 0].clamp(min=2)
        n = 2 if per_row == "int" else torch.tensor(2, dtype=torch.int32, device=DEV)
    ref = [t.clone() for t in (cursor, hist, state, committed)]
    layer_rollback_reference(ref[0], n, *ref[1:])
    before = cursor.clone()
    layer_rollback_triton(cursor, n, hist, state, committed)
    assert torch.equal(cursor, ref[0]) and torch.equal(committed, ref[3])
    assert torch.equal(state, ref[2]) and not state[[0, 2, 3, 4]].isnan().any()
    for b in range(Bt):  # independently: the K history columns at the new cursor
        if before[b] < 0:
            assert cursor[b] == -1 and committed[b] == 0 and (state[b] == 7.0).all()
            continue
        c = int(before[b]) - int(n[b] if isinstance(n, torch.Tensor) and n.dim() else n)
        assert int(cursor[b]) == c == int(committed[b])
        assert torch.equal(state[b], hist[b, :, c:c + K])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("Bt", [1, 64])
def test_layer_rollback_on_gpu_at_real_sizes(Bt):
    """Nemotron-3-Nano's conv (9728 channels, K = 4), L = 16, bf16 history: the launch equals the
    reference bit for bit, per-row counts up to each row's cursor."""
    C, K, L = 9728, 4, 16
    cursor, hist, state, committed = (t.cuda() for t in _layer(max(Bt, 2), C, K, L, torch.bfloat16, seed=Bt))
    g = torch.Generator().manual_seed(Bt)
    n = torch.minimum(torch.randint(0, L + 1, cursor.shape, generator=g, dtype=torch.int32).cuda(),
                      cursor.clamp(min=0))
    ref = [t.clone() for t in (cursor, hist, state, committed)]
    layer_rollback_reference(ref[0], n, *ref[1:])
    layer_rollback_triton(cursor, n, hist, state, committed)
    torch.cuda.synchronize()
    assert torch.equal(cursor, ref[0]) and torch.equal(committed, ref[3]) and torch.equal(state, ref[2])
