"""Shared set-up of the delta-rule verify kernel tests (CPU interpreter and GPU): a layer whose rings
hold finite entries below each row's cursor and NaN past it, one step run by the reference and by
the kernel on copies, the comparison of everything the step reads or writes, and a CUDA-graph
capture."""

from __future__ import annotations

import torch
from verify_helpers import DeltaLayer

from replayssm.kernels.delta.verify import delta_replay_verify_reference
from replayssm.kernels.delta.verify_launch import launch_verify


def filled_layer(kda, cursors, L, state_dtype=torch.float32, ring_dtype=torch.float32, seed=0, device="cpu",
                 **dims) -> DeltaLayer:
    """A ``DeltaLayer`` (``dims``: Hk, HV, K, V) with ``cursors`` (a list, -1 idle) whose rings hold
    finite entries below each row's cursor and NaN from there on; rings in ``ring_dtype`` (the
    gates fp32), checkpoint in ``state_dtype``."""
    Bt = len(cursors)
    layer = DeltaLayer(Bt, kda=kda, L=L, seed=seed, **dims)
    gen = torch.Generator().manual_seed(seed + 1)
    u_buf, k_buf, g_buf = layer.rings
    gates = -torch.rand(g_buf.shape, generator=gen)
    fill = (torch.randn(u_buf.shape, generator=gen),
            torch.nn.functional.normalize(torch.randn(k_buf.shape, generator=gen), dim=-1),
            gates.cumsum(2) if kda else gates)  # KDA's ring holds running sums
    cursor = torch.tensor(cursors, dtype=torch.int32)
    held = torch.arange(L)[None, :] < cursor.clamp(min=0)[:, None]  # (Bt, L)
    rings = [torch.where(held.view(Bt, 1, L, *([1] * (r.dim() - 3))), x, r) for r, x in zip(layer.rings, fill)]
    layer.rings = (rings[0].to(ring_dtype), rings[1].to(ring_dtype), rings[2])
    layer.state = layer.state.to(state_dtype)
    layer.cursor.copy_(cursor)
    return layer.to(device)


def run_both(layer: DeltaLayer, T: int, write_idle: bool = True, config=None):
    """One verify step of T tokens by the reference and by the kernel, each on its own copy of the
    layer's tensors (inputs in the ring dtype; the kernel's output poisoned with NaN first). Returns
    the two results, each (out, state, rings, cursor)."""
    q, k, v, g, beta = layer.tokens(T)
    act = layer.rings[0].dtype
    q, k, v = q.to(act), k.to(act), v.to(act)
    results = []
    for kernel in (False, True):
        state, rings, cursor = layer.state.clone(), tuple(r.clone() for r in layer.rings), layer.cursor.clone()
        out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
        if kernel:
            launch_verify(q, k, v, g, beta, state, *rings, cursor, out, write_idle=write_idle, config=config)
        elif write_idle:
            out = delta_replay_verify_reference(q, k, v, g, beta, state, *rings, cursor)
        else:
            delta_replay_verify_reference(q, k, v, g, beta, state, *rings, cursor, out)
        results.append((out, state, rings, cursor))
    return results


def assert_same(ref, got, **tol) -> None:
    """Equal cursors, outputs, checkpoints and rings (NaN where both hold NaN: slots no step wrote)."""
    (o_r, s_r, rings_r, c_r), (o_g, s_g, rings_g, c_g) = ref, got
    assert torch.equal(c_g, c_r), (c_g.tolist(), c_r.tolist())
    torch.testing.assert_close(o_g, o_r, equal_nan=True, **tol)
    torch.testing.assert_close(s_g, s_r, **tol)
    for r_g, r_r in zip(rings_g, rings_r):
        torch.testing.assert_close(r_g, r_r, equal_nan=True, **tol)


def capture(fn):
    """A CUDA graph of ``fn()``, run once on a side stream before the capture (compiles the kernels),
    and the output tensor the graph writes."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
