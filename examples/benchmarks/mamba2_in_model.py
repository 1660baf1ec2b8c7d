"""Mamba-2 decode at batch 1 in model order: 64 layers, each with its own checkpoint, rings and cursor.

The layer benchmark (``bench_mamba2.py``) steps one layer's state copies back to back; a model
runs other kernels between its SSM layers (the projections stream hundreds of MB of weights,
which evicts the L2). This script steps 64 Nemotron-3-Super-shaped layers (fp32 checkpoints,
L = 16) in layer order, optionally with a "weights" GEMV between layers (bf16, ``--filler-mb``
of matrix, evicting the L2 as a projection does), and reports per layer-step:

* the kernel's own duration from the profiler trace (what a trace of a model shows), and
* the CUDA-graph time of the whole loop minus that of the filler alone (what a CUDA-graph serving
  engine pays, launch gaps and overlap included),

for the replay kernel with its cursor-arrival variants (``advance="atomic"`` on the shared
counter, the default; the same with one counter per layer, cold like the cursors; ``"cursor"``:
arrivals on the cursor word) and for mamba_ssm's ``selective_state_update`` when its vendored
source loads (``bench_mamba2.load_mamba_ssm``).

    python3 examples/benchmarks/mamba2_in_model.py --out DIR    # CUDA, about a minute
    python3 examples/benchmarks/mamba2_in_model.py --smoke --out DIR   # tiny, any device: runs the calls only

Writes ``mamba2_in_model.json`` to DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_mamba2 as bm  # noqa: E402

MODES = ("atomic-shared", "atomic-per-layer", "cursor")


class Model:
    """``n_layers`` layers of one shape with random checkpoints, rings and desynchronised cursors."""

    def __init__(self, shape, n_layers, L, filler_mb, dev):
        H, P, N, G = shape
        gen = torch.Generator().manual_seed(0)
        self.L = L
        self.A = (-(0.5 + torch.rand(H, generator=gen))).to(dev)
        self.dt_bias = (torch.randn(H, generator=gen) * 0.5).to(dev)
        self.D = torch.randn(H, generator=gen).to(dev)
        xbc = torch.randn(1, H * P + 2 * G * N, generator=gen).to(torch.bfloat16).to(dev)  # packed like the conv
        self.x = xbc[:, :H * P].view(1, H, P)
        self.B = xbc[:, H * P:H * P + G * N].view(1, G, N)
        self.C = xbc[:, H * P + G * N:].view(1, G, N)
        self.dt = (torch.randn(1, H, generator=gen) * 0.5 - 2.5).to(torch.bfloat16).to(dev)
        self.layers = [dict(state=torch.randn(1, H, P, N, device=dev),
                            x_buf=torch.randn(1, H, L, P, device=dev).to(torch.bfloat16),
                            dt_buf=torch.rand(1, H, L, device=dev) * 0.1,
                            B_buf=(torch.randn(1, G, L, N, device=dev) / math.sqrt(N)).to(torch.bfloat16),
                            cursor=torch.full((1,), i % L, dtype=torch.int32, device=dev),
                            counter=torch.zeros(4096, dtype=torch.int32, device=dev)) for i in range(n_layers)]
        self.out = torch.empty(1, H, P, dtype=torch.bfloat16, device=dev)
        rows = max(1, filler_mb * (1 << 20) // 2 // 4096)
        self.W = torch.randn(rows, 4096, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(4096, device=dev, dtype=torch.bfloat16)
        # mamba_ssm's argument layout
        self.dt_hf = self.dt[..., None].expand(1, H, P)
        self.A_hf = self.A[:, None, None].expand(H, P, N)
        self.D_hf = self.D[:, None].expand(H, P)
        self.dtb_hf = self.dt_bias[:, None].expand(H, P)

    def replay(self, lay, mode):
        from replayssm.kernels.mamba2 import triton_decode as td

        shared = td._arrival_counter
        if mode == "atomic-per-layer":
            td._arrival_counter = lambda device, n: lay["counter"]
        try:
            td.launch_mamba2_replay_decode(self.x, self.dt, self.B, self.C, lay["state"], lay["x_buf"], lay["dt_buf"],
                                           lay["B_buf"], lay["cursor"], self.A, self.dt_bias, self.D, None, True,
                                           self.out, False, advance="cursor" if mode == "cursor" else "atomic")
        finally:
            td._arrival_counter = shared

    def run(self, kernel, filler, steps):
        for _ in range(steps):
            for lay in self.layers:
                if filler:
                    torch.mv(self.W, self.v)
                if kernel is not None:
                    kernel(lay)


def kernel_us(model, kernel, filler, name):
    """Mean profiler duration (µs) of the kernels whose name contains ``name``, over one cycle."""
    from torch.profiler import ProfilerActivity, profile

    model.run(kernel, filler, model.L)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.run(kernel, filler, model.L)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    d = [e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel" and name in e.get("name", "")]
    return sum(d) / len(d) if d else None


def graph_us(model, kernel, filler):
    """CUDA-graph time (µs) per layer-step of one cycle of every layer."""
    import triton.testing

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model.run(kernel, filler, model.L)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model.run(kernel, filler, model.L)
    ms = triton.testing.do_bench(g.replay, warmup=5, rep=30, return_mode="median")
    return ms * 1e3 / (model.L * len(model.layers))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--filler-mb", type=int, default=220, help="MB of bf16 matrix read between layers")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device: runs the calls, times nothing")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("mamba2_in_model: no CUDA device; nothing to time (--smoke runs a tiny model anywhere)")
        return 0
    if args.layers < 1 or args.filler_mb < 1:
        print("mamba2_in_model: --layers and --filler-mb must be positive", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if cuda else "cpu"
    shape = bm.SHAPES["nemotron3-super"] if cuda else (4, 16, 16, 2)
    L = 16 if cuda else 4
    model = Model(shape, args.layers if cuda else 2, L, args.filler_mb if cuda else 1, dev)
    mssu, mssu_note = bm.load_mamba_ssm() if cuda else (None, "not loaded (smoke run)")
    meta = dict(gpu=torch.cuda.get_device_name() if cuda else "cpu (smoke run)", date=datetime.date.today().isoformat(),
                torch=torch.__version__, shape=shape, layers=len(model.layers), L=L, filler_mb=args.filler_mb,
                mamba_ssm=mssu_note)
    rows = []

    def theirs(lay):
        mssu(lay["state"], model.x, model.dt_hf, model.A_hf, model.B, model.C, D=model.D_hf, z=None,
             dt_bias=model.dtb_hf, dt_softplus=True)

    filler_alone = graph_us(model, None, True) if cuda else None
    for filler in (False, True):
        variants = [(m, (lambda lay, m=m: model.replay(lay, m)), "_mamba2_replay_kernel") for m in MODES]
        if mssu is not None:
            variants.append(("mamba_ssm", theirs, "_selective_scan_update_kernel"))
        for name, kernel, kname in variants:
            row = dict(filler=filler, variant=name)
            if cuda:
                row["kernel_us"] = kernel_us(model, kernel, filler, kname)
                row["graph_us"] = graph_us(model, kernel, filler) - (filler_alone if filler else 0.0)
            else:
                model.run(kernel, filler, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta["filler_alone_graph_us"] = filler_alone
    meta["cursors_at_end"] = [int(lay["cursor"].item()) for lay in model.layers]  # layer i started at i % L
    (out / "mamba2_in_model.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
