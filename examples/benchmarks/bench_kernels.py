"""Kernel benchmark: one layer's ReplaySSM decode step against per-step kernels, Mamba-2 and delta rule.

For each (family, layer shape, batch, checkpoint dtype) it times, on the same data, in CUDA graphs,
µs per layer step over whole L-step cycles (flush included), interleaved over ``--reps`` rounds
(median kept), with the working set rotated through enough state copies to stay above the L2:

* ``replay``: this checkout's kernels (``mamba2_replay_decode`` / ``delta_replay_decode``);
* ``baseline`` (``--baseline-tree DIR``): the same public functions of another checkout's ``kernels/``
  directory (e.g. ``git worktree add /tmp/old 3ff9c12``, then ``--baseline-tree /tmp/old/kernels``),
  loaded in this process under another name;
* with ``--phases``: ``output`` and ``flush``, one step whose rows all take the output-only route
  (cursors at (L - 1) // 2, mid-cycle) and one whose rows all flush (cursors at L - 1), each less the
  cursor fill that precedes it (``baseline_output`` / ``baseline_flush`` for a ``--baseline-tree``);
* with ``--launch FIELD=VALUE,...`` (repeatable): the replay step with the default ``LaunchConfig`` of
  each cell with those fields replaced (``launch[...]`` columns), to sweep launch rules in one run;
* ``step``: our fused per-step kernel (``mamba2_step_decode`` / ``delta_step_decode``);
* with ``--others``: mamba_ssm's ``selective_state_update`` (its file in ``.bench_vendor/``),
  flash-linear-attention's fused recurrent kernels (fp32 checkpoints, if importable), and
  transformers' own decode path (eager, up to batch 256).

Also the byte floor of replay and per-step updates over the copy bandwidth measured in the same
run (``frac``), the memory per sequence of one layer (checkpoint + int8/fp8 scales + rings), and for
the 8-bit checkpoints (``--dtypes ...,float8_e4m3fn,int8``) the replay time relative to the bf16
checkpoint's (``vs_bf16``; the per-step kernels do not store scales, nor does a ``--baseline-tree``
older than the 8-bit checkpoints, so those rows time replay and such a baseline only). Writes
``kernels.json`` and ``kernels.md`` under ``--out`` (default ``out/bench``).
``--smoke``: tiny shapes through the Triton interpreter on any machine (checks the script).
Method and results: examples/benchmarks/README.md; tuning record: TUNING.md.

    python examples/benchmarks/bench_kernels.py --batches 1,32,256 --baseline-tree /tmp/old/kernels
    python examples/benchmarks/bench_kernels.py --family delta --batches 256 --dtypes int8 \
        --launch block_k=64 --launch block_v=128,block_k=32
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baselines import check_baseline_tree, load_baseline_tree, load_fla, load_hf, load_mamba_ssm  # noqa: E402
from run_record import UsageError, cuda_or_smoke, run_meta, write_run  # noqa: E402

SHAPES = {  # mamba2: (H, P, N, G); delta: (Hk, HV, K, V, kda)
    "mamba2": {"nemotron3-super": (128, 64, 128, 8), "nemotron3-nano-4b": (96, 80, 128, 8),
               "mamba2-2.7b": (80, 64, 128, 1)},
    "delta": {"qwen3.5-4b-gdn": (16, 32, 128, 128, False), "qwen3.5-122b-gdn": (16, 64, 128, 128, False),
              "kimi-linear-kda": (32, 32, 128, 128, True)},
}
SMOKE_SHAPES = {"mamba2": {"smoke": (4, 16, 16, 2)},
                "delta": {"smoke-gdn": (2, 4, 16, 16, False), "smoke-kda": (2, 2, 16, 16, True)}}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
          "int8": torch.int8}
#: checkpoint dtypes that keep fp32 scales (one per head-dim vector; only the replay kernels store them)
SCALED = (torch.float8_e4m3fn, torch.int8)
L2_BYTES = 60e6
ACT = torch.bfloat16


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def copies_for(state_bytes: int) -> int:
    """State copies so that one graph's working set is at least 4x the L2 (at most 64)."""
    return max(1, min(64, math.ceil(4 * L2_BYTES / state_bytes)))


# ----------------------------------------------------------------------------- Mamba-2

