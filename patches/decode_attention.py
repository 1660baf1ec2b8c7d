"""A patched model's decode-step attention through the Triton kernel ``kernels.attention.decode_attention``.

``kernel_attention`` is the first thing the registered attention function of a patched model
(``attention_switch.grouped_sdpa_attention``) tries: it returns the kernel's output for a call the kernel serves
exactly as sdpa would, and None for every other call, which then runs what it ran before. It serves a
call when

* the query has one token and the kernel takes the shapes, dtypes and mask (``attention.unsupported``);
* the tensors are where the Triton backend runs (CUDA; the interpreter on CPU when the backend is
  forced, as the tests do), outside ``torch.compile``;
* there is no dropout and no keyword argument that changes the attention: only those that sdpa
  ignores (``HARMLESS_KWARGS``) may be set, so a softcap, a sliding window, attention sinks, a
  position bias or anything this module does not know sends the call to sdpa.
"""

from __future__ import annotations

import torch

from replayssm.kernels.attention import decode_attention_triton, unsupported
from replayssm.kernels.backend import resolve_backend

#: keyword arguments that transformers' sdpa attention does not read, which the supported families' decode
#: steps pass besides dropout and scaling; any other keyword with a value other than None keeps the call on sdpa
HARMLESS_KWARGS = frozenset({"position_ids", "cache_position", "use_cache", "output_attentions",
                             "output_router_logits", "position_embeddings"})


def kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, dropout,
                     scaling, kwargs: dict) -> torch.Tensor | None:
    """The kernel's (B, 1, Hq, Dv) output for a call it serves (see the module notes), else None."""
    if (query.dim() != 4 or query.shape[2] != 1 or dropout or torch.compiler.is_compiling()
            or any(v is not None and k not in HARMLESS_KWARGS for k, v in kwargs.items())
            or unsupported(query, key, value, attention_mask) is not None
            or resolve_backend("auto", query.device) != "triton"):
        return None
    return decode_attention_triton(query, key, value, attention_mask, scaling)
