"""A/B of replay-kernel versions and launch settings on the same data, in one run.

For each (shape, batch, checkpoint dtype) it builds one layer (``bench_mamba2.Layer`` /
``bench_delta.Layer``) and times, over whole L-step cycles from cursor 0 (flush included), in CUDA
graphs, interleaved over ``--reps`` rounds (median kept):

* ``baseline``: the replay kernel module in ``--baseline FILE`` (an older ``triton_decode.py`` of
  the same family, e.g. ``git show main:kernels/mamba2/triton_decode.py > old.py``), loaded by path
  as a sibling module of the installed one;
* ``default``: the installed kernel with its default launch settings;
* one column per entry of ``--settings`` (JSON list): Mamba-2: knobs of ``make_replay_config`` laid
  over the defaults of ``replay_config`` (e.g. ``{"specialize": false, "num_stages": 2}``,
  ``{"BLOCK_P": 8}``; the configuration is rebuilt from them); delta rule: keyword knobs of
  ``delta_replay_decode_triton``;
* ``step`` (our fused per-step kernel) and, for Mamba-2, ``mamba_ssm`` when its source is in
  ``.bench_vendor/`` (see ``bench_mamba2.py``), once per round.

``--stagger``: row ``b`` starts its cycles at cursor ``b % L`` (serving-like: 1/L of the rows flush at
every step) instead of every row at 0.

Ratios are against ``baseline`` when given, else ``default``. Writes ``kernel_ab.json`` and
``kernel_ab.md`` under ``--out``. ``--smoke``: tiny shapes through the Triton interpreter on any
machine (checks the script; the numbers mean nothing).

    python examples/benchmarks/kernel_ab.py --family mamba2 --baseline old.py --batches 1,256 --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import copy_bandwidth, stagger_cursors, time_steps  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class UsageError(Exception):
    """Bad command-line input (one line, exit status 2)."""


def load_baseline(family: str, path: str):
    """``path`` imported as ``replayssm.kernels.<family>._ab_baseline`` (its relative imports resolve)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--baseline: no such file {path!r}")
    name = f"replayssm.kernels.{family}._ab_baseline"
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def mamba2_cell(mods, settings, name, shape, Bt, sdt, L, R, dev, mssu, stagger=False):
    """Bodies (name -> (fn, steps)) for one Mamba-2 cell; every variant on the same data."""
    from bench_mamba2 import Layer, mamba_ssm_steps, step_steps

    from replayssm.kernels.backend import num_sms

    H, P, N, G = shape
    lay = Layer(Bt, H, P, N, G, sdt, torch.bfloat16, R, dev)
    bufs = lay.buffers(L)
    if stagger:
        stagger_cursors([b[3] for b in bufs], L)
    cur_mod = mods["default"]
    base_cfg = dict(cur_mod.replay_config(Bt, H, P, N, G, L, sdt.itemsize, 2, num_sms(dev.type, dev.index),
                                          dev.type != "cuda"))

    def replay(mod, cfg=None):
        def body():
            for _ in range(L):
                for st, (xb, db, bb, cur) in zip(lay.states, bufs):
                    mod.launch_mamba2_replay_decode(lay.x, lay.dt, lay.B, lay.C, st, xb, db, bb, cur, lay.A,
                                                    lay.dt_bias, lay.D, None, True, lay.out, False, config=cfg)
        return body, L * R

    bodies = {k: replay(m) for k, m in mods.items()}
    for s in settings:  # rebuilt from the knobs, so that derived values (programs per row, ...) follow
        knobs = dict(cur_mod.replay_knobs(base_cfg), **s)
        bodies[json.dumps(s)] = replay(cur_mod, cur_mod.make_replay_config(H, P, N, G, L, **knobs))
    K = 4
    bodies["step"] = (step_steps(lay, K), K * R)
    if mssu is not None:
        bodies["mamba_ssm"] = (mamba_ssm_steps(lay, mssu, K), K * R)
    return bodies


def delta_cell(mods, settings, name, shape, Bt, sdt, L, R, dev, _mssu, stagger=False):
    from bench_delta import Layer

    from replayssm.kernels.delta.triton_step import delta_step_decode_triton

    Hk, HV, K, V, kda = shape
    lay = Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, R, dev)
    x = (lay.q, lay.k, lay.v, lay.g, lay.beta)
    rings = lay.rings(L)
    if stagger:
        stagger_cursors([r[3] for r in rings], L)

    def replay(mod, knobs=None):
        def body():
            for _ in range(L):
                for st, (u, kb, gb, cur) in zip(lay.states, rings):
                    mod.delta_replay_decode_triton(*x, st, u, kb, gb, cur, lay.out, **(knobs or {}))
        return body, L * R

    bodies = {k: replay(m) for k, m in mods.items()}
    for s in settings:
        bodies[json.dumps(s)] = replay(mods["default"], s)

    def step():
        for _ in range(8):
            for st in lay.states:
                delta_step_decode_triton(*x, st)

    bodies["step"] = (step, 8 * R)
    return bodies


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=["mamba2", "delta"], required=True)
    ap.add_argument("--baseline", help="an older triton_decode.py of the same family")
    ap.add_argument("--settings", default="[]", help="JSON list of launch settings / knobs (module notes)")
    ap.add_argument("--shapes", help="comma-separated shape names (default: all of the family's)")
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="checkpoint dtypes")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script only)")
    ap.add_argument("--stagger", action="store_true",
                    help="row b starts at cursor b %% L (1/L of the rows flush at every step), instead of all at 0")
    args = ap.parse_args(argv)
    try:
        args.settings = json.loads(args.settings)
    except json.JSONDecodeError as e:
        raise UsageError(f"--settings is not JSON: {e}") from None
    if not isinstance(args.settings, list) or not all(isinstance(s, dict) for s in args.settings):
        raise UsageError("--settings takes a JSON list of objects")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UsageError(f"--batches takes comma-separated integers; got {args.batches!r}") from None
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad:
        raise UsageError(f"--dtypes: unknown {bad}; expected some of {sorted(DTYPES)}")
    args.dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    if args.L < 1 or args.reps < 1 or min(args.batches) < 1:
        raise UsageError("--L, --reps and --batches must be positive")
    if args.smoke:  # the interpreter is slow: short cycles, one round
        args.L, args.reps = min(args.L, 2), 1
    return args


