"""Cursor advance variants at small batches, timed in one run (CUDA graphs, whole L-step cycles).

Mamba-2 replay kernel: arrivals on a separate counter (``advance="atomic"``, the default) against
arrivals on the cursor word (``"cursor"``) and no advance at all (``"none"``: each step's cursors
pre-set in a vector of their own per state copy, as if they were moved on elsewhere, e.g. once per
model step for all layers; the cost of the in-launch advance), beside the per-step kernel and
mamba_ssm's ``selective_state_update`` (when its vendored source loads). Delta-rule one-launch kernel: a
second launch for the cursors (``"kernel"``) against arrivals on the cursor word read by the
atomic (``"cursor-first"``) or by a load (``"cursor"``), beside the per-step kernel. Each
variant is timed twice, interleaved, on the same data (once in a ``--smoke`` run); µs per layer
step amortised over the cycle (flush included), state copies rotated above the L2.

    python3 examples/benchmarks/cursor_advance.py --out DIR     # CUDA: about 3 minutes on an H200
    python3 examples/benchmarks/cursor_advance.py --family mamba2 --out DIR   # one kernel family
    python3 examples/benchmarks/cursor_advance.py --smoke --out DIR   # tiny shapes, any device

Writes ``cursor_advance.json`` and ``cursor_advance.md`` to DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_delta as bd  # noqa: E402
import bench_mamba2 as bm  # noqa: E402
from timing import time_steps  # noqa: E402

MAMBA2_VARIANTS = ("atomic", "cursor", "none")
DELTA_VARIANTS = ("kernel", "cursor-first", "cursor")
DTYPES = (torch.float32, torch.bfloat16)  # checkpoint dtypes (fp32 only in a smoke run)
ROUNDS = 4  # per-step baselines: steps over every state copy per timed body


def preset_cursor_body(lay, bufs, L: int, cfg: dict):
    """A whole cycle of Mamba-2 replay steps with ``advance="none"``: step ``c`` of every state copy
    reads a cursor vector of its own holding ``c`` (the copies' buffers start at cursor 0)."""
    from replayssm.kernels.mamba2.triton_decode import launch_mamba2_replay_decode

    preset = [[torch.full_like(cur, c) for c in range(L)] for (_, _, _, cur) in bufs]

    def body():
        for c in range(L):
            for st, (xb, db, bb, _), cursors in zip(lay.states, bufs, preset):
                launch_mamba2_replay_decode(lay.x, lay.dt, lay.B, lay.C, st, xb, db, bb, cursors[c], lay.A,
                                            lay.dt_bias, lay.D, None, True, lay.out, False, config=cfg)

    return body


def mamba2_rows(cuda: bool, L: int, emit, repeats: int) -> None:
    from replayssm.kernels.backend import num_sms
    from replayssm.kernels.mamba2.triton_decode import replay_config
    from replayssm.kernels.mamba2.triton_step import launch_mamba2_step_decode

    dev = "cuda" if cuda else "cpu"
    mssu = bm.load_mamba_ssm()[0] if cuda else None
    shapes = bm.SHAPES if cuda else {"smoke": (4, 16, 16, 2)}
    for name, (H, P, N, G) in shapes.items():
        for sdt in DTYPES if cuda else DTYPES[:1]:
            s = torch.tensor([], dtype=sdt).element_size()
            wide = cuda and name == "nemotron3-super" and sdt == torch.float32
            for Bt in ((1, 4, 32, 256) if wide else (1, 4) if cuda else (2,)):
                R = bm.copies_for(Bt, H, P, N, s) if cuda else 1
                lay = bm.Layer(Bt, H, P, N, G, sdt, torch.bfloat16, R, dev)
                bufs = lay.buffers(L)
                base = replay_config(Bt, H, P, N, G, L, s, 2, num_sms(dev, 0 if cuda else None), not cuda)
                row = dict(family="mamba2", shape=name, state=str(sdt).split(".")[-1], batch=Bt, copies=R)
                for adv in MAMBA2_VARIANTS * repeats:
                    cfg = dict(base, advance=adv)
                    body = preset_cursor_body(lay, bufs, L, cfg) if adv == "none" else lay.replay_body(bufs, L, cfg)
                    row.setdefault(adv, []).append(time_steps(body, L * R, graph=cuda))

                def step_body():
                    for _ in range(ROUNDS):
                        for st in lay.states:
                            launch_mamba2_step_decode(lay.x, lay.dt, lay.B, lay.C, st, lay.A, lay.dt_bias, lay.D,
                                                      None, True, lay.out)

                row["step"] = time_steps(step_body, ROUNDS * R, graph=cuda)
                if mssu is not None:
                    def mssu_body():
                        for _ in range(ROUNDS):
                            for st in lay.states:
                                mssu(st, lay.x, lay.dt_hf, lay.A_hf, lay.B, lay.C, D=lay.D_hf, z=None,
                                     dt_bias=lay.dtb_hf, dt_softplus=True)

                    row["mamba_ssm"] = time_steps(mssu_body, ROUNDS * R, graph=cuda)
                emit(row)
                del lay, bufs


def delta_rows(cuda: bool, L: int, emit, repeats: int) -> None:
    from replayssm.kernels.delta.triton_small_batch import delta_replay_decode_small_batch
    from replayssm.kernels.delta.triton_step import delta_step_decode_triton

    dev = "cuda" if cuda else "cpu"
    shapes = bd.SHAPES if cuda else bd.SMOKE_SHAPES
    for name, (Hk, HV, K, V, kda) in shapes.items():
        for sdt in DTYPES if cuda else DTYPES[:1]:
            for Bt in ((1, 2, 4) if cuda else (2,)):
                R = bd.copies_for(Bt, HV, K, V, torch.tensor([], dtype=sdt).element_size()) if cuda else 1
                lay = bd.Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, R, dev)
                x = (lay.q, lay.k, lay.v, lay.g, lay.beta)
                rings = lay.rings(L)
                row = dict(family="delta-one-launch", shape=name, state=str(sdt).split(".")[-1], batch=Bt, copies=R)
                for adv in DELTA_VARIANTS * repeats:
                    def body(adv=adv):
                        for _ in range(L):
                            for st, (u, kb, gb, cur) in zip(lay.states, rings):
                                delta_replay_decode_small_batch(*x, st, u, kb, gb, cur, lay.out, False, advance=adv)

                    row.setdefault(adv, []).append(time_steps(body, L * R, graph=cuda))

                def step_body():
                    for _ in range(ROUNDS):
                        for st in lay.states:
                            delta_step_decode_triton(*x, st)

                row["step"] = time_steps(step_body, ROUNDS * R, graph=cuda)
                emit(row)
                del lay, rings


