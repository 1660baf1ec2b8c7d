"""Run a few delta-rule replay steps at a fixed cursor: a short, steady target for a profiler.

Every row's cursor is set to ``--cursor`` before each step, so every step does the same work
(``--cursor L-1`` makes every row flush). Nothing is timed here; run it under Nsight Compute, e.g.

    ncu --clock-control none -k regex:_delta_coef_kernel -s 2 -c 1 --section SpeedOfLight \\
        --section Occupancy python examples/benchmarks/delta_one_step.py --cursor 14

``--smoke`` runs tiny shapes on any device (on CPU through the Triton interpreter,
``TRITON_INTERPRET=1``) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_delta as bd  # noqa: E402
from delta_variants import parse_cases  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default=None, help="shape:dtype (default kimi-linear-kda:float32; smoke-kda:float32 with --smoke)")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 256; 2 with --smoke)")
    ap.add_argument("--L", type=int, default=None, help="buffer length (default 16; 4 with --smoke)")
    ap.add_argument("--cursor", type=int, default=None, help="every row's cursor before each step (default L-2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--knobs", type=json.loads, default={}, help="JSON object of delta_replay_decode_triton knobs")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script itself)")
    args = ap.parse_args(argv)
    shapes = bd.SMOKE_SHAPES if args.smoke else bd.SHAPES
    try:
        (shape, sdt), = parse_cases(args.case or ("smoke-kda:float32" if args.smoke else "kimi-linear-kda:float32"),
                                    shapes)
    except ValueError as e:
        ap.error(f"--case: {e}")
    if not isinstance(args.knobs, dict):
        ap.error("--knobs takes a JSON object, e.g. '{\"ring_by_cursor\": false}'")
    unknown = bd.unknown_knobs(args.knobs)
    if unknown:
        ap.error(f"--knobs: not knobs of delta_replay_decode_triton: {', '.join(unknown)}")
    Bt = args.batch if args.batch is not None else (2 if args.smoke else 256)
    L = args.L if args.L is not None else (4 if args.smoke else 16)
    cursor = args.cursor if args.cursor is not None else max(0, L - 2)
    if Bt < 1 or L < 1 or args.steps < 1:
        ap.error(f"--batch, --L and --steps must be positive, got {Bt}, {L} and {args.steps}")
    if not 0 <= cursor < L:
        ap.error(f"--cursor must be in [0, L) = [0, {L}), got {cursor}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not (args.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
        ap.error("needs a CUDA device (or --smoke with TRITON_INTERPRET=1 set)")
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton

    Hk, HV, K, V, kda = shapes[shape]
    lay = bd.Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, 1, dev)
    (u, kb, gb, cur), = lay.rings(L)
    for _ in range(args.steps):
        cur.fill_(cursor)
        delta_replay_decode_triton(lay.q, lay.k, lay.v, lay.g, lay.beta, lay.states[0], u, kb, gb, cur, lay.out,
                                   **args.knobs)
    if dev == "cuda":
        torch.cuda.synchronize()
    finite = bool(torch.isfinite(lay.out.float()).all())
    print(f"{shape}:{str(sdt)[6:]} batch {Bt} L {L}: {args.steps} steps at cursor {cursor}; outputs finite: {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
