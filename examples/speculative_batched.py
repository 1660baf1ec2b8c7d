"""A batched speculative decoding loop on a patched model: every row drafts K tokens by prompt
lookup (the continuation of the latest earlier occurrence of its last token, else a repeat of it),
the whole batch is verified in one forward of K + 1 tokens per row, each row keeps its matching
drafts plus the model's next token, and the cache rolls each row back by its own rejected count
(a ReplaySSM cursor move). The output equals plain greedy decoding, row by row.

    python examples/speculative_batched.py [--model tiny:mamba2] [--rows 4] [--new 48] [--draft 4]
"""

from __future__ import annotations

import argparse
import time

import torch

import replayssm
from replayssm.speculation import rollback, speculative_cache, verify


def lookup_draft(seq: list[int], k: int) -> list[int]:
    """K guessed tokens: what followed the latest earlier occurrence of the last token (n-gram of 1)."""
    last = seq[-1]
    for i in range(len(seq) - 2, -1, -1):
        if seq[i] == last:
            guess = seq[i + 1:i + 1 + k]
            return guess + [last] * (k - len(guess))
    return [last] * k


@torch.no_grad()
def speculative_greedy(model, prompt: torch.Tensor, new: int, k: int, draft_fn=lookup_draft):
    """Greedy continuation of every row of ``prompt`` (B, P) by batched speculation (``draft_fn(seq,
    k)`` guesses k tokens after a row's tokens ``seq``); returns the new tokens (B, new) and the mean
    number of tokens gained per row per verify."""
    rows = prompt.shape[0]
    cache = speculative_cache(model)
    nxt = verify(model, prompt, cache)[:, -1].argmax(-1)  # (B,)
    seqs = [prompt[b].tolist() + [int(nxt[b])] for b in range(rows)]
    gained, steps = 0, 0
    while min(len(s) for s in seqs) < prompt.shape[1] + new:
        drafts = torch.tensor([draft_fn(s, k) for s in seqs])  # (B, K)
        window = torch.cat([torch.tensor([s[-1] for s in seqs])[:, None], drafts], dim=1)  # (B, K + 1)
        pred = verify(model, window.to(prompt.device), cache).argmax(-1).cpu()  # (B, K + 1)
        match = (drafts == pred[:, :-1]).int().cumprod(dim=1).sum(dim=1)  # accepted drafts per row
        for b in range(rows):
            seqs[b] += pred[b, :int(match[b]) + 1].tolist()
        rollback(cache, (k - match).to(prompt.device))  # each row drops its rejected drafts
        gained += int(match.sum()) + rows
        steps += 1
    out = torch.tensor([s[prompt.shape[1]:prompt.shape[1] + new] for s in seqs])
    return out, gained / max(1, steps * rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:mamba2")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--buffer-len", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    from replayssm.tiny import build_tiny_model, is_tiny_spec

    if is_tiny_spec(args.model):
        model = build_tiny_model(args.model)
    else:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model = model.to(args.device).eval()
    replayssm.patch(model, buffer_len=args.buffer_len)
    gen = torch.Generator().manual_seed(0)
    base = torch.randint(3, 512, (args.rows, 6), generator=gen)
    prompt = torch.cat([base, base, base[:, :3]], dim=1).to(args.device)  # repeats: lookup finds drafts

    t0 = time.perf_counter()
    spec, gain = speculative_greedy(model, prompt, args.new, args.draft)
    t_spec = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new,
                         min_new_tokens=args.new, do_sample=False, pad_token_id=0)[:, prompt.shape[1]:].cpu()
    t_plain = time.perf_counter() - t0
    same = torch.equal(spec, ref)
    print(f"rows {args.rows}, {args.new} new tokens, drafts of {args.draft}: {gain:.2f} tokens per row per verify; "
          f"speculative {t_spec:.2f}s, plain generate {t_plain:.2f}s; equal to plain greedy: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
