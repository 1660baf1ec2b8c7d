"""Delta-rule (Gated DeltaNet / KDA) decode step: ReplaySSM Triton kernel vs per-step updates.

Times one layer's decode step amortised over a whole L-step cycle (L consecutive steps
from cursor 0, the flush step included, divided by L) for several batch sizes, model
shapes, checkpoint dtypes (fp32, bf16; activations and rings bf16) and L, against, in the
same run:

* ``step``: this project's fused per-step Triton kernel (reads and writes the state);
* ``hf``: the installed transformers' own decode function for the layer
  (``torch_recurrent_gated_delta_rule`` for GDN, ``recurrent_kimi_delta_attention`` for
  KDA; fp32 state as Hugging Face keeps it, plus the cache copy-back), eager;
* ``fla``: flash-linear-attention's fused recurrent kernels, only if importable;
* the byte floor: the fewest bytes each variant must move over the device-to-device copy
  bandwidth measured in the same run (bytes read + written).

The Triton variants run inside CUDA graphs whose body steps R copies of the layer's state
and rings, so the working set stays well above the 60 MB L2 even at batch 1; time per step
is the median graph replay time (``triton.testing.do_bench``) over the steps it holds.

    python examples/benchmarks/bench_delta.py --out DIR [--quick] [--sweep | --sweep-only] [--phases]
        [--compare '{"ring_by_cursor": false}']   # a knob set against the defaults, same data, every row
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared timing helpers
from timing import copy_bandwidth, stagger_cursors, time_steps  # noqa: E402

SHAPES = {  # name: (Hk, HV, K, V, kda)
    "qwen3.5-4b-gdn": (16, 32, 128, 128, False),
    "qwen3.5-122b-gdn": (16, 64, 128, 128, False),
    "kimi-linear-kda": (32, 32, 128, 128, True),
}
SMOKE_SHAPES = {"smoke-gdn": (2, 4, 16, 16, False), "smoke-kda": (2, 2, 16, 16, True)}  # --smoke: any device
BATCHES = [1, 8, 32, 128, 256, 512]
LS = [8, 16, 32]
L2_BYTES = 60e6
FLA_IN_PROCESS_MAX_BATCH = 128  # fla above this batch runs in a child process (see time_fla_in_child)


# ----------------------------------------------------------------------------- loaders

def load_hf():
    """transformers' own decode functions (the torch code, unwrapped from hub-kernel wrappers)."""
    out, notes = {}, []
    try:
        import transformers

        notes.append(f"transformers {transformers.__version__}")
    except Exception as e:  # pragma: no cover - machine dependent
        return out, f"transformers unavailable: {type(e).__name__}: {e}"
    for kind, mod, names in (
        ("gdn", "transformers.models.qwen3_5.modeling_qwen3_5", ("torch_recurrent_gated_delta_rule",)),
        ("kda", "transformers.models.kimi_linear.modeling_kimi_linear",
         ("recurrent_kimi_delta_attention", "torch_recurrent_kimi_delta_attention")),
    ):
        try:
            m = __import__(mod, fromlist=["_"])
            for n in names:
                if hasattr(m, n):
                    fn = inspect.unwrap(getattr(m, n))
                    out[kind] = fn
                    notes.append(f"{kind}: {mod.split('.')[-1]}.{n}{inspect.signature(fn)}")
                    break
            else:
                notes.append(f"{kind}: none of {names} in {mod}")
        except Exception as e:  # pragma: no cover
            notes.append(f"{kind}: {type(e).__name__}: {e}")
    return out, "; ".join(notes)


def load_fla():
    """flash-linear-attention's fused recurrent decode kernels (GDN; KDA with its in-place state)."""
    try:
        import fla

        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fgdn

        fkda = None
        try:
            from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fkda
        except Exception:
            pass
        return {"gdn": fgdn, "kda": fkda}, f"flash-linear-attention (fla-core {getattr(fla, '__version__', '?')})"
    except Exception as e:
        return {}, f"not importable ({type(e).__name__}); skipped"