def markdown(meta, rows):
    cols = list(rows[0]["us"]) if rows else []
    ref = meta["reference"]
    cursors = "staggered, row b from b mod L" if meta.get("stagger") else "all from 0"
    out = [f"# Replay kernel A/B ({meta['family']}), {meta['date']}", "",
           f"{meta['gpu']}; torch {meta['torch']}, Triton {meta['triton']}; L = {meta['L']}; µs per layer step over "
           f"whole cycles (flush included; cursors {cursors}), CUDA graphs, median of {meta['reps']} interleaved "
           f"rounds; in brackets "
           f"the speed relative to `{ref}`. Command: `{meta['command']}`.", "",
           "| shape | batch | checkpoint | " + " | ".join(f"`{c}`" for c in cols) + " |",
           "|---|---:|---|" + "---:|" * len(cols)]
    for r in rows:
        out.append(f"| {r['shape']} | {r['batch']} | {r['state']} | "
                   + " | ".join(f"{r['us'][c]:.2f} ({r['speed_vs_ref'][c]:.3f}x)" for c in cols) + " |")
    return "\n".join(out) + "\n"


def main(argv=None):
    try:
        args = parse(argv)
        if args.smoke and not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if not torch.cuda.is_available() and not args.smoke:
            raise UsageError("no CUDA device; nothing to time (--smoke runs tiny shapes anywhere)")
        bench = importlib.import_module("bench_mamba2" if args.family == "mamba2" else "bench_delta")
        if args.smoke:
            shapes = {"smoke": (4, 16, 16, 2)} if args.family == "mamba2" else {"smoke-kda": (2, 2, 16, 16, True)}
        else:
            shapes = dict(bench.SHAPES)
            if args.shapes:
                unknown = [s for s in args.shapes.split(",") if s not in shapes]
                if unknown:
                    raise UsageError(f"--shapes: unknown {unknown}; expected some of {sorted(shapes)}")
                shapes = {s: shapes[s] for s in args.shapes.split(",")}
        named = {k for st in args.settings for k in st}
        if args.family == "mamba2":
            from replayssm.kernels.mamba2.triton_decode import REPLAY_KNOBS

            unknown = sorted(set(named) - set(REPLAY_KNOBS))
            allowed = f"knobs of make_replay_config: {', '.join(REPLAY_KNOBS)}"
        else:
            unknown = bench.unknown_knobs(named)
            allowed = "keyword-only knobs of delta_replay_decode_triton"
        if unknown:
            raise UsageError(f"--settings: unknown {unknown}; expected {allowed}")
        mods = {}
        if args.baseline:
            mods["baseline"] = load_baseline(args.family, args.baseline)
        mods["default"] = importlib.import_module(f"replayssm.kernels.{args.family}.triton_decode")
    except UsageError as e:
        print(f"kernel_ab: {e}", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mssu = bench.load_mamba_ssm()[0] if args.family == "mamba2" and dev.type == "cuda" else None
    cell = mamba2_cell if args.family == "mamba2" else delta_cell
    ref = "baseline" if args.baseline else "default"
    rows = []
    for name, shape in shapes.items():
        for Bt in ([2] if args.smoke else args.batches):
            for sdt in args.dtypes:
                if args.smoke:
                    R = 1
                elif args.family == "mamba2":
                    R = bench.copies_for(Bt, shape[0], shape[1], shape[2], sdt.itemsize)
                else:
                    R = bench.copies_for(Bt, shape[1], shape[2], shape[3], sdt.itemsize)
                try:
                    bodies = cell(mods, args.settings, name, shape, Bt, sdt, args.L, R, dev, mssu, args.stagger)
                except ValueError as e:  # a setting the launch configuration refuses
                    print(f"kernel_ab: {name}, batch {Bt}, {sdt}: {e}", file=sys.stderr)
                    return 2
                t = {k: [] for k in bodies}
                for _ in range(args.reps):
                    for k, (fn, steps) in bodies.items():
                        t[k].append(time_steps(fn, steps))
                med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
                r = dict(shape=name, batch=Bt, state=str(sdt).replace("torch.", ""), copies=R,
                         us={k: round(v, 3) for k, v in med.items()},
                         speed_vs_ref={k: round(med[ref] / v, 4) for k, v in med.items()}, rounds=t)
                rows.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "rounds"}), flush=True)
                del bodies
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    import triton

    meta = dict(family=args.family, date=datetime.date.today().isoformat(),
                gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke run)",
                torch=torch.__version__, triton=triton.__version__, L=args.L, reps=args.reps, reference=ref,
                stagger=args.stagger,
                baseline=args.baseline, settings=args.settings,
                copy_bw_TBps=round(copy_bandwidth(dev) / 1e12, 3) if dev.type == "cuda" else None,
                command="python examples/benchmarks/kernel_ab.py " + " ".join(sys.argv[1:] if argv is None else argv))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_ab.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(os.path.join(args.out, "kernel_ab.md"), "w") as f:
        f.write(markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