def markdown(rows, meta) -> str:
    lines = [f"# Cursor advance variants at small batches ({meta['gpu']}, {meta['date']})", "",
             f"- torch {meta['torch']}, triton {meta['triton']}; L = {meta['L']}, activations and rings bf16; "
             "µs per layer step amortised over whole cycles (flush included), CUDA graphs, state copies above the "
             f"L2; each variant timed {meta['repeats']} time(s), interleaved (mean shown).",
             "- produced by `python3 examples/benchmarks/cursor_advance.py --out DIR`; raw rows: "
             "`cursor_advance.json`.", ""]
    for family, variants, base in (("mamba2", MAMBA2_VARIANTS, "atomic"), ("delta-one-launch", DELTA_VARIANTS,
                                                                            "kernel")):
        sel = [r for r in rows if r["family"] == family]
        if not sel:
            continue
        extra = ["step"] + (["mamba_ssm"] if any("mamba_ssm" in r for r in sel) else [])
        head = ["shape", "state", "batch", *variants, *(f"{base}/{v}" for v in variants if v != base), *extra]
        lines += [f"## {family} (baseline `{base}`; ratios above 1: faster than the baseline)", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in sel:
            mean = {v: sum(r[v]) / len(r[v]) for v in variants}
            cells = [r["shape"], r["state"], str(r["batch"]), *(f"{mean[v]:.2f}" for v in variants),
                     *(f"{mean[base] / mean[v]:.3f}" for v in variants if v != base),
                     *(f"{r[k]:.2f}" if k in r else "-" for k in extra)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--L", type=int, default=None, help="buffer length (default 16; 4 with --smoke)")
    ap.add_argument("--family", choices=("mamba2", "delta", "both"), default="both", help="which kernels (default both)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script itself)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("cursor_advance: no CUDA device; nothing to time (--smoke runs tiny shapes anywhere)")
        return 0
    L = args.L or (4 if args.smoke else 16)
    if L < 2:
        print(f"cursor_advance: --L must be at least 2; got {L}", file=sys.stderr)
        return 2
    import triton

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name() if cuda else "cpu (smoke run)", date=datetime.date.today().isoformat(),
                torch=torch.__version__, triton=triton.__version__, L=L,
                repeats=2 if cuda else 1)  # a smoke run checks the script, not the noise
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "cursor_advance.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))

    if args.family in ("mamba2", "both"):
        mamba2_rows(cuda, L, emit, meta["repeats"])
    if args.family in ("delta", "both"):
        delta_rows(cuda, L, emit, meta["repeats"])
    md = markdown(rows, meta)
    (out / "cursor_advance.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