# ----------------------------------------------------------------------------- timing

# ----------------------------------------------------------------------------- bytes

def _io_bytes(Hk, HV, K, V, a, kda):
    g = 4 * K if kda else 4
    inputs = Hk * 2 * K * a + HV * (V * a + g + 4)  # q, k per key head; v, g, beta per value head
    return inputs + HV * V * a  # + the output


def step_bytes(Bt, Hk, HV, K, V, s, a, kda):
    """Fewest bytes of one per-step update: state read + write, inputs, output."""
    return Bt * (2 * HV * K * V * s + _io_bytes(Hk, HV, K, V, a, kda))


def replay_bytes(Bt, Hk, HV, K, V, L, s, a, kda):
    """Fewest bytes of one ReplaySSM step averaged over an L-step cycle (flush included)."""
    entry = HV * (V * a + (4 * K if kda else 4)) + Hk * K * a  # one ring entry (u, g per value head; k per key head)
    total = 0
    for c in range(L):
        flush = c == L - 1
        total += (2 if flush else 1) * HV * K * V * s  # checkpoint read (+ write on flush)
        total += c * entry + (0 if flush else entry)  # ring reads + append
        total += _io_bytes(Hk, HV, K, V, a, kda) + 8  # + cursor read and write
    return Bt * total / L


# ----------------------------------------------------------------------------- one layer

def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


class Layer:
    """One layer's inputs, R copies of its checkpoint, and (per L) R copies of its rings."""

    def __init__(self, Bt, Hk, HV, K, V, kda, sdt, adt, R, dev, seed=0):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.dims = (Bt, Hk, HV, K, V, kda)
        self.sdt, self.adt, self.R, self.dev = sdt, adt, R, dev
        self.q = (_l2n(torch.randn(Bt, Hk, K, generator=gen)) * K ** -0.5).to(adt).to(dev)
        self.k = _l2n(torch.randn(Bt, Hk, K, generator=gen)).to(adt).to(dev)
        self.v = torch.randn(Bt, HV, V, generator=gen).to(adt).to(dev)
        gshape = (Bt, HV, K) if kda else (Bt, HV)
        self.g = (-torch.exp(torch.randn(*gshape, generator=gen) - 3.0)).to(dev)
        self.beta = torch.sigmoid(torch.randn(Bt, HV, generator=gen)).to(dev)
        self.states = [(torch.randn(Bt, HV, K, V, device=dev) * 0.1).to(sdt) for _ in range(R)]
        self.out = torch.empty(Bt, HV, V, dtype=adt, device=dev)

    def rings(self, L):
        Bt, Hk, HV, K, V, kda = self.dims
        dev, adt = self.dev, self.adt
        rings = []
        for _ in range(self.R):
            u = torch.randn(Bt, HV, L, V, device=dev).to(adt)
            kb = _l2n(torch.randn(Bt, Hk, L, K, device=dev)).to(adt)
            gb = -torch.rand(*((Bt, HV, L, K) if kda else (Bt, HV, L)), device=dev) * 0.05
            if kda:  # KDA's gate ring holds running sums (the cycle rewrites them anyway)
                gb = gb.cumsum(2)
            rings.append((u, kb, gb, torch.zeros(Bt, dtype=torch.int32, device=dev)))
        return rings


def copies_for(Bt, HV, K, V, s):
    """State copies so that one graph's working set is at least 4x the L2 (at most 64)."""
    per = Bt * HV * K * V * s
    return max(1, min(64, math.ceil(4 * L2_BYTES / per)))


