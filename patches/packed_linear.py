"""Linear layers that share their input, their weights stored as consecutive rows of one buffer.

``pack_linears(modules)`` re-stores the 16-bit weights of bias-free ``nn.Linear`` layers that read one input
(a Gated DeltaNet layer's q/k/v, z, b and a projections) in one (sum N_i, K) buffer, each module's parameter
becoming a view of its rows: the same values and parameter objects, no extra memory. ``packed_weight``
returns that buffer while the weights are still those views (a module whose weight was replaced, moved or
cast is not), so that ``fused_linear.linear_outputs`` runs one GEMM instead of one per projection for more
than one row of input (a batched decode step, a verify window, prefill): one launch, where two of Qwen3.5's
four projections are 32 columns wide and cost a launch each for almost no bytes. fp32 weights are not
packed: their outputs stay those of the stock model's calls. ``unpack_linears(model)`` gives every packed
weight its own storage again (``unpatch``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_PACKED = "_replayssm_packed"
_DTYPES = (torch.bfloat16, torch.float16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_linear(module: torch.nn.Module) -> bool:
    """An ``nn.Linear`` whose class's forward is ``F.linear(x, weight)``: no bias, no hooks."""
    return (isinstance(module, torch.nn.Linear) and type(module).forward is torch.nn.Linear.forward
            and module.bias is None and not module._forward_hooks and not module._forward_pre_hooks)


def pack_linears(modules: Sequence[torch.nn.Module]) -> bool:
    """Store the weights of ``modules`` (bias-free ``nn.Linear``, one K, one 16-bit dtype, one device that is
    not ``meta``) as consecutive rows of one new buffer; returns whether it did (else nothing changes)."""
    if len(modules) < 2 or not all(_plain_linear(m) for m in modules) or packed_weight(modules) is not None:
        return False
    weights = [m.weight for m in modules]
    first = weights[0]
    if (first.dtype not in _DTYPES or first.device.type == "meta" or len({id(w) for w in weights}) < len(weights)
            or any(type(w) not in _PLAIN or w.dtype != first.dtype or w.device != first.device
                   or w.shape[1:] != first.shape[1:] for w in weights)):
        return False
    with torch.no_grad():
        buffer = torch.cat([w.detach() for w in weights])
        start = 0
        for module, w in zip(modules, weights):
            w.data = buffer[start:start + w.shape[0]]
            start += w.shape[0]
            module.__dict__[_PACKED] = True
    return True


def packed_weight(modules: Sequence[torch.nn.Module]) -> torch.Tensor | None:
    """The (sum N_i, K) weight of ``modules`` when theirs are consecutive rows of one buffer, else None."""
    weights = [m._parameters.get("weight") for m in modules]
    first = weights[0]
    if first is None or first.dim() != 2 or not first.is_contiguous() or first.device.type == "meta":
        return None
    K, base, storage = first.shape[1], first.data_ptr(), first.untyped_storage().data_ptr()
    rows = 0
    for w in weights:
        if (w is None or type(w) not in _PLAIN or w.dim() != 2 or w.shape[1] != K or w.dtype != first.dtype
                or not w.is_contiguous() or w.untyped_storage().data_ptr() != storage
                or w.data_ptr() != base + rows * K * w.element_size()):
            return None
        rows += w.shape[0]
    return first.detach().as_strided((rows, K), (K, 1))


def packed_outputs(x: torch.Tensor, modules: Sequence[torch.nn.Module], allowed) -> torch.Tensor | None:
    """``cat([m(x) for m in modules], -1)`` as one ``F.linear`` on their packed weight, or None where a call
    would not be that: weights not packed, a module not a plain bias-free ``nn.Linear`` (``allowed(forward)``
    accepts an instance forward that computes the same), hooks, autograd through the weights, a tensor subclass,
    ``torch.compile`` (which cannot trace the storage checks; it sees the separate calls)."""
    hooks = torch.nn.modules.module
    if (type(x) is not torch.Tensor or torch.compiler.is_compiling() or hooks._global_forward_hooks
            or hooks._global_forward_pre_hooks):
        return None
    for m in modules:
        forward = m.__dict__.get("forward")
        if not (m.__dict__.get(_PACKED) and _plain_linear(m) and (forward is None or allowed(forward))):
            return None
    weight = packed_weight(modules)
    if weight is None or weight.dtype != x.dtype or weight.device != x.device or (
            torch.is_grad_enabled() and any(m.weight.requires_grad for m in modules)):
        return None
    return torch.nn.functional.linear(x, weight)


def unpack_linears(model: torch.nn.Module) -> None:
    """Give every weight that ``pack_linears`` re-stored its own storage again (same values)."""
    with torch.no_grad():
        for module in model.modules():
            if module.__dict__.pop(_PACKED, False) and module._parameters.get("weight") is not None:
                module.weight.data = module.weight.data.clone()
