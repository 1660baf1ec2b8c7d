"""Timing helpers shared by the benchmarks (CUDA events through triton.testing.do_bench)."""

from __future__ import annotations

import time

import torch


def stagger_cursors(cursors, L: int) -> None:
    """Serving-like cycles: in each (Bt,) int32 cursor tensor, row ``b`` starts at ``b % L``, so 1/L of
    the rows flush at every step (a whole L-step cycle returns every row to where it started)."""
    for cur in cursors:
        cur.copy_(torch.arange(cur.numel(), device=cur.device, dtype=cur.dtype) % L)


def copy_bandwidth(dev, warmup: int = 50, rep: int = 300) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written (1 GiB each way)."""
    import triton.testing

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=warmup, rep=rep, return_mode="median")
    del a, b
    return 2 * n / (ms * 1e-3)


def time_steps(body, steps: int, graph: bool = True) -> float:
    """Median µs per step of ``body`` (which runs ``steps`` steps), replayed as a CUDA graph.

    ``body`` is run once first on a side stream (compiles kernels; a body that runs whole
    L-step cycles leaves the cursors where they started). Without CUDA (a CPU smoke run
    under the Triton interpreter) it falls back to the wall clock.
    """
    if not torch.cuda.is_available():
        body()
        t0 = time.perf_counter()
        body()
        return (time.perf_counter() - t0) * 1e6 / steps
    import triton.testing

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = None
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        fn = g.replay
    else:
        fn = body
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    del g
    return ms * 1e3 / steps