def bench_config(shape, Bt, sdt, Ls, dev, copy_bw, hf, fla, hf_cache, replay_kw=None, step_kw=None, do_step=True,
                 compare_kw=None):
    """One (shape, batch, checkpoint dtype): per-step, transformers, fla and replay timings per L.
    ``compare_kw``: replay knobs laid over ``replay_kw`` and timed on the same data right after
    the replay kernel (``compare_us``; ``compare_ratio`` = its time / the replay time)."""
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton
    from replayssm.kernels.delta.triton_step import delta_step_decode_triton

    Hk, HV, K, V, kda = SHAPES[shape]
    adt = torch.bfloat16
    s, a = torch.tensor([], dtype=sdt).element_size(), 2
    R = copies_for(Bt, HV, K, V, s) if dev == "cuda" else 1
    lay = Layer(Bt, Hk, HV, K, V, kda, sdt, adt, R, dev)
    x = (lay.q, lay.k, lay.v, lay.g, lay.beta)
    rkw, skw = replay_kw or {}, step_kw or {}
    res = dict(shape=shape, batch=Bt, state_dtype=str(sdt).replace("torch.", ""), act_dtype="bfloat16", copies=R,
               replay_cfg=rkw, step_cfg=skw)

    nstep = 8

    def step_body():
        for _ in range(nstep):
            for st in lay.states:
                delta_step_decode_triton(*x, st, **skw)

    res["step_us"] = None
    if do_step:
        res["step_us"] = time_steps(step_body, nstep * R)  # µs per layer step (one launch, one copy)
        res["step_floor_us"] = step_bytes(Bt, Hk, HV, K, V, s, a, kda) / copy_bw * 1e6
        res["step_bw_frac"] = res["step_floor_us"] / res["step_us"]

    # Hugging Face's own decode function (fp32 state, eager), once per (shape, batch).
    kind = "kda" if kda else "gdn"
    key = (shape, Bt)
    if key not in hf_cache:
        hf_cache[key] = None
        fn = hf.get(kind)
        if fn is not None:
            grp = HV // Hk
            qh = lay.q.repeat_interleave(grp, 1)[:, None]
            kh = lay.k.repeat_interleave(grp, 1)[:, None]
            vh, gh, bh = lay.v[:, None], lay.g[:, None], lay.beta[:, None]
            st32 = torch.randn(Bt, HV, K, V, device=dev) * 0.1
            params = inspect.signature(fn).parameters
            kw = {n: v for n, v in (("initial_state", st32), ("output_final_state", True),
                                    ("use_qk_l2norm_in_kernel", False)) if n in params}

            def hf_body():
                o, new = fn(qh, kh, vh, gh, bh, **kw)
                st32.copy_(new)  # the cache copy-back Hugging Face does after the call

            try:
                hf_cache[key] = time_steps(hf_body, 1, graph=False)
            except Exception as e:  # pragma: no cover
                hf_cache[key] = None
                res["hf_error"] = f"{type(e).__name__}: {e}"
            del st32
    res["hf_us"] = hf_cache[key]

    # flash-linear-attention's fused recurrent kernels, if importable (benchmark only), fp32 state.
    res["fla_us"] = None
    if fla.get(kind) is not None and sdt == torch.float32:
        if Bt <= FLA_IN_PROCESS_MAX_BATCH or dev != "cuda":
            res.update(time_fla(fla[kind], kind, lay))
        else:
            res.update(time_fla_in_child(shape, Bt))
        if res["fla_us"] and do_step:
            res["fla_floor_us"] = res["step_floor_us"]
            res["fla_bw_frac"] = res["fla_floor_us"] / res["fla_us"]

    res["replay"] = {}
    for L in Ls:
        rings = lay.rings(L)

        def replay_body(knobs=rkw):
            for _ in range(L):
                for st, (u, kb, gb, cur) in zip(lay.states, rings):
                    delta_replay_decode_triton(*x, st, u, kb, gb, cur, lay.out, **knobs)

        t = time_steps(replay_body, L * R)
        floor = replay_bytes(Bt, Hk, HV, K, V, L, s, a, kda) / copy_bw * 1e6
        res["replay"][L] = dict(us=t, floor_us=floor, bw_frac=floor / t,
                                vs_fla=(res["fla_us"] / t) if res.get("fla_us") else None,
                                vs_step=(res["step_us"] / t) if res["step_us"] else None,
                                vs_hf=(res["hf_us"] / t) if res["hf_us"] else None)
        if compare_kw:
            tc = time_steps(lambda: replay_body({**rkw, **compare_kw}), L * R)
            res["replay"][L].update(compare_us=tc, compare_ratio=tc / t)
        del rings
    del lay
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def time_fla(ffn, kind, lay):
    """flash-linear-attention's fused recurrent step on ``lay.states[0]``: the state is read and
    written in place (KDA) or into a fresh fp32 tensor (GDN), no copy-back. Returns ``fla_us``,
    ``fla_max_abs_diff_vs_step`` (one step from a copy of the state against this project's
    per-step kernel) and ``fla_note`` / ``fla_error`` where they apply."""
    from replayssm.kernels.delta.triton_step import delta_step_decode_triton

    res = {"fla_us": None}
    try:
        st = lay.states[0]
        q4, k4, v4, g4, b4 = (t[:, None] for t in (lay.q, lay.k, lay.v, lay.g, lay.beta))
        # by keyword: fla's GDN entry takes (q, k, v, g, gk, gv, beta, ...), so a positional beta
        # would land on the per-key gate gk (read out of bounds)
        kw = dict(g=g4, beta=b4, output_final_state=True, scale=1.0)
        if kind == "kda":
            kw["inplace_final_state"] = True

        def call(state):
            return ffn(q4, k4, v4, initial_state=state, **kw)

        s_ref, s_chk = st.clone(), st.clone()
        o_ref = delta_step_decode_triton(lay.q, lay.k, lay.v, lay.g, lay.beta, s_ref)
        o_chk = call(s_chk)[0]
        diff = (o_chk[:, 0].float() - o_ref.float()).abs().max().item()
        res["fla_max_abs_diff_vs_step"] = diff
        tol = 1e-2 * max(1.0, o_ref.float().abs().max().item())  # bf16 outputs of the same step
        if not diff <= tol:
            raise ValueError(f"fla's output differs from the per-step kernel's by {diff:.3g} (> {tol:.3g}); not timed")
        del s_ref, s_chk
        try:
            res["fla_us"] = time_steps(lambda: call(st), 1)
        except Exception:
            res["fla_us"] = time_steps(lambda: call(st), 1, graph=False)
            res["fla_note"] = "not graph-capturable; eager"
    except Exception as e:  # pragma: no cover - depends on the installed fla
        res["fla_error"] = f"{type(e).__name__}: {e}"
    return res


