"""Time knob variants of the delta-rule replay kernel against each other on the same data (GPU).

Each case (shape from ``bench_delta.SHAPES``, checkpoint dtype) builds one layer and times every
variant (keyword arguments of ``delta_replay_decode_triton``; ``{}`` = the defaults) over whole
L-step cycles as ``bench_delta.bench_config`` does, then the first variant again (its repeat shows
the noise). Prints one JSON line per timing and writes ``delta_variants.json`` under ``--out``.

    python examples/benchmarks/delta_variants.py --cases kimi-linear-kda:float32 \
        --variants '[{}, {"flush_head_items": false}]' --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_delta as bd  # noqa: E402
from timing import copy_bandwidth, time_steps  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of knob dicts")
    ap.add_argument("--cases", default="kimi-linear-kda:float32", help="shape:dtype,... (dtype: float32, bfloat16)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    if not isinstance(args.variants, list) or not all(isinstance(v, dict) for v in args.variants):
        ap.error("--variants takes a JSON list of objects")
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton

    bw = copy_bandwidth("cuda")
    Bt, L, rows = args.batch, args.L, []
    for case in args.cases.split(","):
        shape, dt = case.split(":")
        sdt = getattr(torch, dt)
        Hk, HV, K, V, kda = bd.SHAPES[shape]
        R = bd.copies_for(Bt, HV, K, V, sdt.itemsize)
        lay = bd.Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, R, "cuda")
        x = (lay.q, lay.k, lay.v, lay.g, lay.beta)
        rings = lay.rings(L)
        floor = bd.replay_bytes(Bt, Hk, HV, K, V, L, sdt.itemsize, 2, kda) / bw * 1e6
        first = None
        for kw in args.variants + args.variants[:1]:
            def body(kw=kw):
                for _ in range(L):
                    for st, (u, kb, gb, cur) in zip(lay.states, rings):
                        delta_replay_decode_triton(*x, st, u, kb, gb, cur, lay.out, **kw)

            t = time_steps(body, L * R)
            first = first or t
            rows.append(dict(case=case, Bt=Bt, L=L, kw=kw, us=round(t, 2), floor_frac=round(floor / t, 4),
                             vs_first=round(first / t, 4)))
            print(json.dumps(rows[-1]), flush=True)
        del lay, rings
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        meta = dict(copy_bw_tbs=bw / 1e12, gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        (Path(args.out) / "delta_variants.json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