class Mamba2Cell:
    """One Mamba-2 layer: inputs, R checkpoint copies with their buffers (cursors from 0 or staggered)."""

    def __init__(self, shape, Bt, sdt, L, dev, stagger, R=None):
        H, P, N, G = shape
        g = torch.Generator().manual_seed(0)
        self.shape, self.Bt, self.sdt, self.L = shape, Bt, sdt, L
        self.R = R or copies_for(Bt * H * P * N * sdt.itemsize)
        self.A = (-(0.5 + torch.rand(H, generator=g))).to(dev)
        self.dt_bias = (torch.randn(H, generator=g) * 0.5).to(dev)
        self.D = torch.randn(H, generator=g).to(dev)
        self.x = torch.randn(Bt, H, P, generator=g).to(ACT).to(dev)
        self.dt = (torch.randn(Bt, H, generator=g) * 0.5 - 2.5).to(ACT).to(dev)
        self.B = (torch.randn(Bt, G, N, generator=g) / math.sqrt(N)).to(ACT).to(dev)
        self.C = (torch.randn(Bt, G, N, generator=g) / math.sqrt(N)).to(ACT).to(dev)
        self.out = torch.empty(Bt, H, P, dtype=ACT, device=dev)
        self.copies = []
        for _ in range(self.R):
            cur = (torch.arange(Bt, dtype=torch.int32) % L if stagger else torch.zeros(Bt, dtype=torch.int32))
            self.copies.append((torch.randn(Bt, H, P, N, device=dev).to(sdt),
                                torch.randn(Bt, H, L, P, device=dev).to(ACT), torch.rand(Bt, H, L, device=dev) * 0.1,
                                (torch.randn(Bt, G, L, N, device=dev) / math.sqrt(N)).to(ACT), cur.to(dev),
                                torch.full((Bt, H, P), 0.02, device=dev) if sdt in SCALED else None))

    def call(self, mod, copy):
        """One step of ``mod.mamba2_replay_decode`` on one checkpoint copy."""
        st, xb, db, bb, cur, sc = copy
        kw = {"state_scale": sc} if sc is not None else {}
        mod.mamba2_replay_decode(self.x, self.dt, self.B, self.C, st, xb, db, bb, cur, self.A,
                                 self.dt_bias, self.D, None, True, self.out, backend="triton", **kw)

    def default_config(self):
        """The launch's default knobs for this cell (``launch.launch_config``)."""
        from replayssm.kernels.backend import num_sms
        from replayssm.kernels.mamba2.launch import launch_config

        H, P, N, G = self.shape
        dev = self.x.device
        return launch_config(None, self.Bt, H, P, N, G, self.L, self.sdt, ACT, num_sms(dev.type, dev.index))

    def call_config(self, cfg, copy):
        """One step of this checkout's replay launch with the launch knobs ``cfg``."""
        from replayssm.kernels.mamba2.launch import launch_replay

        st, xb, db, bb, cur, sc = copy
        launch_replay(self.x, self.dt, self.B, self.C, st, xb, db, bb, cur, self.A, self.dt_bias, self.D, None, True,
                      self.out, False, config=cfg, state_scale=sc)

    def step(self, mod, n=4):
        def body():
            for _ in range(n):
                for st, *_ in self.copies:
                    mod.mamba2_step_decode(self.x, self.dt, self.B, self.C, st, self.A, self.dt_bias, self.D,
                                           backend="triton")
        return body, n * self.R

    def hf_layout(self):
        H, P, N, G = self.shape
        return (self.dt[..., None].expand(self.Bt, H, P), self.A[:, None, None].expand(H, P, N),
                self.D[:, None].expand(H, P), self.dt_bias[:, None].expand(H, P))

    def others(self, extra):
        """mamba_ssm's and transformers' per-step updates (same argument layout), as available."""
        out = {}
        dt, A, D, dtb = self.hf_layout()
        for name, fn, n in (("mamba_ssm", extra.get("mamba_ssm"), 4), ("hf", extra.get("hf_mamba2"), 2)):
            if fn is None or (name == "hf" and self.Bt > 256):
                continue

            def body(fn=fn, n=n):
                for _ in range(n):
                    for st, *_ in self.copies:
                        fn(st, self.x, dt, A, self.B, self.C, D, z=None, dt_bias=dtb, dt_softplus=True)
            out[name] = (body, n * self.R, name == "hf")  # (body, steps, eager)
        return out

    def floors(self):
        """(replay, per-step) fewest bytes per step; the replay figure averaged over a cycle."""
        H, P, N, G = self.shape
        s, a, L, Bt = self.sdt.itemsize, ACT.itemsize, self.L, self.Bt
        io = H * P * a + H * a + 2 * G * N * a + H * P * a
        entry = H * P * a + H * 4 + G * N * a
        ck = H * P * N * s + (H * P * 4 if self.sdt in SCALED else 0)  # checkpoint (+ scales)
        replay = sum((2 if c == L - 1 else 1) * ck + c * entry + entry + io + 8 for c in range(L)) / L
        return Bt * replay, Bt * (2 * H * P * N * s + io)

    def bytes_per_seq(self):
        """One layer's cache bytes per sequence: checkpoint + scales + rings (+ cursor)."""
        H, P, N, G = self.shape
        ck = H * P * N * self.sdt.itemsize + (H * P * 4 if self.sdt in SCALED else 0)
        return ck + self.L * (H * P * ACT.itemsize + H * 4 + G * N * ACT.itemsize) + 4