def time_fla_in_child(shape, Bt):
    """``time_fla`` in a child process, so that a fault in a kernel that is not this project's
    (an illegal memory access ends the CUDA context) cannot end this run; its exit status is
    reported instead."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--fla-child", json.dumps(dict(shape=shape, batch=Bt))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        out = json.loads(lines[-1])
        out["fla_note"] = (out.get("fla_note", "") + "; child process").lstrip("; ")
        return out
    err = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"fla_us": None, "fla_error": f"child process exit {p.returncode}: {err[:300]}"}


def fla_child(spec):
    """Entry of ``time_fla_in_child``: prints one JSON line."""
    Hk, HV, K, V, kda = SHAPES[spec["shape"]]
    fla, _ = load_fla()
    kind = "kda" if kda else "gdn"
    lay = Layer(spec["batch"], Hk, HV, K, V, kda, torch.float32, torch.bfloat16, 1, "cuda")
    out = time_fla(fla[kind], kind, lay)
    torch.cuda.synchronize()
    print(json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- report

def fmt(v, spec="{:.1f}"):
    return "—" if v is None else spec.format(v)


def markdown(results, meta, Ls):
    lines = [f"# Delta-rule decode step: ReplaySSM vs per-step ({meta['gpu']})", ""]
    lines += [f"- date: {meta['date']}; torch {meta['torch']}, triton {meta['triton']}, {meta['hf']}",
              f"- launch configurations: {meta.get('tuned') or 'library defaults'}",
              f"- flash-linear-attention: {meta['fla']}",
              f"- copy bandwidth (read + write): {meta['copy_bw_tbs']:.2f} TB/s",
              "- µs per layer step, amortised over an L-step cycle (flush included); activations and rings bf16;",
              "  `step` = fused per-step Triton kernel; `hf` = transformers' decode function (fp32 state, eager;",
              "  the same measurement is shown for both checkpoint dtypes); `xstep`/`xhf` = speedup of replay;",
              "  `bw` = byte floor / time, as a fraction of the copy bandwidth.", ""]
    for shape in SHAPES:
        rows = [r for r in results if r["shape"] == shape]
        if not rows:
            continue
        lines += [f"## {shape} (Hk, HV, K, V) = {SHAPES[shape][:4]}", ""]
        hdr = "| state | batch | hf µs | fla µs | step µs | step bw |"
        sep = "|---|---:|---:|---:|---:|---:|"
        for L in Ls:
            hdr += f" L={L} µs | xstep | xhf | bw |"
            sep += "---:|---:|---:|---:|"
        lines += [hdr, sep]
        for r in rows:
            line = (f"| {r['state_dtype']} | {r['batch']} | {fmt(r['hf_us'])} | {fmt(r.get('fla_us'))} | "
                    f"{fmt(r['step_us'])} | "
                    f"{fmt(r['step_bw_frac'], '{:.0%}')} |")
            for L in Ls:
                x = r["replay"].get(L)
                if x is None:
                    line += " — | — | — | — |"
                else:
                    line += (f" {fmt(x['us'])} | {fmt(x['vs_step'], '{:.2f}x')} | {fmt(x['vs_hf'], '{:.0f}x')} | "
                             f"{fmt(x['bw_frac'], '{:.0%}')} |")
            lines.append(line)
        lines.append("")
    fla_rows = [r for r in results if r.get("fla_us") or r.get("fla_error")]
    if fla_rows:
        lines += ["## Against flash-linear-attention's fused recurrent kernel (fp32 state)", "",
                  "`fla bw` = the per-step byte floor / fla's time; `xfla` = fla's time / the replay step's.", "",
                  "| shape | batch | fla µs | fla bw | step µs | step bw |" + "".join(f" L={L} µs | xfla |" for L in Ls),
                  "|---|---:|---:|---:|---:|---:|" + "---:|---:|" * len(Ls)]
        for r in fla_rows:
            line = (f"| {r['shape']} | {r['batch']} | {fmt(r.get('fla_us'))} | {fmt(r.get('fla_bw_frac'), '{:.0%}')} | "
                    f"{fmt(r['step_us'])} | {fmt(r.get('step_bw_frac'), '{:.0%}')} |")
            for L in Ls:
                x = r["replay"].get(L) or {}
                line += f" {fmt(x.get('us'))} | {fmt(x.get('vs_fla'), '{:.2f}x')} |"
            lines.append(line + (f" {r['fla_error']}" if r.get("fla_error") else ""))
        lines.append("")
    cmp_rows = [(r, L, x) for r in results for L, x in r["replay"].items() if x.get("compare_us")]
    if cmp_rows:
        lines += [f"## Replay with `{json.dumps(meta.get('compare'))}` laid over the knobs above, same data, timed right after",
                  "", "| shape | state | batch | L | replay µs | compared µs | compared / replay |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r, L, x in cmp_rows:
            lines.append(f"| {r['shape']} | {r['state_dtype']} | {r['batch']} | {L} | {fmt(x['us'])} | "
                         f"{fmt(x['compare_us'])} | {fmt(x['compare_ratio'], '{:.3f}')} |")
        lines.append("")
    return "\n".join(lines)


def sweep(dev, copy_bw, log, Bt=256, L=16):
    """Replay-kernel variants at one batch size (first GDN and first KDA shape, fp32 and bf16
    checkpoints); returns the rows and the fastest variant per (GDN/KDA, checkpoint dtype),
    which the main table then uses. The per-step kernel keeps its defaults (picked from an
    earlier, wider sweep on the same machine kind)."""
    gdn = next(n for n, v in SHAPES.items() if not v[4])
    kda = next(n for n, v in SHAPES.items() if v[4])
    if dev != "cuda":
        Bt = 2

    # output-launch shapes (columns per program, warps): the key-dim reduction crosses warps, so
    # fewer warps per program can win, most of all with 16-bit checkpoints; flush items of 2 warps
    # (within 1% on the H200, results/delta_launch_variants_h200_2026-12-01.md); for Gated
    # DeltaNet, the coefficient launch per value head instead of per key head, per key head
    # with / without the x scratch, and the flush's tf32x3 product instead of the bf16 split; ring
    # loads bounded by L instead of the cursor
    base = [{}, dict(num_warps=2), dict(num_warps=1), dict(block_v=16, num_warps=1), dict(block_v=16, num_warps=2),
            dict(block_v=64, num_warps=2), dict(flush_warps=2), dict(flush_warps=2, flush_block_v=32),
            dict(ring_by_cursor=False)]
    coef = [dict(coef_per_key_head=False), dict(coef_write_x=True), dict(coef_write_x=False),
            dict(flush_bf16_split=False)]
    variants = {gdn: base + coef, kda: base + [dict(flush_bf16_split=False), dict(coef_narrow=False)]}
    rows, best = [], {}
    for shape, cfgs in variants.items():
        kind = "kda" if SHAPES[shape][4] else "gdn"
        for sdt in (torch.float32, torch.bfloat16):
            sname = str(sdt).replace("torch.", "")
            cand = []
            for rkw in cfgs:
                r = bench_config(shape, Bt, sdt, [L], dev, copy_bw, {}, {}, {}, replay_kw=rkw, do_step=False)
                x = r["replay"][L]
                rows.append(dict(kernel="replay", shape=shape, state=sname, batch=Bt, L=L, cfg=rkw, us=x["us"],
                                 bw=x["bw_frac"]))
                cand.append((x["us"], rkw))
                log(rows[-1])
            best[("replay", kind, sname)] = min(cand, key=lambda t: t[0])[1]
    return rows, best


def phases(dev, copy_bw, log, Bt=256, L=16):
    """Where a step's time goes (defaults, every shape, fp32 and bf16 checkpoints): the step
    alone at cursor 0, at cursor L-2 and at the flush (all rows at that cursor), a staggered
    cycle (row b starts at cursor b mod L, so 1/L of the rows flush every step), and, on CUDA,
    each launch's device time from the torch profiler at cursor L-2 and at the flush."""
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton

    if dev != "cuda":
        Bt = 2
    rows = []
    for shape, (Hk, HV, K, V, kda) in SHAPES.items():
        for sdt in (torch.float32, torch.bfloat16):
            lay = Layer(Bt, Hk, HV, K, V, kda, sdt, torch.bfloat16, 1, dev)
            x = (lay.q, lay.k, lay.v, lay.g, lay.beta)
            (u, kb, gb, cur), = lay.rings(L)

            def step():
                delta_replay_decode_triton(*x, lay.states[0], u, kb, gb, cur, lay.out)

            row = dict(shape=shape, state=str(sdt).replace("torch.", ""), batch=Bt, L=L)
            for label, cval in (("c0", 0), (f"c{L - 2}", L - 2), ("flush", L - 1)):
                def at_cursor():
                    for _ in range(4):
                        cur.fill_(cval)
                        step()

                row[f"{label}_us"] = time_steps(at_cursor, 4)  # includes a tiny fill launch
                if dev == "cuda" and label != "c0":
                    row[f"{label}_launch_us"] = _launch_times(step, cur, cval)
            stagger_cursors([cur], L)

            def staggered():
                for _ in range(L):
                    step()

            row["staggered_us"] = time_steps(staggered, L)
            rows.append(row)
            log(row)
            del lay, u, kb, gb
    return rows


