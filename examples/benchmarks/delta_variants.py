"""Time knob variants of the delta-rule replay kernel against each other on the same data.

Each case (shape from ``bench_delta.SHAPES``, checkpoint dtype) builds one layer and times every
variant (keyword arguments of ``delta_replay_decode_triton``; ``{}`` = the defaults) over whole
L-step cycles as ``bench_delta.bench_config`` does, then the first variant again (its repeat shows
the noise). Prints one JSON line per timing and writes ``delta_variants.json`` under ``--out``.
Needs a CUDA device; ``--smoke`` runs tiny shapes on any device (on CPU through the Triton
interpreter, ``TRITON_INTERPRET=1``) to check the script itself; its numbers mean nothing.

    python examples/benchmarks/delta_variants.py --cases kimi-linear-kda:float32 \\
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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_cases(text: str, shapes: dict) -> list[tuple[str, torch.dtype]]:
    """``"shape:dtype,..."`` -> [(shape, dtype)]; ValueError naming what is wrong."""
    cases = []
    for item in text.split(","):
        shape, _, dt = item.strip().partition(":")
        if shape not in shapes:
            raise ValueError(f"unknown shape {shape!r} (expected one of: {', '.join(shapes)})")
        if dt not in DTYPES:
            raise ValueError(f"{item.strip()!r}: checkpoint dtype must be one of {', '.join(DTYPES)}, got {dt!r}")
        cases.append((shape, DTYPES[dt]))
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of knob objects ({} = defaults)")
    ap.add_argument("--cases", default=None, help="shape:dtype,... (default: kimi-linear-kda:float32)")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 256; 2 with --smoke)")
    ap.add_argument("--L", type=int, default=None, help="buffer length (default 16; 4 with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script itself)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    shapes = bd.SMOKE_SHAPES if args.smoke else bd.SHAPES
    if not isinstance(args.variants, list) or not all(isinstance(v, dict) for v in args.variants) \
            or not args.variants:
        ap.error("--variants takes a non-empty JSON list of objects, e.g. '[{}, {\"ring_by_cursor\": false}]'")
    unknown = sorted({k for v in args.variants for k in bd.unknown_knobs(v)})
    if unknown:
        ap.error(f"--variants: not knobs of delta_replay_decode_triton: {', '.join(unknown)}")
    try:
        cases = parse_cases(args.cases or ("smoke-gdn:float32,smoke-kda:float32" if args.smoke
                                           else "kimi-linear-kda:float32"), shapes)
    except ValueError as e:
        ap.error(f"--cases: {e}")
    Bt = args.batch if args.batch is not None else (2 if args.smoke else 256)
    L = args.L if args.L is not None else (4 if args.smoke else 16)
    if Bt < 1 or L < 1:
        ap.error(f"--batch and --L must be positive, got {Bt} and {L}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not (args.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
        ap.error("needs a CUDA device (or --smoke with TRITON_INTERPRET=1 set)")
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton

    bw = copy_bandwidth(dev) if dev == "cuda" else 1e11
    rows = []
    for shape, sdt in cases:
        Hk, HV, K, V, kda = shapes[shape]
        R = bd.copies_for(Bt, HV, K, V, sdt.itemsize) if dev == "cuda" else 1
        lay = bd.Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, R, dev)
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
            rows.append(dict(case=f"{shape}:{str(sdt)[6:]}", Bt=Bt, L=L, kw=kw, us=round(t, 2),
                             floor_frac=round(floor / t, 4), vs_first=round(first / t, 4)))
            print(json.dumps(rows[-1]), flush=True)
        del lay, rings
        if dev == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        meta = dict(copy_bw_tbs=bw / 1e12, gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
                    torch=torch.__version__)
        (Path(args.out) / "delta_variants.json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
