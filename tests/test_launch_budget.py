"""How many kernels a rewritten mixer launches per decode step and per verify window, once warm, on the
Triton backend (through the interpreter): at batch 1 these launches, not their bytes, are the step's
cost, so a PyTorch op slipping back into the hot path is a regression. Also: no host synchronisation
in either (a CUDA graph could not hold one). Counted per mixer call, by the innermost module running
each operator; the projections (``nn.Linear`` children) and transformers' code outside the mixers are
not counted."""

from __future__ import annotations

import collections
import contextlib
import functools
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import replayssm

from helpers import tiny
from speculative_helpers import ScriptedDrafter, drafting

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available(),
                                reason="counts the interpreter's launches (CPU runs)")

#: operators that launch no kernel (views, allocation, dtype arithmetic) and the custom-op wrappers
#: around the Triton launches, which are counted themselves
_NO_LAUNCH = {"view", "_unsafe_view", "reshape", "select", "slice", "squeeze", "unsqueeze", "split", "split_with_sizes",
              "as_strided", "t", "transpose", "permute", "expand", "detach", "alias", "empty", "empty_like",
              "empty_strided", "promote_types", "unbind", "chunk", "narrow", "unflatten", "flatten", "lift_fresh"}
_HOST_SYNC = {"_local_scalar_dense", "item", "nonzero", "is_nonzero"}

#: (launches per layer call: Triton kernels + launching operators) of a warm decode step and of a
#: warm verify window, on CPU tensors (where the projections are separate ``nn.Linear`` calls)
BUDGETS = {
    "qwen3_5": (3, 5),  # prologue, replay, gated norm | window conv, gates, q/k norms, verify, gated norm
    "nemotron_h": (5, 5),  # conv, -exp(A_log) (2), replay, gated norm | window conv, -exp (2), verify, gated norm
    # conv (window conv), q/k norms, replay (verify), gated norm, beta's sigmoid, and the cat of the q / k / v
    # projections (one grouped launch on a GPU)
    "kimi_linear": (6, 6),
}


class _Counter(TorchDispatchMode):
    """Counts operators and Triton launches by the innermost module running them."""

    def __init__(self, model):
        super().__init__()
        self.stack, self.ops = [], collections.defaultdict(collections.Counter)
        self.calls = collections.Counter()
        self.hooks = []
        for module in model.modules():
            self.hooks.append(module.register_forward_pre_hook(self._enter))
            self.hooks.append(module.register_forward_hook(self._leave))

    def _enter(self, module, args):
        self.stack.append(module)
        self.calls[id(module)] += 1

    def _leave(self, module, args, output):
        self.stack.pop()

    def note(self, name):
        if self.stack:
            self.ops[id(self.stack[-1])][name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0] if func.namespace == "aten" else None
        if name is not None and name not in _NO_LAUNCH:
            self.note(name)
        return func(*args, **(kwargs or {}))

    def close(self):
        for hook in self.hooks:
            hook.remove()


@contextlib.contextmanager
def _counting(model):
    from triton.runtime.interpreter import InterpretedFunction

    counter = _Counter(model)
    run = InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        counter.note("triton:" + self.fn.__name__)
        with _disable_current_modes():
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted_run
    try:
        with counter:
            yield counter
    finally:
        InterpretedFunction.run = run
        counter.close()


def _per_call(counter, mixers):
    """Per mixer call: (launches, host synchronisations, the operators)."""
    ops = collections.Counter()
    calls = 0
    for m in mixers:
        ops.update(counter.ops[id(m)])
        calls += counter.calls[id(m)]
    launches = sum(n for name, n in ops.items() if name not in _HOST_SYNC)
    syncs = sum(n for name, n in ops.items() if name in _HOST_SYNC)
    return launches / calls, syncs / calls, dict(ops)


@pytest.mark.parametrize("family", sorted(BUDGETS))
def test_warm_decode_steps_and_verify_windows_stay_within_their_launches(family):
    model = tiny(family)
    ids = torch.randint(3, 512, (1, 7), generator=torch.Generator().manual_seed(3))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    step_budget, window_budget = BUDGETS[family]
    with torch.no_grad():  # the drafts: the stock model's greedy continuation (fp32: the patched one's too)
        ref = model.generate(ids, max_new_tokens=16, min_new_tokens=16, **kw)
    replayssm.patch(model, buffer_len=8, backend="triton")
    mixers = [m for m in model.modules() if hasattr(m, "replay_options")]
    try:
        assert mixers
        with torch.no_grad():  # decode steps: the third one (the first ones run one-time checks)
            out = model(ids, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(2):
                nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            with _counting(model) as counter:
                model(nxt, past_key_values=cache, use_cache=True)
        launches, syncs, ops = _per_call(counter, mixers)
        assert syncs == 0 and launches <= step_budget, ops

        drafter = ScriptedDrafter(model, ref, 2, seed=0, min_draft=2)  # windows of 3, every draft right
        windows = []
        real_forward = model.forward

        @functools.wraps(real_forward)  # generate() checks its keyword arguments against the signature
        def forward(*args, **kwargs):  # count the fourth window on (warm, settled by a crop)
            window = kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] == 3
            windows.append(window)
            if not window or windows.count(True) < 4:
                return real_forward(*args, **kwargs)
            with _counting(model) as counting:
                result = real_forward(*args, **kwargs)
            counted.append(_per_call(counting, mixers))
            return result

        counted = []
        model.forward = forward  # an instance attribute, removed below
        try:
            with drafting(model, drafter):
                got = model.generate(ids, max_new_tokens=16, min_new_tokens=16, prompt_lookup_num_tokens=2, **kw)
        finally:
            del model.forward
        assert torch.equal(got, ref) and counted, drafter.log
        for launches, syncs, ops in counted:
            assert syncs == 0 and launches <= window_budget, ops
    finally:
        replayssm.unpatch(model)