def _launch_times(step, cur, cval, reps=10):
    """Mean device µs per launch name (torch profiler) for ``reps`` steps at cursor ``cval``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        cur.fill_(cval)
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            cur.fill_(cval)
            step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is not None and e.key.startswith("_"):  # the Triton kernels
            out[e.key] = round(t / max(1, e.count), 2)
    return out


def unknown_knobs(knobs: dict) -> list[str]:
    """Names in ``knobs`` that are not keyword-only knobs of ``delta_replay_decode_triton`` (sorted)."""
    from replayssm.kernels.delta.triton_decode import delta_replay_decode_triton

    params = inspect.signature(delta_replay_decode_triton).parameters
    return sorted(k for k in knobs if params.get(k) is None or params[k].kind != params[k].KEYWORD_ONLY)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--quick", action="store_true", help="a subset: batches 1, 256; L 16")
    ap.add_argument("--sweep", action="store_true", help="also time a few launch configurations first")
    ap.add_argument("--sweep-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device (checks the script itself)")
    ap.add_argument("--compare", type=json.loads, default=None, metavar="JSON",
                    help='replay knobs to time against the defaults on the same data, e.g. \'{"ring_by_cursor": false}\'')
    ap.add_argument("--fla-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--phases", action="store_true",
                    help="also time the step at fixed cursors, staggered cycles and each launch (profiler)")
    args = ap.parse_args(argv)
    if args.fla_child:
        return fla_child(json.loads(args.fla_child))
    if args.compare is not None and not isinstance(args.compare, dict):
        ap.error("--compare takes a JSON object of replay knobs, e.g. '{\"ring_by_cursor\": false}'")
    unknown = unknown_knobs(args.compare or {})
    if unknown:
        ap.error(f"--compare: not knobs of delta_replay_decode_triton: {', '.join(unknown)}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t_start = time.time()

    def log(o):
        print(json.dumps(o, default=str), flush=True)

    import triton

    hf, hf_note = load_hf()
    fla, fla_note = load_fla()
    batches, Ls = (BATCHES, LS) if not args.quick else ([1, 256], [16])
    if args.smoke:
        global SHAPES
        SHAPES = dict(SMOKE_SHAPES)
        batches, Ls = [2], [4]
    copy_bw = copy_bandwidth(dev) if dev == "cuda" else 1e11
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        gpu=torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, triton=triton.__version__, hf=hf_note, fla=fla_note,
        copy_bw_tbs=copy_bw / 1e12, batches=batches, Ls=Ls, compare=args.compare,
    )
    log(meta)
    sweep_rows, best = [], {}
    if args.sweep or args.sweep_only:
        sweep_rows, best = sweep(dev, copy_bw, log)
        meta["tuned"] = {"/".join(k): v for k, v in best.items()}
        log(dict(tuned=meta["tuned"]))
        (out / "delta_sweep.json").write_text(json.dumps(dict(rows=sweep_rows, best=meta["tuned"]), indent=1,
                                                         default=str))
        if args.sweep_only:
            return
    phase_rows = []
    if args.phases:
        phase_rows = phases(dev, copy_bw, log)
        (out / "delta_phases.json").write_text(json.dumps(phase_rows, indent=1, default=str))
    results = []
    hf_cache = {}
    for shape in SHAPES:
        for sdt in (torch.float32, torch.bfloat16):
            cls = ("kda" if SHAPES[shape][4] else "gdn", str(sdt).replace("torch.", ""))
            rkw, skw = best.get(("replay",) + cls), best.get(("step",) + cls)
            for Bt in batches:
                r = bench_config(shape, Bt, sdt, Ls, dev, copy_bw, hf, fla, hf_cache, replay_kw=rkw, step_kw=skw,
                                 compare_kw=args.compare)
                results.append(r)
                log(r)
    meta["seconds"] = round(time.time() - t_start, 1)
    md = markdown(results, meta, Ls)
    (out / "delta_bench.md").write_text(md + "\n")
    (out / "delta_bench.json").write_text(json.dumps(dict(meta=meta, results=results, sweep=sweep_rows), indent=1,
                                                     default=str))
    print(md)


if __name__ == "__main__":
    main()
