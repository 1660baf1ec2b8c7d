"""Where a CUDA-graph decode step of ``generate()`` spends its time (GPU only).

For a benchmark preset patched with ``cuda_graphs=True``, per decode step: wall time without the
profiler, and under ``torch.profiler`` over one ``generate()`` call the time between graph launches,
the device-busy time (union of kernel intervals), the host gap from the end of the per-step
synchronisation in transformers' loop to the next graph launch, the kernel count, the largest
kernels and the host operators taking the most of their own time. Prints one JSON line per (preset, batch).

    python examples/benchmarks/profile_generate.py --preset nemotron3-nano-like --batches 1,256
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import replayssm
from replayssm.bench import unreachable_token
from replayssm.presets import build_preset

SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def _generate(model, ids, new: int) -> float:
    eos = unreachable_token(model, model.config.get_text_config().vocab_size)  # every row runs every step
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, eos_token_id=eos,
                   pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def step_ms(model, ids, lo: int = 8, hi: int = 40, reps: int = 3) -> float:
    _generate(model, ids, hi)
    a = sorted(_generate(model, ids, lo) for _ in range(reps))[reps // 2]
    b = sorted(_generate(model, ids, hi) for _ in range(reps))[reps // 2]
    return (b - a) / (hi - lo) * 1e3


def _union(intervals) -> float:
    total, start, end = 0.0, None, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += 0.0 if end is None else end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (0.0 if end is None else end - start)


def profile_steps(model, ids, new: int = 24, top: int = 12, run=None) -> dict:
    """Per graph replay of one ``generate()`` (``run``: another call that replays graphs, e.g. an assisted
    generation whose verify windows replay theirs; run once before the profiled call)."""
    run = run or (lambda: _generate(model, ids, new))
    run()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    events = prof.events()
    launches = sorted(e.time_range.start for e in events if e.name == "cudaGraphLaunch")
    if len(launches) < 4:
        return {"error": f"{len(launches)} graph launches: the decode did not replay a graph"}
    lo, hi, steps = launches[1], launches[-1], len(launches) - 2
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and lo <= e.time_range.start < hi]
    syncs = sorted(e.time_range.end for e in events if e.name in SYNCS)
    gaps = [launch - max(s for s in syncs if s <= launch) for launch in launches[1:-1]
            if any(s <= launch for s in syncs)]
    host = [(e.name, e.self_cpu_time_total) for e in events  # host operators by their own time
            if e.device_type == torch.autograd.DeviceType.CPU and lo <= e.time_range.start < hi]
    return {"profiled_step_us": (hi - lo) / steps,
            "device_busy_us": _union((e.time_range.start, e.time_range.end) for e in device) / steps,
            "host_gap_us": sum(gaps) / max(len(gaps), 1), "kernels_per_step": len(device) / steps,
            "top_us_count": _largest(((e.name, e.time_range.end - e.time_range.start) for e in device), steps, top),
            "host_top_us_count": _largest(host, steps, top)}


def _largest(named_us, steps: int, top: int) -> list:
    """The ``top`` names by total time: (name, us per step, occurrences per step)."""
    totals: dict[str, list] = {}
    for name, us in named_us:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    return [(name[:100], round(us / steps, 1), round(n / steps, 1))
            for name, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]]

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="nemotron3-nano-like")
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--top", type=int, default=12, help="how many of the largest kernels to list")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_generate.py: needs a CUDA GPU (CUDA-graph decoding)", file=sys.stderr)
        return 2
    model = build_preset(args.preset, torch.bfloat16, "cuda")
    replayssm.patch(model, buffer_len=args.buffer_len, cuda_graphs=True)
    for batch in (int(b) for b in args.batches.split(",")):
        ids = torch.randint(3, 1000, (batch, 8), device="cuda")
        row = {"preset": args.preset, "batch": batch, "step_ms": round(step_ms(model, ids), 3)}
        print(json.dumps({**row, **profile_steps(model, ids, top=args.top)}), flush=True)
        replayssm.release_graphs(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
