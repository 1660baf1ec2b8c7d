"""Two Mamba-2 layers decoding at once on two CUDA streams: own arrival counters vs the device's shared one.

Runs ``run_on_two_streams`` of ``tests/kernels/test_mamba2_kernels_gpu.py`` (batch 4, L = 4, 9 steps, both
streams queued behind a sleep so that their kernels overlap) a few times each way and prints, per run, whether
every cursor came out right and the worst error against the reference. Needs CUDA.

    python examples/benchmarks/mamba2_two_streams.py [--runs 6] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mamba2_two_streams: needs a CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
    import test_mamba2_kernels_gpu as t

    res = {}
    for own in (True, False):
        rows = []
        for rep in range(args.runs):
            worst, ok, _ = t.run_on_two_streams(own_counters=own, seed=50 + 10 * rep)
            rows.append({"worst": worst, "cursors_ok": ok})
        res["own counters" if own else "shared counter"] = rows
        print(("own counters  " if own else "shared counter"),
              " ".join(f"{'ok' if r['cursors_ok'] else 'BAD'}:{max(r['worst']):.1e}" for r in rows), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "mamba2_two_streams.json"), "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, runs=res), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
