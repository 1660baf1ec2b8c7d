"""Patch a model, generate, compare with the stock model, unpatch.

    python examples/quickstart.py                 # built-in tiny Nemotron-H, CPU, offline
    python examples/quickstart.py --model tiny:qwen3_5 --buffer-len 8
    python examples/quickstart.py --model ./my-checkpoint --device cuda --dtype bf16
"""

from __future__ import annotations

import argparse
import time

import torch
import replayssm
from replayssm.resolve import resolve_model
from replayssm.tiny import model_class_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny:nemotron_h")
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    path = resolve_model(args.model).path
    from transformers import AutoConfig

    cls = model_class_for(AutoConfig.from_pretrained(path))
    model = cls.from_pretrained(path, dtype=dtype).to(args.device).eval()

    for record in replayssm.find_ssm_layers(model):
        print(f"{record.name:40s} {record.kind_label:22s} state {record.state_bytes / 1024:.0f} KiB/seq")

    torch.manual_seed(0)
    ids = torch.randint(3, model.config.get_text_config().vocab_size, (4, 12), device=args.device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
              min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    t0 = time.perf_counter()
    stock = model.generate(ids, **kw)
    t_stock = time.perf_counter() - t0

    replayssm.patch(model, buffer_len=args.buffer_len)
    t0 = time.perf_counter()
    replay = model.generate(ids, **kw)
    t_replay = time.perf_counter() - t0
    replayssm.unpatch(model)

    same = torch.equal(stock, replay)
    print(f"greedy tokens identical: {same}  (stock {t_stock:.2f} s, ReplaySSM {t_replay:.2f} s, eager generate())")
    if torch.device(args.device).type == "cpu":
        print("note: on CPU ReplaySSM runs its PyTorch reference, which is slower than the stock layers; it is "
              "there for correctness and tests. The speed-up is on GPUs (Triton kernels; see the README's "
              "benchmark table).")


if __name__ == "__main__":
    main()