# ----------------------------------------------------------------------------- delta rule

class DeltaCell:
    """One delta-rule layer: inputs, R checkpoint copies with their rings (cursors from 0 or staggered)."""

    def __init__(self, shape, Bt, sdt, L, dev, stagger, R=None):
        Hk, HV, K, V, kda = shape
        gen = torch.Generator().manual_seed(0)
        self.shape, self.Bt, self.sdt, self.L, self.kda = shape, Bt, sdt, L, kda
        self.R = R or copies_for(Bt * HV * K * V * sdt.itemsize)
        self.q = (_l2n(torch.randn(Bt, Hk, K, generator=gen)) * K ** -0.5).to(ACT).to(dev)
        self.k = _l2n(torch.randn(Bt, Hk, K, generator=gen)).to(ACT).to(dev)
        self.v = torch.randn(Bt, HV, V, generator=gen).to(ACT).to(dev)
        self.g = (-torch.exp(torch.randn(*((Bt, HV, K) if kda else (Bt, HV)), generator=gen) - 3.0)).to(dev)
        self.beta = torch.sigmoid(torch.randn(Bt, HV, generator=gen)).to(dev)
        self.out = torch.empty(Bt, HV, V, dtype=ACT, device=dev)
        self.copies = []
        for _ in range(self.R):
            gb = -torch.rand(*((Bt, HV, L, K) if kda else (Bt, HV, L)), device=dev) * 0.05
            cur = (torch.arange(Bt, dtype=torch.int32) % L if stagger else torch.zeros(Bt, dtype=torch.int32))
            self.copies.append(((torch.randn(Bt, HV, K, V, device=dev) * 0.1).to(sdt),
                                torch.randn(Bt, HV, L, V, device=dev).to(ACT),
                                _l2n(torch.randn(Bt, Hk, L, K, device=dev)).to(ACT),
                                gb.cumsum(2) if kda else gb, cur.to(dev),
                                torch.full((Bt, HV, V), 0.002, device=dev) if sdt in SCALED else None))

    def inputs(self):
        return self.q, self.k, self.v, self.g, self.beta

    def call(self, mod, copy):
        """One step of ``mod.delta_replay_decode`` on one checkpoint copy."""
        *bufs, sc = copy
        kw = {"state_scale": sc} if sc is not None else {}
        mod.delta_replay_decode(*self.inputs(), *bufs, self.out, backend="triton", **kw)

    def default_config(self):
        """The launch's default knobs for this cell."""
        from replayssm.kernels.delta.config import default_config

        Hk, HV, K, V, kda = self.shape
        return default_config(self.Bt, K, V, self.sdt, kda)

    def call_config(self, cfg, copy):
        """One step of this checkout's replay launches with the launch knobs ``cfg``."""
        from replayssm.kernels.delta.launch import delta_replay_decode_triton

        *bufs, sc = copy
        delta_replay_decode_triton(*self.inputs(), *bufs, self.out, config=cfg, state_scale=sc)

    def step(self, mod, n=8):
        def body():
            for _ in range(n):
                for st, *_ in self.copies:
                    mod.delta_step_decode(*self.inputs(), st, backend="triton")
        return body, n * self.R

    def others(self, extra):
        """transformers' decode function (fp32 state, eager, with its cache copy-back)."""
        Hk, HV, K, V, kda = self.shape
        fn = extra.get("hf_kda" if kda else "hf_gdn")
        if fn is None or self.Bt > 256:
            return {}
        grp = HV // Hk
        q, k = (t.repeat_interleave(grp, 1)[:, None] for t in (self.q, self.k))
        st32 = torch.randn(self.Bt, HV, K, V, device=self.v.device) * 0.1
        params = inspect.signature(fn).parameters
        kw = {n: v for n, v in (("initial_state", st32), ("output_final_state", True),
                                ("use_qk_l2norm_in_kernel", False)) if n in params}

        def body():
            o, new = fn(q, k, self.v[:, None], self.g[:, None], self.beta[:, None], **kw)
            st32.copy_(new)  # the cache copy-back transformers does after the call
        return {"hf": (body, 1, True)}

    def floors(self):
        Hk, HV, K, V, kda = self.shape
        s, a, L, Bt = self.sdt.itemsize, ACT.itemsize, self.L, self.Bt
        io = Hk * 2 * K * a + HV * (V * a + (4 * K if kda else 4) + 4) + HV * V * a
        entry = HV * (V * a + (4 * K if kda else 4)) + Hk * K * a
        ck = HV * K * V * s + (HV * V * 4 if self.sdt in SCALED else 0)  # checkpoint (+ scales)
        replay = sum((2 if c == L - 1 else 1) * ck + c * entry + (0 if c == L - 1 else entry) + io + 8
                     for c in range(L)) / L
        return Bt * replay, Bt * (2 * HV * K * V * s + io)

    def bytes_per_seq(self):
        """One layer's cache bytes per sequence: checkpoint + scales + rings (+ cursor)."""
        Hk, HV, K, V, kda = self.shape
        ck = HV * K * V * self.sdt.itemsize + (HV * V * 4 if self.sdt in SCALED else 0)
        return ck + self.L * (HV * V * ACT.itemsize + Hk * K * ACT.itemsize + HV * (4 * K if kda else 4)) + 4


