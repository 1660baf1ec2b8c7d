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


@pytest.mark.parametrize("C,K,dtype", [(40, 4, torch.float32), (1100, 4, torch.bfloat16)])
def test_layers_rollback_in_one_launch_matches_each_layers_reference(C, K, dtype):
    """Three layers of one shape, each with its own cursors (idle rows included), by one count; the
    address table built once serves a second rollback of the same tensors."""
    from replayssm.kernels.rollback import layers_rollback_reference, layers_rollback_table, layers_rollback_triton

    Bt, L = 5, 8
    layers = []
    for i in range(3):
        cursor, hist, state, committed = _layer(Bt, C, K, L, dtype, seed=10 * i + C)
        cursor[cursor >= 0] = cursor[cursor >= 0].clamp(min=3)
        layers.append((cursor, hist, state, committed))
    ref = [tuple(t.clone() for t in layer) for layer in layers]
    table = layers_rollback_table(layers)
    states = [layer[2].clone() for layer in layers]
    layers_rollback_reference(ref, 0)  # nothing rolled back: marks only, the conv states untouched
    layers_rollback_triton(layers, 0, table)
    for got, want, state in zip(layers, ref, states):
        assert all(torch.equal(a.nan_to_num(-5.0), b.nan_to_num(-5.0)) for a, b in zip(got, want))
        assert torch.equal(got[3], got[0].clamp(min=0)) and torch.equal(got[2].nan_to_num(-5.0), state.nan_to_num(-5.0))
    for n in (2, 1):
        layers_rollback_reference(ref, n)
        layers_rollback_triton(layers, n, table)
        for got, want in zip(layers, ref):
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not any(layer[2][[0, 2, 3, 4]].isnan().any() for layer in layers)


def test_layers_rollback_refuses_layers_of_other_shapes():
    from replayssm.kernels.rollback import layers_rollback_table

    a = _layer(5, 40, 4, 8, torch.float32, seed=1)
    b = _layer(5, 48, 4, 8, torch.float32, seed=2)
    with pytest.raises(ValueError, match="every layer needs the first's shapes"):
        layers_rollback_table([a, b])
    c = list(_layer(5, 40, 4, 8, torch.float32, seed=3))
    c[0] = c[0].long()
    with pytest.raises(ValueError, match="cursor and committed must be int32"):
        layers_rollback_table([c])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layers_rollback_on_gpu_at_real_sizes():
    """Twelve Nemotron-3-Nano conv layers (9728 channels, K = 4, L = 16, bf16), batch 1 and 64 alike:
    the one launch equals each layer's reference bit for bit."""
    from replayssm.kernels.rollback import layers_rollback_reference, layers_rollback_triton

    for Bt in (2, 64):
        layers = []
        for i in range(12):
            cursor, hist, state, committed = (t.cuda() for t in _layer(Bt, 9728, 4, 16, torch.bfloat16, seed=i))
            cursor[cursor >= 0] = cursor[cursor >= 0].clamp(min=4)
            layers.append((cursor, hist, state, committed))
        ref = [tuple(t.clone() for t in layer) for layer in layers]
        layers_rollback_reference(ref, 3)
        layers_rollback_triton(layers, 3)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for got, want in zip(layers, ref) for a, b in zip(got, want))
