"""Time knob variants of the delta-rule replay kernel against each other on the same data.

Each case (shape from ``bench_delta.SHAPES``, checkpoint dtype) builds one layer and times every
variant (keyword arguments of ``delta_replay_decode_triton``; ``{}`` = the defaults) over whole
L-step cycles as ``bench_delta.bench_config`` does, then the first variant again (its repeat shows
the noise). Prints one JSON line per timing and writes ``delta_variants.json`` under ``--out``.
One more knob is the script's own: ``"gate_ring_dtype"`` (e.g. ``"bfloat16"``) gives that variant a
copy of the rings with the gate ring stored in that dtype, which the kernels read and widen to
fp32. For timing only: KDA's gate ring holds running sums, which a 16-bit ring rounds (a bound on
what any 16-bit gate ring could save, not a valid configuration).
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
GATE_RING_KNOB = "gate_ring_dtype"  # the script's own knob (module notes)


def rings_as(rings: list, dtype: torch.dtype | None) -> list:
    """``rings`` with the gate ring (third item) copied into ``dtype`` (None: ``rings`` itself)."""
    if dtype is None:
        return rings
    return [(u, kb, gb.to(dtype), cur) for (u, kb, gb, cur) in rings]


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
    bad = [v[GATE_RING_KNOB] for v in args.variants if v.get(GATE_RING_KNOB, "float32") not in DTYPES]
    if bad:
        ap.error(f"--variants: {GATE_RING_KNOB} must be one of {', '.join(DTYPES)}, got {bad[0]!r}")
    unknown = sorted({k for v in args.variants for k in bd.unknown_knobs(v) if k != GATE_RING_KNOB})
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
        ring_sets = {}  # gate-ring dtype -> rings (copies made once per case)
        for variant in args.variants + args.variants[:1]:
            kw = {k: v for k, v in variant.items() if k != GATE_RING_KNOB}
            gdt = variant.get(GATE_RING_KNOB)
            if gdt not in ring_sets:
                ring_sets[gdt] = rings_as(rings, DTYPES[gdt] if gdt else None)

            def body(kw=kw, rr=ring_sets[gdt]):
                for _ in range(L):
                    for st, (u, kb, gb, cur) in zip(lay.states, rr):
                        delta_replay_decode_triton(*x, st, u, kb, gb, cur, lay.out, **kw)

            t = time_steps(body, L * R)
            first = first or t
            rows.append(dict(case=f"{shape}:{str(sdt)[6:]}", Bt=Bt, L=L, kw=variant, us=round(t, 2),
                             floor_frac=round(floor / t, 4), vs_first=round(first / t, 4)))
            print(json.dumps(rows[-1]), flush=True)
        del lay, rings, ring_sets
        if dev == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        meta = dict(copy_bw_tbs=bw / 1e12, gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
                    torch=torch.__version__)
        (Path(args.out) / "delta_variants.json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
