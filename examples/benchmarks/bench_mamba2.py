"""Mamba-2 decode step: ReplaySSM Triton kernel vs per-step updates, on one layer.

Times one layer's decode step amortised over a whole L-step cycle (L consecutive steps
from cursor 0, the flush included, divided by L), for several batch sizes and model
shapes, against (in the same run):

* ``step``: this project's fused per-step Triton kernel (reads and writes the state);
* ``mamba_ssm``: mamba_ssm's Triton ``selective_state_update``, if its source was put in
  ``.bench_vendor/`` (benchmark only; loaded by path, never a dependency);
* ``hf``: the installed transformers' own decode path for the layer
  (``modeling_mamba2.mamba2_selective_state_update`` with the HF argument layout);
* the byte floor: the bytes each variant must move, over the copy bandwidth measured here.

Every variant runs inside a CUDA graph whose body interleaves R copies of the layer's
state (and buffers) so that the working set is well above the L2 cache; time per step is
the graph's median replay time (``triton.testing.do_bench``) over the steps it holds.

    python examples/benchmarks/bench_mamba2.py --out DIR [--quick] [--sweep]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared timing helpers
from timing import copy_bandwidth, stagger_cursors, time_steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {  # (H, P, N, G)
    "nemotron3-nano-4b": (96, 80, 128, 8),
    "nemotron3-super": (128, 64, 128, 8),
    "mamba2-2.7b": (80, 64, 128, 1),
}
BATCHES = [1, 8, 32, 128, 256, 512]
LS = [8, 16, 32]
L2_BYTES = 60e6


# ----------------------------------------------------------------------------- loaders

def load_mamba_ssm():
    """mamba_ssm's selective_state_update from .bench_vendor/ (its package __init__ needs CUDA extensions)."""
    vendor = ROOT / ".bench_vendor"
    ssu, sp = vendor / "selective_state_update.py", vendor / "softplus.py"
    if not (ssu.exists() and sp.exists()):
        return None, "absent (.bench_vendor/ not carried)"
    try:
        for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
            if name not in sys.modules:
                m = types.ModuleType(name)
                m.__path__ = []
                sys.modules[name] = m
        spec = importlib.util.spec_from_file_location("mamba_ssm.ops.triton.softplus", sp)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        spec = importlib.util.spec_from_file_location("mamba_ssm.ops.triton.selective_state_update", ssu)
        mod2 = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod2
        spec.loader.exec_module(mod2)
        return mod2.selective_state_update, "mamba_ssm (vendored source, loaded by path)"
    except Exception as e:  # pragma: no cover - depends on the machine
        return None, f"failed to load: {type(e).__name__}: {e}"


def load_hf():
    try:
        import transformers
        from transformers.models.mamba2 import modeling_mamba2 as mm

        path = "its PyTorch path" if importlib.util.find_spec("mamba_ssm") is None else "mamba_ssm is installed"
        return mm.mamba2_selective_state_update, f"transformers {transformers.__version__} ({path})"
    except Exception as e:  # pragma: no cover
        return None, f"unavailable: {type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- timing

# ----------------------------------------------------------------------------- bytes

def step_bytes(Bt, H, P, N, G, s, a):
    """Fewest bytes of one per-step update: state read + write, inputs, output."""
    inputs = H * P * a + H * a + 2 * G * N * a
    return Bt * (2 * H * P * N * s + inputs + H * P * a)


def replay_bytes(Bt, H, P, N, G, L, s, a):
    """Fewest bytes of one ReplaySSM step averaged over an L-step cycle (flush included)."""
    inputs = H * P * a + H * a + 2 * G * N * a
    append = H * P * a + H * 4 + G * N * a
    entry = H * P * a + H * 4 + G * N * a  # one buffered entry read
    total = 0
    for c in range(L):
        state = (2 if c == L - 1 else 1) * H * P * N * s
        total += state + c * entry + append + inputs + H * P * a + 8  # + cursor read/write
    return Bt * total / L


