"""Speculative decoding through ``generate()`` on a patched model, batch 1: tokens/s against plain decoding.

An oracle drafter proposes ``--draft`` tokens per round from the model's own greedy continuation, each
agreeing with probability ``--accept`` until the first disagreement (1.0: every draft accepted, drafting cost
zero: the upper bound that isolates verify and rollback). Beside it: plain decoding eager and with CUDA graphs
(where available), and transformers' own drafters: prompt lookup on a prompt that repeats itself, and a
small draft model (``--draft-model``: a 2-layer Llama of the target's vocabulary, random weights, so its
drafts agree with the target about as often as chance: the row measures what drafting costs; the oracle
rows tell what a draft of a given acceptance buys). Their acceptance is counted through the candidate
generator transformers builds (drafted tokens, and the matches it reports back).

The oracle is the speculative run's own continuation: in bf16 a verify window's logits round otherwise than
a single step's (other GEMM shapes), so where two logits nearly tie the window's argmax may differ from the
plain run's, after which a drafter that knows only the plain continuation proposes tokens the model rejects.
So each acceptance rate first runs with the plain continuation as the oracle, takes the output as the next
oracle, and repeats until a run reproduces its oracle (``oracle_runs``; each run agrees with its oracle
further than the last did, as a window's tokens depend only on those before it; ``--max-oracle-runs``
caps them, and a run that stops short is flagged ``settled`` false); ``same_as_plain`` tells whether the
tokens are the plain run's (always so in fp32, ``--dtype float32``, where any difference fails the run).
Decode rates come from two lengths, as `replayssm bench`'s step times do: ``tokens_per_s`` is
(new - short) / (t(new) - t(short)) over ``--new-tokens`` and ``--short-tokens`` runs (each time the median of
``--reps``), so the prefill and the first rounds cancel; ``e2e_tokens_per_s`` is new / t(new), prefill
included. ``round_ms``: a verify round by the same difference; ``forward_ms``: the window forward alone
(synchronised, the prefill's forward left out), the median of ``--reps`` more runs; ``host_ms`` = round -
forward, the loop's host work the GPU waits for; ``host_launch_us`` (in the header): how fast this host
issues eager launches, to compare machines. ``--profile N`` (CUDA graphs): for the first ``--accept`` value,
``profile_generate.py``'s figures per verify round (device-busy time, kernels, the N largest kernels and
host operators) from one more run. ``--stock``: rows of the unpatched model too (eager), its plain decoding
and, on transformers 5.25+ (which serves assisted decoding of these models by copying every layer's recurrent
state per drafted token), the oracle drafter: the speculative decoding a user gets without ReplaySSM.
Where timing noise leaves the long run no longer than the short one, a row's differenced figures (decode
rate, its ratio, round and host time) read n/a (null in the JSON) and its ``note`` says so.
Writes ``speculative.json`` / ``speculative.md`` to ``--out``.

    python examples/benchmarks/bench_speculative.py --preset nemotron3-nano-like --accept 1,0.75,0.5,0.25,0
    python examples/benchmarks/bench_speculative.py --smoke      # tiny model, any machine
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers.generation.candidate_generator import CandidateGenerator

import replayssm
from replayssm.presets import build_preset
from replayssm.tiny import build_tiny_model


class OracleDrafter(CandidateGenerator):
    """Drafts from the known greedy continuation; each drafted token agrees with probability ``accept``
    until the first one that does not (the rest of the round then disagrees too)."""

    def __init__(self, oracle: torch.Tensor, draft: int, accept: float, vocab: int, seed: int = 0):
        self.oracle, self.draft, self.accept, self.vocab = oracle, draft, accept, vocab
        self.gen = torch.Generator().manual_seed(seed)
        self.rounds = self.drafted = self.agreed = 0

    @property
    def num_drafting_tokens(self) -> int:  # what transformers 5.25 asks a candidate generator
        return self.draft

    def get_candidates(self, input_ids, **kwargs):
        cur = input_ids.shape[1]
        k = min(self.draft, self.oracle.shape[1] - cur - 1)
        if k <= 0:
            return input_ids, None
        agree = 0
        while agree < k and float(torch.rand((), generator=self.gen)) < self.accept:
            agree += 1
        right = self.oracle[0, cur:cur + k].to(input_ids.device)
        draft = right if agree == k else torch.cat([right[:agree], (right[agree:] + 1) % self.vocab])
        self.rounds, self.drafted, self.agreed = self.rounds + 1, self.drafted + k, self.agreed + agree
        return torch.cat([input_ids, draft[None]], dim=1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        pass


class CountingCandidates:
    """Proxy of the candidate generator transformers builds: counts rounds, drafted and accepted tokens."""

    def __init__(self, inner):
        self.inner, self.rounds, self.drafted, self.agreed = inner, 0, 0, 0

    def get_candidates(self, input_ids, *args, **kwargs):
        candidates, logits = self.inner.get_candidates(input_ids, *args, **kwargs)
        self.rounds, self.drafted = self.rounds + 1, self.drafted + candidates.shape[1] - input_ids.shape[1]
        return candidates, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        self.agreed += int(num_matches)
        return self.inner.update_candidate_strategy(input_ids, scores, num_matches)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _counted(model, fn):
    """(fn()'s result, the CountingCandidates of the call): ``fn`` runs one assisted ``generate()``."""
    built = []
    original = model._get_candidate_generator

    def counting(*args, **kwargs):
        built.append(CountingCandidates(original(*args, **kwargs)))
        return built[-1]

    model._get_candidate_generator = counting  # instance attribute, removed below
    try:
        result = fn()
    finally:
        model.__dict__.pop("_get_candidate_generator", None)
    return result, built[-1]


def build_draft_model(model, draft: int):
    """A 2-layer Llama (hidden 512) with the target's vocabulary, dtype and device, random weights, set to
    draft ``draft`` tokens every round (transformers' constant schedule, no confidence cut-off)."""
    config = transformers.LlamaConfig(
        vocab_size=model.config.get_text_config().vocab_size, hidden_size=512, intermediate_size=1536,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096)
    torch.manual_seed(1)
    small = transformers.LlamaForCausalLM(config).to(device=model.device, dtype=model.dtype).eval()
    small.generation_config.update(num_assistant_tokens=draft, num_assistant_tokens_schedule="constant",
                                   assistant_confidence_threshold=0.0, eos_token_id=None, pad_token_id=0)
    return small


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    start = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - start


def host_launch_us(device: str, launches: int = 2000, rounds: int = 5) -> float:
    """Median µs per eager launch of a one-element add on ``device``, launched back to back: how fast
    this host issues work (the assisted loop runs eagerly between the graph replays)."""
    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    runs = []
    for _ in range(rounds):
        _sync()
        start = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        _sync()
        runs.append((time.perf_counter() - start) / launches * 1e6)
    return sorted(runs)[rounds // 2]


def _median(runs):
    """The run of median time from a list of (output, seconds, ...) tuples."""
    return sorted(runs, key=lambda r: r[1])[len(runs) // 2]


def _greedy(model, ids, new, **kw):
    """Greedy ``generate()`` of up to ``new`` tokens (no ``min_new_tokens``: its logits processor would
    run on every window position, host work a user without it does not pay)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                          pad_token_id=0, **kw)


def _rate(out, ids, seconds) -> float:
    """New tokens per second of one run, prefill included (a row may stop early at EOS)."""
    return round((out.shape[1] - ids.shape[1]) / seconds, 2)


#: a row's note where the short run took as long as the long one (its differenced figures are left out)
NOISE_NOTE = "timing noise exceeds the long run's extra time; raise --new-tokens or --reps"


def _extra_seconds(long, short) -> float | None:
    """Seconds the long run took beyond the short one (each ``(output, seconds, ...)``), or None where
    timing noise left it no longer: a figure differenced from that would be meaningless."""
    extra = long[1] - short[1]
    return extra if extra > 0 else None


def _decode_rate(long, short) -> float | None:
    """Tokens per second between a short and a long run: the prefill and the first steps cancel (None:
    ``_extra_seconds``)."""
    extra = _extra_seconds(long, short)
    return None if extra is None else round((long[0].shape[1] - short[0].shape[1]) / extra, 2)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _cell(value) -> str:
    return "n/a" if value is None else str(value)


class ForwardClock:
    """Context: times every forward of ``model`` but the first of a ``generate()`` call, the prefill
    (synchronised before and after)."""

    def __init__(self, model):
        self.model, self.seconds, self.calls = model, 0.0, 0

    def __enter__(self):
        self.saved = self.model.__dict__.get("forward")
        inner = self.model.forward

        @functools.wraps(inner)  # generate() checks its keyword arguments against the signature
        def clocked(*args, **kwargs):
            self.calls += 1
            if self.calls == 1:
                return inner(*args, **kwargs)
            _sync()
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            _sync()
            self.seconds += time.perf_counter() - start
            return out

        self.model.forward = clocked
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            del self.model.forward
        else:
            self.model.forward = self.saved


def _speculative(model, ids, new, draft, oracle, accept, vocab):
    """(output, seconds, drafter) of one ``generate()`` with an OracleDrafter."""
    drafter = OracleDrafter(oracle, draft, accept, vocab)
    model._get_candidate_generator = lambda *a, **k: drafter  # instance attribute, removed below
    try:
        out, seconds = _timed(lambda: _greedy(model, ids, new, prompt_lookup_num_tokens=draft))
    finally:
        model.__dict__.pop("_get_candidate_generator", None)
    return out, seconds, drafter


def _window_replays(model) -> int:
    return sum(r.get("window_replays", 0) for r in replayssm.graph_report(model))


def plain_row(model, ids, mode, timed_pair):
    """Plain greedy decoding of ``model`` as it is now: (its row, the long run's output, the timed pair)."""
    long, brief = timed_pair(lambda n: _timed(lambda: _greedy(model, ids, n)))
    row = dict(mode=mode, accept=None, tokens_per_s=_decode_rate(long, brief),
               e2e_tokens_per_s=_rate(long[0], ids, long[1]), same_as_plain=True)
    return row, long[0]


def oracle_row(model, ids, args, vocab, timed_pair, plain, accept, mode):
    """The oracle drafter at ``accept``: its oracle settled (from the plain continuation, each run's output is
    the next oracle until a run reproduces its own: module notes; this also captures the window graphs),
    then timed. Returns (row, oracle, long, brief)."""
    oracle, runs = plain, 0
    while True:
        out, _, _ = _speculative(model, ids, args.new_tokens, args.draft, oracle, accept, vocab)
        runs += 1
        if torch.equal(out, oracle) or runs == args.max_oracle_runs:
            break
        oracle = out
    long, brief = timed_pair(lambda n: _speculative(model, ids, n, args.draft, oracle, accept, vocab))
    out, drafter = long[0], long[2]
    row = dict(mode=mode, accept=accept, tokens_per_s=_decode_rate(long, brief),
               e2e_tokens_per_s=_rate(out, ids, long[1]), rounds=drafter.rounds,
               acceptance=round(drafter.agreed / max(drafter.drafted, 1), 3), oracle_runs=runs,
               settled=bool(torch.equal(out, oracle)), same_as_plain=bool(torch.equal(out, plain)))
    return row, oracle, long, brief


def stock_rows(model, ids, args, vocab, timed_pair) -> list[dict]:
    """The unpatched model, eager: plain greedy decoding and, where this transformers serves assisted decoding
    of a stateful model itself (5.25+: it copies every layer's recurrent state per drafted token), the oracle
    drafter at the first --accept value."""
    row, plain = plain_row(model, ids, "plain, stock transformers, eager", timed_pair)
    if getattr(type(model), "_is_stateful", False):
        print(f"bench_speculative.py: transformers {transformers.__version__} refuses assisted decoding of the "
              "stock model; no stock oracle row", file=sys.stderr)
        return [row]
    mode = f"oracle drafter, {args.draft} per round, stock transformers, eager"
    return [row, oracle_row(model, ids, args, vocab, timed_pair, plain, args.accept[0], mode)[0]]


def run(model, ids, args) -> list[dict]:
    new, short, rows = args.new_tokens, args.short_tokens, []
    vocab = model.config.get_text_config().vocab_size

    def timed_pair(fn):  # the median (output, seconds, ...) of --reps runs, long then short
        fn(new)  # (warm: captures its graphs)
        return [_median([fn(n) for _ in range(args.reps)]) for n in (new, short)]

    for graphs in ([False, True] if ids.is_cuda else [False]):
        replayssm.patch(model, buffer_len=args.buffer_len, cuda_graphs=graphs)
        row, plain = plain_row(model, ids, "plain, CUDA graphs" if graphs else "plain, eager", timed_pair)
        rows.append(row)
    graphs = ids.is_cuda  # (their windows in CUDA graphs)
    replayssm.patch(model, buffer_len=args.buffer_len, cuda_graphs=graphs)
    suffix = ", CUDA graphs" if graphs else ", eager"
    for accept in args.accept:
        row, oracle, long, brief = oracle_row(model, ids, args, vocab, timed_pair, plain, accept,
                                              f"oracle drafter, {args.draft} per round{suffix}")
        drafter = long[2]
        clocks, replays = [], _window_replays(model)
        for _ in range(args.reps):
            with ForwardClock(model) as clock:
                _speculative(model, ids, new, args.draft, oracle, accept, vocab)
            clocks.append(clock.seconds / max(clock.calls - 1, 1))
        replays = (_window_replays(model) - replays) // args.reps
        forward_ms = sorted(clocks)[args.reps // 2] * 1e3
        extra = _extra_seconds(long, brief)
        round_ms = None if extra is None else round(extra / max(drafter.rounds - brief[2].rounds, 1) * 1e3, 3)
        if args.profile and graphs and accept == args.accept[0]:
            from profile_generate import profile_steps

            profiled = profile_steps(model, ids, top=args.profile, run=lambda: _speculative(
                model, ids, new, args.draft, oracle, accept, vocab))
            print(json.dumps({"profile_per_round": profiled, "accept": accept}), flush=True)
        rows.append(dict(row, window_replays=replays, round_ms=round_ms, forward_ms=round(forward_ms, 3),
                         host_ms=None if round_ms is None else round(round_ms - forward_ms, 3)))
    repeating = ids[:, : max(ids.shape[1] // 4, 2)].repeat(1, 4)
    plain_long, plain_brief = timed_pair(lambda n: _timed(lambda: _greedy(model, repeating, n)))
    drafted = [("prompt lookup, repeating prompt", repeating, plain_long, plain_brief,
                dict(prompt_lookup_num_tokens=args.draft))]
    if args.draft_model == "llama-2x512":
        drafted.append(("draft model (Llama, 2 layers, hidden 512, random)", ids, [plain], None,
                        dict(assistant_model=build_draft_model(model, args.draft))))
    for mode, prompt, ref_long, ref_brief, kw in drafted:
        long, brief = timed_pair(lambda n: _timed(lambda: _greedy(model, prompt, n, **kw)))
        _, counter = _counted(model, lambda: _greedy(model, prompt, new, **kw))
        row = dict(mode=mode + suffix, accept=None, tokens_per_s=_decode_rate(long, brief),
                   e2e_tokens_per_s=_rate(long[0], prompt, long[1]), rounds=counter.rounds,
                   acceptance=round(counter.agreed / max(counter.drafted, 1), 3),
                   same_as_plain=bool(torch.equal(long[0], ref_long[0])))
        if ref_brief is not None:
            row["plain_tokens_per_s"] = _decode_rate(ref_long, ref_brief)
        rows.append(row)
    replayssm.unpatch(model)
    if args.stock:
        rows += stock_rows(model, ids, args, vocab, timed_pair)
    base = rows[1 if ids.is_cuda else 0]  # the best plain decoding: the speculative rows decode the same way
    for row in rows:
        row["vs_plain"] = _ratio(row["tokens_per_s"], base["tokens_per_s"])
        row["e2e_vs_plain"] = _ratio(row["e2e_tokens_per_s"], base["e2e_tokens_per_s"])
        if row["tokens_per_s"] is None:
            row["note"] = NOISE_NOTE
            print(f"bench_speculative.py: {row['mode']}: {NOISE_NOTE}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="nemotron3-nano-like")
    ap.add_argument("--new-tokens", type=int, default=136)
    ap.add_argument("--short-tokens", type=int, default=16,
                    help="the short run of the decode rate (new - short tokens are timed)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--draft", type=int, default=4)
    ap.add_argument("--accept", default="1,0.75,0.5,0.25,0", help="comma-separated acceptance probabilities")
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weights and activations")
    ap.add_argument("--max-oracle-runs", type=int, default=32, help="runs to find the speculative continuation")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per row (the median is kept)")
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the verify rounds of the first --accept value, listing N kernels")
    ap.add_argument("--draft-model", choices=("llama-2x512", "none"), default="llama-2x512",
                    help="the draft model of the assistant_model row (none: no such row)")
    ap.add_argument("--stock", action="store_true",
                    help="also the unpatched model, eager: plain decoding and (transformers 5.25+, which copies "
                         "the recurrent states) the oracle drafter at the first --accept value")
    ap.add_argument("--smoke", action="store_true", help="tiny:nemotron_h on this machine, few tokens")
    args = ap.parse_args(argv)
    try:
        args.accept = [float(a) for a in args.accept.split(",")]
    except ValueError:
        print(f"bench_speculative.py: --accept takes comma-separated numbers; got {args.accept!r}", file=sys.stderr)
        return 2
    if args.draft >= args.buffer_len or not all(0.0 <= a <= 1.0 for a in args.accept):
        print("bench_speculative.py: --draft must be below --buffer-len and --accept values within [0, 1]",
              file=sys.stderr)
        return 2
    if not 1 <= args.short_tokens < args.new_tokens:
        print(f"bench_speculative.py: --short-tokens must be within [1, --new-tokens); got {args.short_tokens} "
              f"and {args.new_tokens}", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        args.new_tokens, args.short_tokens, args.prompt_len = 30, 6, 8
        model, name = build_tiny_model("tiny:nemotron_h"), "tiny:nemotron_h"
    else:
        model, name = build_preset(args.preset, getattr(torch, args.dtype), device), args.preset
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, min(1000, vocab), (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    rows = run(model, ids, args)
    meta = dict(date=datetime.date.today().isoformat(), model=name, dtype="float32" if args.smoke else args.dtype,
                host_launch_us=round(host_launch_us(device), 2),
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                transformers=transformers.__version__, L=args.buffer_len, new_tokens=args.new_tokens,
                command=" ".join(["python examples/benchmarks/bench_speculative.py",
                                  *(sys.argv[1:] if argv is None else argv)]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speculative.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    lines = [f"{meta['date']} · {name} · {meta['device']} · torch {meta['torch']} · transformers "
             f"{meta['transformers']} · L = {args.buffer_len} · host {meta['host_launch_us']} µs an eager launch · "
             f"`{meta['command']}`", "",
             "| mode | acceptance | decode tokens/s | x plain | tokens/s with prefill | x plain | rounds | "
             "round ms | forward ms | host ms | oracle runs | same tokens as plain greedy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['mode']} | {r.get('acceptance', '')} | {_cell(r['tokens_per_s'])} | {_cell(r['vs_plain'])} | "
              f"{r['e2e_tokens_per_s']} | {_cell(r['e2e_vs_plain'])} | {r.get('rounds', '')} | "
              f"{_cell(r.get('round_ms', ''))} | {r.get('forward_ms', '')} | {_cell(r.get('host_ms', ''))} | "
              f"{r.get('oracle_runs', '')} | {r['same_as_plain']} |" for r in rows]
    (out / "speculative.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if meta["dtype"] == "float32":  # token for token the plain greedy output, whatever was drafted
        return 0 if all(r["same_as_plain"] for r in rows) else 1
    return 0 if all(r.get("settled", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