# ----------------------------------------------------------------------------- timing

#: ``--phases`` columns (``baseline_`` in front for a ``--baseline-tree``): a step whose rows all take the
#: output-only route, and one whose rows all flush
PHASES = ("output", "flush")


def replay_body(cell, mod, cfg=None):
    """Whole L-step cycles of ``cell.call`` on every copy (cursors end where they began); with a
    launch config ``cfg``, of ``cell.call_config`` (this checkout's launch with those knobs)."""
    def body():
        for _ in range(cell.L):
            for copy in cell.copies:
                if cfg is None:
                    cell.call(mod, copy)
                else:
                    cell.call_config(cfg, copy)
    return body, cell.L * cell.R


def launch_variants(cell, overrides) -> dict:
    """``launch[...]`` bodies: the cell's default ``LaunchConfig`` with each override set's fields replaced."""
    out = {}
    for fields in overrides:
        try:
            cfg = dataclasses.replace(cell.default_config(), **fields)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--launch {fields}: {exc}") from None
        out["launch[" + ",".join(f"{k}={v}" for k, v in fields.items()) + "]"] = (*replay_body(cell, None, cfg), False)
    return out


def parse_launch(text: str) -> dict:
    """``--launch`` text ``FIELD=VALUE,...`` -> {field: Python literal}."""
    fields = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        try:
            fields[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            sep = ""
        if not sep or not name.strip():
            raise UsageError(f"--launch takes FIELD=VALUE,... with Python literals; got {text!r}")
    if not fields:
        raise UsageError(f"--launch takes FIELD=VALUE,...; got {text!r}")
    return fields


def phase_body(cell, mod, cursor: int | None):
    """One step per copy with every row's cursor first set to ``cursor`` (L - 1: every row flushes;
    below: the output-only route over ``cursor`` ring entries); ``None``: the cursor fills alone."""
    def body():
        for copy in cell.copies:
            copy[4].fill_(0 if cursor is None else cursor)
            if cursor is not None:
                cell.call(mod, copy)
    return body, cell.R


def copy_bandwidth(dev) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written (1 GiB each way)."""
    import triton.testing

    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() / (ms * 1e-3)


def time_steps(body, steps: int, eager: bool = False) -> float:
    """Median µs per step of ``body`` (which runs ``steps`` steps), replayed as a CUDA graph (eager: as
    is). ``body`` runs once first on a side stream (compiles; whole cycles leave the cursors where
    they began). Without CUDA (a smoke run under the interpreter) the wall clock of one call."""
    import time

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
    fn, g = body, None
    if not eager:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        fn = g.replay
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3 / steps


def takes_scales(mod, family: str) -> bool:
    """Whether a kernels tree's replay function reads int8 / fp8 checkpoints (``state_scale``)."""
    fn = mod.mamba2_replay_decode if family == "mamba2" else mod.delta_replay_decode
    return "state_scale" in inspect.signature(fn).parameters


def bench_cell(family, name, shape, Bt, sdt, args, mods, extra, dev):
    cell = (Mamba2Cell if family == "mamba2" else DeltaCell)(shape, Bt, sdt, args.L, dev, args.stagger,
                                                             R=1 if args.smoke else None)
    bodies = {"replay": (*replay_body(cell, mods["replay"][family]), False)}
    scaled = sdt in SCALED  # only the replay kernels read and write scaled checkpoints
    if "baseline" in mods and (not scaled or takes_scales(mods["baseline"][family], family)):
        bodies["baseline"] = (*replay_body(cell, mods["baseline"][family]), False)
    if args.phases:
        bodies["fill"] = (*phase_body(cell, mods["replay"][family], None), False)
        for tree in [t for t in ("replay", "baseline") if t in bodies]:
            for phase, cursor in (("output", (cell.L - 1) // 2), ("flush", cell.L - 1)):
                key = phase if tree == "replay" else f"baseline_{phase}"
                bodies[key] = (*phase_body(cell, mods[tree][family], cursor), False)
    bodies.update(launch_variants(cell, args.launch))
    if not scaled:
        bodies["step"] = (*cell.step(mods["replay"][family]), False)
    if args.others and not scaled:
        bodies.update(cell.others(extra))
    times = {k: [] for k in bodies}
    for _ in range(args.reps):  # interleaved rounds, median kept
        for k, (fn, steps, eager) in bodies.items():
            times[k].append(time_steps(fn, steps, eager))
    if args.others and family == "delta" and sdt == torch.float32 and extra.get("fla"):
        us = time_fla(name, Bt, args.reps)
        if us is not None:
            times["fla"] = [us]
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    if args.phases:  # a phase step without its cursor fill
        fill = med.pop("fill")
        med.update({k: med[k] - fill for k in med if k.endswith(PHASES)})
        times.pop("fill")
    replay_b, step_b = cell.floors()
    ref = "baseline" if "baseline" in med else "replay"
    floor = {k: replay_b for k in med if k in ("replay", "baseline") or k.startswith("launch[")}
    return dict(family=family, shape=name, batch=Bt, checkpoint=str(sdt).replace("torch.", ""), copies=cell.R,
                bytes_per_seq=cell.bytes_per_seq(),
                achieved_TBps=round(replay_b / (med["replay"] * 1e-6) / 1e12, 3),
                us={k: round(v, 3) for k, v in med.items()},
                speed_vs_ref={k: round(med[ref] / v, 4) for k, v in med.items()},
                frac_floor={k: float(f"{floor.get(k, step_b) / args.copy_bw * 1e6 / v:.4g}") for k, v in med.items()
                            if not k.endswith(PHASES)},
                rounds=times)


# ----------------------------------------------------------------------------- flash-linear-attention

def time_fla(name, Bt, reps):
    """fla's fused recurrent step (fp32 state, in place for KDA) in a child process, so that a fault in
    a kernel that is not this project's (an illegal address ends the CUDA context) cannot end this
    run; None (and the child's last line on stderr) when it fails."""
    import subprocess

    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--fla-child", json.dumps([name, Bt, reps])],
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])["us"]
    print(f"bench_kernels: fla {name} batch {Bt}: exit {p.returncode}: "
          f"{(p.stderr.strip().splitlines() or ['no output'])[-1][:300]}", file=sys.stderr)
    return None


def fla_child(spec: str) -> int:
    """``time_fla``'s child: checks one fla step against our per-step kernel, then times it."""
    import replayssm.kernels.delta as delta

    name, Bt, reps = json.loads(spec)
    shape = SHAPES["delta"][name]
    fns, _ = load_fla()
    fn = fns.get("kda" if shape[4] else "gdn")
    cell = DeltaCell(shape, Bt, torch.float32, 16, torch.device("cuda"), False, R=1)
    st = cell.copies[0][0]
    # by keyword: fla's GDN entry takes (q, k, v, g, gk, gv, beta, ...)
    kw = dict(g=cell.g[:, None], beta=cell.beta[:, None], output_final_state=True, scale=1.0)
    if shape[4]:
        kw["inplace_final_state"] = True
    q4, k4, v4 = (t[:, None] for t in (cell.q, cell.k, cell.v))
    ref = delta.delta_step_decode(*cell.inputs(), st.clone(), backend="triton").float()
    diff = (fn(q4, k4, v4, initial_state=st.clone(), **kw)[0][:, 0].float() - ref).abs().max().item()
    if not diff <= 1e-2 * max(1.0, ref.abs().max().item()):
        print(f"fla's output differs from the per-step kernel's by {diff:.3g}; not timed", file=sys.stderr)
        return 1
    us = sorted(time_steps(lambda: fn(q4, k4, v4, initial_state=st, **kw), 1) for _ in range(reps))[reps // 2]
    print(json.dumps({"us": us}), flush=True)
    return 0


# ----------------------------------------------------------------------------- command line

def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="mamba2,delta", help="mamba2, delta or both (comma-separated)")
    ap.add_argument("--shapes", help="comma-separated shape names (default: all of each family's)")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="checkpoint dtypes")
    ap.add_argument("--L", type=int, default=16, help="buffer length")
    ap.add_argument("--reps", type=int, default=3, help="interleaved timing rounds (median kept)")
    ap.add_argument("--stagger", action="store_true",
                    help="row b starts at cursor b %% L (1/L of the rows flush at every step) instead of all at 0")
    ap.add_argument("--phases", action="store_true",
                    help="also time the replay's output-only step (cursors at (L - 1) // 2) and its flush step apart")
    ap.add_argument("--baseline-tree", help="another checkout's kernels/ directory, timed beside this one")
    ap.add_argument("--launch", action="append", default=[], metavar="FIELD=VALUE,...",
                    help="also the replay step with these LaunchConfig fields replaced in each cell's default "
                         "(repeatable: one column each)")
    ap.add_argument("--others", action="store_true", help="also mamba_ssm, flash-linear-attention, transformers")
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script only)")
    args = ap.parse_args(argv)
    args.family = args.family.split(",")
    if not args.family or any(f not in SHAPES for f in args.family):
        raise UsageError(f"--family takes mamba2, delta or both; got {','.join(args.family)!r}")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UsageError(f"--batches takes comma-separated integers; got {args.batches!r}") from None
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad:
        raise UsageError(f"--dtypes: unknown {bad}; expected some of {sorted(DTYPES)}")
    args.dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    if args.L < 2 or args.reps < 1 or min(args.batches) < 1:
        raise UsageError("--batches and --reps must be positive and --L at least 2")
    args.launch = [parse_launch(t) for t in args.launch]
    table = SMOKE_SHAPES if args.smoke else SHAPES
    args.cells = {f: dict(table[f]) for f in args.family}
    if args.shapes:
        wanted = args.shapes.split(",")
        known = {s for f in args.family for s in table[f]}
        if set(wanted) - known:
            raise UsageError(f"--shapes: unknown {sorted(set(wanted) - known)}; expected some of {sorted(known)}")
        args.cells = {f: {s: v for s, v in c.items() if s in wanted} for f, c in args.cells.items()}
    if args.baseline_tree:
        check_baseline_tree(args.baseline_tree)
    if args.smoke:  # the interpreter is slow: short cycles, small batches, one round
        args.L, args.reps, args.batches = min(args.L, 2), 1, [2]
    return args