def copies_for(Bt, H, P, N, s):
    """State copies so that one graph's working set is at least 3x the L2 (at most 64)."""
    return max(1, min(64, math.ceil(3 * L2_BYTES / (Bt * H * P * N * s))))


def buffer_pct(H, P, N, G, L, s, a):
    return 100.0 * (H * L * P * a + H * L * 4 + G * L * N * a) / (H * P * N * s)


# ----------------------------------------------------------------------------- one config

class Layer:
    def __init__(self, Bt, H, P, N, G, sdt, adt, R, dev, seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.dims = (Bt, H, P, N, G)
        self.sdt, self.adt, self.R = sdt, adt, R
        self.A = (-(0.5 + torch.rand(H, generator=g))).to(dev)
        self.dt_bias = (torch.randn(H, generator=g) * 0.5).to(dev)
        self.D = torch.randn(H, generator=g).to(dev)
        self.x = torch.randn(Bt, H, P, generator=g).to(adt).to(dev)
        self.dt = (torch.randn(Bt, H, generator=g) * 0.5 - 2.5).to(adt).to(dev)
        self.B = (torch.randn(Bt, G, N, generator=g) / math.sqrt(N)).to(adt).to(dev)
        self.C = (torch.randn(Bt, G, N, generator=g) / math.sqrt(N)).to(adt).to(dev)
        self.states = [torch.randn(Bt, H, P, N, device=dev).to(sdt) for _ in range(R)]
        self.out = torch.empty(Bt, H, P, dtype=adt, device=dev)
        # HF / mamba_ssm argument layout
        self.dt_hf = self.dt[..., None].expand(Bt, H, P)
        self.A_hf = self.A[:, None, None].expand(H, P, N)
        self.D_hf = self.D[:, None].expand(H, P)
        self.dtb_hf = self.dt_bias[:, None].expand(H, P)

    def replay_body(self, bufs, steps, config=None, cursor=None):
        """A function running ``steps`` replay steps on every copy (interleaved across copies);
        with ``cursor`` set, every step starts from that cursor (one step kind alone)."""
        from replayssm.kernels.mamba2.triton_decode import launch_mamba2_replay_decode

        def body():
            for _ in range(steps):
                for st, (xb, db, bb, cur) in zip(self.states, bufs):
                    if cursor is not None:
                        cur.fill_(cursor)
                    launch_mamba2_replay_decode(self.x, self.dt, self.B, self.C, st, xb, db, bb, cur, self.A,
                                                self.dt_bias, self.D, None, True, self.out, False, config=config)

        return body

    def buffers(self, L):
        Bt, H, P, N, G = self.dims
        dev = self.x.device
        bufs = []
        for _ in range(self.R):
            bufs.append((torch.randn(Bt, H, L, P, device=dev).to(self.adt), torch.rand(Bt, H, L, device=dev) * 0.1,
                         (torch.randn(Bt, G, L, N, device=dev) / math.sqrt(N)).to(self.adt),
                         torch.zeros(Bt, dtype=torch.int32, device=dev)))
        return bufs


def step_steps(lay, K):
    """A function running ``K`` steps of our fused per-step kernel on every copy of ``lay``'s state."""
    from replayssm.kernels.mamba2.triton_step import launch_mamba2_step_decode

    def body():
        for _ in range(K):
            for st in lay.states:
                launch_mamba2_step_decode(lay.x, lay.dt, lay.B, lay.C, st, lay.A, lay.dt_bias, lay.D, None, True,
                                          lay.out)

    return body


def mamba_ssm_steps(lay, mssu, K):
    """A function running ``K`` steps of mamba_ssm's ``selective_state_update`` on every copy."""
    def body():
        for _ in range(K):
            for st in lay.states:
                mssu(st, lay.x, lay.dt_hf, lay.A_hf, lay.B, lay.C, D=lay.D_hf, z=None, dt_bias=lay.dtb_hf,
                     dt_softplus=True)

    return body


def bench_config(name, shape, Bt, sdt, adt, Ls, mssu, hf, dev, copy_bw, use_graph=True, hf_max_batch=256,
                 tuned=None, stagger_L=16, copies=None):
    H, P, N, G = shape
    s, a = torch.tensor([], dtype=sdt).element_size(), torch.tensor([], dtype=adt).element_size()
    R = copies or copies_for(Bt, H, P, N, s)
    lay = Layer(Bt, H, P, N, G, sdt, adt, R, dev)
    res = dict(shape=name, H=H, P=P, N=N, G=G, batch=Bt, state_dtype=str(sdt).split(".")[-1],
               act_dtype=str(adt).split(".")[-1], copies=R)
    sb = step_bytes(Bt, H, P, N, G, s, a)
    res["step_floor_us"] = sb / copy_bw * 1e6
    K = 4  # per-step variants: K steps over each copy

    res["step_us"] = time_steps(step_steps(lay, K), K * R, graph=use_graph)
    if mssu is not None:
        try:
            res["mamba_ssm_us"] = time_steps(mamba_ssm_steps(lay, mssu, K), K * R, graph=use_graph)
        except Exception as e:
            res["mamba_ssm_error"] = f"{type(e).__name__}: {e}"[:300]
    if hf is not None and Bt <= hf_max_batch:
        Kh = 2

        def hf_body():
            for _ in range(Kh):
                for st in lay.states:
                    hf(st, lay.x, lay.dt_hf, lay.A_hf, lay.B, lay.C, lay.D_hf, z=None, dt_bias=lay.dtb_hf,
                       dt_softplus=True)

        try:
            res["hf_us"] = time_steps(hf_body, Kh * R, graph=use_graph)
        except Exception as e:
            res["hf_error"] = f"{type(e).__name__}: {e}"[:300]
    from replayssm.kernels.mamba2.triton_decode import make_replay_config

    for L in Ls:
        bufs = lay.buffers(L)
        cfg = None
        if tuned:
            kn = dict(tuned)
            if L > 16 and "BLOCK_NF" in kn:  # longer windows: smaller flush tiles (registers)
                kn["BLOCK_NF"] = max(16, kn["BLOCK_NF"] // 2)
            cfg = make_replay_config(H, P, N, G, L, **kn)

        replay_body = lay.replay_body(bufs, L, cfg)  # one full cycle for every copy

        res[f"replay_L{L}_us"] = time_steps(replay_body, L * R, graph=use_graph)
        res[f"replay_L{L}_floor_us"] = replay_bytes(Bt, H, P, N, G, L, s, a) / copy_bw * 1e6
        res[f"buffer_pct_L{L}"] = buffer_pct(H, P, N, G, L, s, a)
        if L == stagger_L and Bt >= L:
            # serving-like: row b starts at cursor b % L, so 1/L of the rows flush at every step
            stagger_cursors([cur for _, _, _, cur in bufs], L)
            res[f"replay_L{L}_staggered_us"] = time_steps(replay_body, L * R, graph=use_graph)
        del bufs
    res["replay_config"] = tuned or "default heuristics"
    del lay
    torch.cuda.empty_cache()
    return res


def summarize(r, Ls):
    reps = {L: r[f"replay_L{L}_us"] for L in Ls if f"replay_L{L}_us" in r}
    bestL = min(reps, key=reps.get)
    r["best_L"] = bestL
    r["replay_us"] = reps[bestL]
    r["replay_floor_us"] = r[f"replay_L{bestL}_floor_us"]
    r["replay_frac_floor"] = r["replay_floor_us"] / r["replay_us"]
    r["step_frac_floor"] = r["step_floor_us"] / r["step_us"]
    r["speedup_vs_step"] = r["step_us"] / r["replay_us"]
    for k in ("mamba_ssm", "hf"):
        if f"{k}_us" in r:
            r[f"speedup_vs_{k}"] = r[f"{k}_us"] / r["replay_us"]
            r[f"{k}_frac_floor"] = r["step_floor_us"] / r[f"{k}_us"]
    for L in Ls:
        if f"replay_L{L}_us" in r:
            r[f"speedup_vs_step_L{L}"] = r["step_us"] / r[f"replay_L{L}_us"]
    if "replay_L16_staggered_us" in r:
        r["speedup_vs_step_L16_staggered"] = r["step_us"] / r["replay_L16_staggered_us"]
        r["replay_L16_staggered_frac_floor"] = r["replay_L16_floor_us"] / r["replay_L16_staggered_us"]
    return r


def fmt(v, spec="{:.1f}"):
    return "—" if v is None else spec.format(v)


def markdown(results, meta, Ls):
    lines = [f"# Mamba-2 decode step: ReplaySSM vs per-step update ({meta['gpu']})", "",
             f"{meta['date']}; torch {meta['torch']}, triton {meta['triton']}, transformers {meta['transformers']}; "
             f"mamba_ssm: {meta['mamba_ssm']}.", "",
             f"Copy bandwidth measured in this run: {meta['copy_bw_GBps']:.0f} GB/s (bytes read + written). "
             "Times are µs per decode step of one layer, amortised over a whole L-step cycle (flush included), "
             "CUDA graphs, working set rotated above L2. Activations bf16. `frac` = byte floor / time "
             "(fraction of the copy bandwidth). `buf%` = buffer memory / checkpoint at L=16. `stag. L=16`: "
             "rows start at cursor b mod 16, so 1/16 of the rows flush at every step (serving-like; batch >= 16). "
             "HF (the transformers PyTorch path) is timed up to batch 256. Replay configuration at batch >= 256: the best of a few launch configurations timed at batch 256 "
             "for that shape and state dtype (see `tuning` in the JSON); below 256 the default heuristics.", ""]
    hdr = ("| shape | state | batch | " + " | ".join(f"replay L={L}" for L in Ls) +
           " | best L | stag. L=16 | step (ours) | mamba_ssm | HF | ×step | ×step stag. | ×mamba_ssm | ×HF | "
           "frac replay | frac step | frac mamba_ssm | frac HF | buf% |")
    lines += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for r in results:
        lines.append(
            f"| {r['shape']} | {r['state_dtype']} | {r['batch']} | "
            + " | ".join(fmt(r.get(f"replay_L{L}_us")) for L in Ls)
            + f" | {r['best_L']} | {fmt(r.get('replay_L16_staggered_us'))} | {fmt(r['step_us'])} | "
            f"{fmt(r.get('mamba_ssm_us'))} | {fmt(r.get('hf_us'))} | "
            f"{fmt(r['speedup_vs_step'], '{:.2f}')} | {fmt(r.get('speedup_vs_step_L16_staggered'), '{:.2f}')} | "
            f"{fmt(r.get('speedup_vs_mamba_ssm'), '{:.2f}')} | "
            f"{fmt(r.get('speedup_vs_hf'), '{:.2f}')} | {fmt(r['replay_frac_floor'], '{:.2f}')} | "
            f"{fmt(r['step_frac_floor'], '{:.2f}')} | {fmt(r.get('mamba_ssm_frac_floor'), '{:.2f}')} | "
            f"{fmt(r.get('hf_frac_floor'), '{:.2f}')} | {fmt(r.get('buffer_pct_L16'), '{:.1f}')} |")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir, meta, results, tuning, Ls, t0):
    meta["tuning"] = tuning
    meta["elapsed_s"] = time.time() - t0
    (out_dir / "mamba2_bench.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    md = markdown(results, meta, Ls)
    (out_dir / "mamba2_bench.md").write_text(md)
    return md


# ----------------------------------------------------------------------------- tuning

def tune_candidates(H, P, N, G):
    """A few launch configurations of the replay kernel for large batches (None = default heuristics)."""
    HPG = H // G
    HC = min(HPG, 16)
    return [None,
            dict(BLOCK_P=32, HC=HC, BLOCK_NF=64, num_warps=2, early_load=True),
            dict(BLOCK_P=32, HC=HC, BLOCK_NF=64, num_warps=1, num_stages=2, early_load=True),
            dict(BLOCK_P=32, HC=max(1, HC // 2), BLOCK_NF=64, num_warps=2, early_load=True),
            dict(BLOCK_P=32, HC=HC, BLOCK_NF=32, num_warps=2, early_load=True),
            dict(BLOCK_P=32, HC=HC, BLOCK_NF=32, num_warps=4)]  # the defaults before 2026-11-30 (fp32)


def tune_replay(name, shape, sdt, dev, copy_bw, tuning, log, Bt=256, L=16):
    """Time the candidates on a synchronised L-step cycle at batch ``Bt``; return the fastest's knobs."""
    from replayssm.kernels.mamba2.triton_decode import make_replay_config

    H, P, N, G = shape
    lay = Layer(Bt, H, P, N, G, sdt, torch.bfloat16, 1, dev)
    bufs = lay.buffers(L)
    s = torch.tensor([], dtype=sdt).element_size()
    floor = replay_bytes(Bt, H, P, N, G, L, s, 2) / copy_bw * 1e6
    best, best_us = None, float("inf")
    for kn in tune_candidates(H, P, N, G):
        cfg = make_replay_config(H, P, N, G, L, **kn) if kn else None

        body = lay.replay_body(bufs, L, cfg)

        try:
            us = time_steps(body, L)
        except Exception as e:  # pragma: no cover
            tuning.append(dict(shape=name, state=str(sdt), knobs=kn, error=str(e)[:300]))
            continue
        tuning.append(dict(shape=name, state=str(sdt), batch=Bt, L=L, knobs=kn or "default", us=us, frac=floor / us))
        log(tuning[-1])
        if us < best_us:
            best, best_us = kn, us
    del lay, bufs
    torch.cuda.empty_cache()
    return best


# ----------------------------------------------------------------------------- tuning sweep

def sweep(dev, copy_bw, out_dir, log):
    """Time a few launch configurations of both kernels (Super shape) to pick the defaults,
    and the replay kernel's three kinds of step (cursor 0, cursor L-2, flush) separately."""
    from replayssm.kernels.mamba2.triton_decode import make_replay_config
    from replayssm.kernels.mamba2.triton_step import launch_mamba2_step_decode, make_step_config

    H, P, N, G = SHAPES["nemotron3-super"]
    rows = []
    big_f = [dict(BLOCK_P=32, HC=16, BLOCK_NF=32), dict(BLOCK_P=16, HC=16, BLOCK_NF=64),
             dict(BLOCK_P=16, HC=16, BLOCK_NF=128, num_warps=8), dict(BLOCK_P=32, HC=16, BLOCK_NF=64, num_warps=8),
             dict(BLOCK_P=32, HC=4, BLOCK_NF=32), dict(BLOCK_P=32, HC=1, BLOCK_NF=32),
             dict(BLOCK_P=32, HC=16, route="split", flush=dict(BLOCK_P=16, BLOCK_NF=128, num_warps=8)),
             dict(BLOCK_P=16, HC=16, route="split", flush=dict(BLOCK_P=16, BLOCK_NF=128, num_warps=8)),
             dict(BLOCK_P=64, HC=16, num_warps=8, route="split", flush=dict(BLOCK_P=16, BLOCK_NF=128, num_warps=8)),
             dict(BLOCK_P=16, HC=16, num_warps=2, route="split", flush=dict(BLOCK_P=16, BLOCK_NF=128, num_warps=8)),
             dict(BLOCK_P=32, HC=16, route="split", flush=dict(BLOCK_P=32, HC=4, BLOCK_NF=64, num_warps=8)),
             dict(BLOCK_P=32, HC=16, BLOCK_NF=32, num_warps=2), dict(BLOCK_P=16, HC=16, BLOCK_NF=32, num_warps=1),
             dict(BLOCK_P=32, HC=16, BLOCK_NF=32, num_warps=2, num_stages=2)]
    small = [dict(BLOCK_P=16, HC=1, BLOCK_NF=64), dict(BLOCK_P=16, HC=1, BLOCK_NF=128, num_warps=8),
             dict(BLOCK_P=16, HC=1, BLOCK_NF=64, num_warps=2), dict(BLOCK_P=32, HC=1, BLOCK_NF=32),
             dict(BLOCK_P=16, HC=2, BLOCK_NF=64)]
    for Bt, sdt in ((256, torch.float32), (256, torch.bfloat16), (1, torch.float32)):
        s = torch.tensor([], dtype=sdt).element_size()
        L = 16
        R = copies_for(Bt, H, P, N, s)
        lay = Layer(Bt, H, P, N, G, sdt, torch.bfloat16, R, dev)
        bufs = lay.buffers(L)
        floor = replay_bytes(Bt, H, P, N, G, L, s, 2) / copy_bw * 1e6
        floor_s = step_bytes(Bt, H, P, N, G, s, 2) / copy_bw * 1e6
        rcfgs = big_f if Bt >= 32 else small
        scfgs = ([dict(BLOCK_P=16), dict(BLOCK_P=32), dict(BLOCK_P=8, num_warps=2)] if Bt >= 32 else
                 [dict(BLOCK_P=8), dict(BLOCK_P=8, num_warps=2), dict(BLOCK_P=4, num_warps=2)])
        best = (None, float("inf"))
        for kn in rcfgs:
            cfg = make_replay_config(H, P, N, G, L, **kn)

            body = lay.replay_body(bufs, L, cfg)

            try:
                us = time_steps(body, L * R)
                rows.append(dict(kernel="replay", batch=Bt, state=str(sdt), L=L, knobs=kn, us=us, frac=floor / us))
                if us < best[1]:
                    best = (kn, us)
            except Exception as e:
                rows.append(dict(kernel="replay", batch=Bt, state=str(sdt), L=L, knobs=kn, error=str(e)[:300]))
            log(rows[-1])
        # the best configuration's step kinds, each alone (cursor set before every call)
        if best[0] is not None and Bt >= 32:
            cfg = make_replay_config(H, P, N, G, L, **best[0])
            ent = H * P * 2 + H * 4 + G * N * 2
            for label, cval in (("c=0", 0), (f"c={L - 2}", L - 2), ("flush", L - 1)):
                body_k = lay.replay_body(bufs, 4, cfg, cursor=cval)

                us = time_steps(body_k, 4 * R)
                byts = Bt * ((2 if cval == L - 1 else 1) * H * P * N * s + cval * ent + 2 * ent + 2 * G * N * 2
                             + H * P * 2)
                rows.append(dict(kernel="replay-phase", batch=Bt, state=str(sdt), phase=label, us=us,
                                 frac=byts / copy_bw * 1e6 / us))
                log(rows[-1])
            for L2 in (8, 32):
                b2 = lay.buffers(L2)
                cfg2 = make_replay_config(H, P, N, G, L2, **best[0])

                body2 = lay.replay_body(b2, L2, cfg2)

                us = time_steps(body2, L2 * R)
                fl = replay_bytes(Bt, H, P, N, G, L2, s, 2) / copy_bw * 1e6
                rows.append(dict(kernel="replay", batch=Bt, state=str(sdt), L=L2, knobs=best[0], us=us, frac=fl / us))
                log(rows[-1])
                del b2
        for kn in scfgs:
            cfg = make_step_config(P, N, **kn)

            def sbody():
                for _ in range(4):
                    for st in lay.states:
                        launch_mamba2_step_decode(lay.x, lay.dt, lay.B, lay.C, st, lay.A, lay.dt_bias, lay.D, None,
                                                  True, lay.out, config=cfg)

            try:
                us = time_steps(sbody, 4 * R)
                rows.append(dict(kernel="step", batch=Bt, state=str(sdt), knobs=kn, us=us, frac=floor_s / us))
            except Exception as e:
                rows.append(dict(kernel="step", batch=Bt, state=str(sdt), knobs=kn, error=str(e)[:300]))
            log(rows[-1])
        del lay, bufs
        torch.cuda.empty_cache()
    (out_dir / "mamba2_sweep.json").write_text(json.dumps(rows, indent=1))
    return rows


# ----------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--quick", action="store_true", help="a subset: batches 1, 32, 256; L 8, 16")
    ap.add_argument("--sweep", action="store_true", help="also time a few launch configurations first")
    ap.add_argument("--sweep-only", action="store_true")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--no-tune", action="store_true", help="default launch heuristics at every batch")
    ap.add_argument("--smoke", action="store_true",
                    help="one tiny shape, any device (the Triton interpreter on CPU): checks the script itself")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_mamba2: no CUDA device; nothing to time (--smoke runs a tiny shape anywhere)")
        return 0
    import triton

    sys.path.insert(0, str(ROOT))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes, copies = SHAPES, None
    if args.smoke:
        shapes, copies = {"smoke": (4, 16, 16, 2)}, 1
        args.no_tune = True
        args.no_graph = args.no_graph or dev.type != "cuda"
    t0 = time.time()
    logf = open(out_dir / "bench_mamba2_progress.log", "a")

    def log(o):
        line = json.dumps(o) if not isinstance(o, str) else o
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    copy_bw = copy_bandwidth(dev) if dev.type == "cuda" else 1e11  # nominal on CPU (smoke runs only)
    hf, hf_note = load_hf()  # first: transformers must not see the mamba_ssm stand-in modules
    mssu, mssu_note = load_mamba_ssm()
    try:
        import transformers

        tv = transformers.__version__
    except Exception:
        tv = "absent"
    cuda = dev.type == "cuda"
    meta = dict(gpu=torch.cuda.get_device_name() if cuda else "cpu (smoke run)", date=datetime.date.today().isoformat(),
                torch=torch.__version__, triton=triton.__version__, transformers=tv,
                python=platform.python_version(), mamba_ssm=mssu_note, hf=hf_note, copy_bw_GBps=copy_bw / 1e9,
                sms=torch.cuda.get_device_properties(0).multi_processor_count if cuda else None)
    log(meta)
    if args.sweep or args.sweep_only:
        sweep(dev, copy_bw, out_dir, log)
        log(f"sweep done at {time.time() - t0:.0f}s")
        if args.sweep_only:
            return 0
    batches = [1, 32, 256] if args.quick else BATCHES
    Ls = [8, 16] if args.quick else LS
    if args.smoke:
        batches, Ls = [2], [4]
    results, tuning = [], []
    for name, shape in shapes.items():
        for sdt in (torch.float32, torch.bfloat16):
            best = tune_replay(name, shape, sdt, dev, copy_bw, tuning, log) if not args.no_tune else None
            for Bt in batches:
                r = bench_config(name, shape, Bt, sdt, torch.bfloat16, Ls, mssu, hf, dev, copy_bw,
                                 use_graph=not args.no_graph, tuned=best if Bt >= 256 else None, copies=copies)
                results.append(summarize(r, Ls))
                log({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
                write_outputs(out_dir, meta, results, tuning, Ls, t0)  # keep partial results
    md = write_outputs(out_dir, meta, results, tuning, Ls, t0)
    print(md)
    print(f"bench_mamba2: {meta['elapsed_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