def add_relative_columns(rows) -> None:
    """``vs_bf16``: replay time over the bf16 checkpoint's, same family / shape / batch; ``mem_vs``:
    bytes per sequence over the fp32 and bf16 checkpoints' (where those rows ran)."""
    by = {(r["family"], r["shape"], r["batch"], r["checkpoint"]): r for r in rows}
    for r in rows:
        key = (r["family"], r["shape"], r["batch"])
        bf = by.get(key + ("bfloat16",))
        if bf is not None:
            r["vs_bf16"] = round(r["us"]["replay"] / bf["us"]["replay"], 4)
        r["mem_vs"] = {d: round(r["bytes_per_seq"] / by[key + (d,)]["bytes_per_seq"], 4)
                       for d in ("float32", "bfloat16") if key + (d,) in by}


def markdown(meta, rows):
    cols = list(dict.fromkeys(k for r in rows for k in r["us"]))
    cursors = "staggered, row b from b mod L" if meta["stagger"] else "all from 0"
    out = [f"# Kernel benchmark, {meta['date']}", "",
           f"{meta['gpu']}; torch {meta['torch']}, Triton {meta['triton']}; L = {meta['L']}; µs per layer step over "
           f"whole cycles (flush included; cursors {cursors}); CUDA graphs (transformers eager); median of "
           f"{meta['reps']} interleaved rounds; activations bf16. In brackets: speed relative to "
           f"`{meta['reference']}`; `frac`: byte floor / time at the copy bandwidth of this run "
           f"({meta['copy_bw_TBps']} TB/s). Command: `{meta['command']}`.", "",
           "| family | shape | batch | checkpoint | " + " | ".join(f"`{c}`" for c in cols)
           + " | frac replay | TB/s replay | replay vs bf16 | KiB/seq (vs fp32, bf16) |",
           "|---|---|---:|---|" + "---:|" * (len(cols) + 4)]
    for r in rows:
        cells = [f"{r['us'][c]:.2f} ({r['speed_vs_ref'][c]:.3f}x)" if c in r["us"] else "—" for c in cols]
        mem = f"{r['bytes_per_seq'] / 1024:.0f}" + (" (" + ", ".join(f"{v:.2f}x" for v in r["mem_vs"].values()) + ")"
                                                     if r["mem_vs"] else "")
        vs = f"{r['vs_bf16']:.3f}x" if "vs_bf16" in r else "—"
        out.append(f"| {r['family']} | {r['shape']} | {r['batch']} | {r['checkpoint']} | " + " | ".join(cells)
                   + f" | {r['frac_floor']['replay']:.2f} | {r['achieved_TBps']:.2f} | {vs} | {mem} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--fla-child"]:
        return fla_child(argv[1])
    try:
        args = parse(argv)
        cuda_or_smoke(args.smoke)
        import replayssm.kernels.delta as delta
        import replayssm.kernels.mamba2 as mamba2

        mods = {"replay": {"mamba2": mamba2, "delta": delta}}
        if args.baseline_tree:
            mods["baseline"] = load_baseline_tree(args.baseline_tree)
    except UsageError as e:
        print(f"bench_kernels: {e}", file=sys.stderr)
        return 2

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extra, notes = {}, {}
    if args.others and dev.type == "cuda":
        extra["hf_mamba2"], extra["hf_gdn"], extra["hf_kda"], notes["hf"] = load_hf()
        extra["mamba_ssm"], notes["mamba_ssm"] = load_mamba_ssm()
        extra["fla"], notes["fla"] = load_fla()
    args.copy_bw = copy_bandwidth(dev) if dev.type == "cuda" else 1e11  # nominal on CPU (smoke runs only)
    rows = []
    for family, shapes in args.cells.items():
        for name, shape in shapes.items():
            for Bt in args.batches:
                for sdt in args.dtypes:
                    try:
                        r = bench_cell(family, name, shape, Bt, sdt, args, mods, extra, dev)
                    except UsageError as e:  # a --launch field the family's LaunchConfig does not have
                        print(f"bench_kernels: {e}", file=sys.stderr)
                        return 2
                    rows.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "rounds"}), flush=True)
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
    add_relative_columns(rows)
    meta = run_meta("bench_kernels.py", argv, dev, L=args.L, reps=args.reps, stagger=args.stagger,
                    reference="baseline" if args.baseline_tree else "replay", baseline_tree=args.baseline_tree,
                    copy_bw_TBps=round(args.copy_bw / 1e12, 3), others=notes)
    write_run(args.out, "kernels", meta, rows, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
