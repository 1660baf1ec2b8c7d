"""Launching a graph-decoded step as soon as its token exists, so that the GPU does not wait for the host.

transformers' decode loop synchronises with the GPU once per step (its stop check reads a device
flag) and then spends host time (the loop, the next step's inputs, the model call) before the next
step's graph is launched: the GPU idles that long every step. ``LaunchAhead`` is a stopping
criterion that never stops anything, appended to the call's criteria: transformers calls it right
after appending the new token and before that synchronisation. It writes the next step's inputs into
the graph's static inputs (the token; position ids and cache position one further; the new position
unmasked in the 4-D mask: what ``StepInputs`` and transformers build for the step) and replays the
graph on a side stream, which the synchronisation does not wait for. When the loop then calls the
model for that step, the output is handed over behind the side stream's event, and the inputs the
loop passed are compared on the device with those the graph ran on (no synchronisation); a
difference raises ``GraphDecodeError`` at the end of the call, never a wrong result returned.

It runs only where the pooled cache is not returned to the caller: when end-of-sequence tokens end
the loop, the step launched ahead has already advanced the cache by one token.
"""

from __future__ import annotations

import copy

import torch
from transformers import StoppingCriteria

#: static inputs whose next-step values follow from the current ones without the host
ADVANCING = frozenset({"input_ids", "position_ids", "cache_position", "attention_mask"})


def _masks(value) -> list[torch.Tensor]:
    """The 4-D boolean masks of a step's ``attention_mask`` (a tensor, or a dict per attention type)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [m for m in value.values() if isinstance(m, torch.Tensor)]
    return []


def advancing(static_inputs: dict) -> bool:
    """Whether every tensor input of a step is one ``LaunchAhead`` knows how to advance: the token,
    positions, and 4-D boolean masks of shape (B, 1, 1, capacity)."""
    if any(isinstance(value, (torch.Tensor, dict)) and key not in ADVANCING for key, value in static_inputs.items()):
        return False
    mask = static_inputs.get("attention_mask")
    if isinstance(mask, dict) and any(v is not None and not isinstance(v, torch.Tensor) for v in mask.values()):
        return False
    return isinstance(static_inputs.get("input_ids"), torch.Tensor) and all(
        m.dtype == torch.bool and m.dim() == 4 and m.shape[1] == m.shape[2] == 1 for m in _masks(mask))


class LaunchAhead(StoppingCriteria):
    """The early launch of one ``generate`` call on one pooled slot (see the module notes).

    ``last_len``: the sequence length at which the loop stops for length; no step is launched
    beyond it. The slot's graph launches the step (``replay_ahead``) and queues the loop behind it
    (``wait_ahead``).
    """

    def __init__(self, slot, last_len: int):
        self.slot = slot
        self.last_len = last_len
        self.pending = False  # a launched step not yet handed to the loop
        self.ready_for_next = False  # the last step ran through the graph (its static inputs are that step's)
        self.launched = 0
        self.mismatch: torch.Tensor | None = None
        self._never: torch.Tensor | None = None
        self._advancing: bool | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self._never is None or self._never.shape[0] != input_ids.shape[0]:
            self._never = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.ready_for_next and not self.pending and input_ids.shape[1] < self.last_len:
            self._launch(input_ids)
        return self._never

    def _launch(self, input_ids: torch.Tensor) -> None:
        slot = self.slot
        static = slot.static_inputs
        if self._advancing is None:
            self._advancing = advancing(static)
        mask_col = input_ids.shape[1] - 1  # the new token's position in the static cache
        masks = _masks(static.get("attention_mask"))
        if not self._advancing or any(mask_col >= m.shape[-1] for m in masks):
            return
        static["input_ids"].copy_(input_ids[:, -1:])
        for key in ("position_ids", "cache_position"):
            if isinstance(static.get(key), torch.Tensor):
                static[key].add_(1)
        for m in masks:
            m[..., mask_col] = True
        slot.graph.replay_ahead()
        self.pending = True
        self.ready_for_next = False
        self.launched += 1

    def collect(self, kwargs: dict, same_structure: bool):
        """The launched step's output for the loop's model call with ``kwargs``."""
        from replayssm.errors import GraphDecodeError

        self.pending = False
        self.slot.graph.wait_ahead()
        if not same_structure:
            raise GraphDecodeError("a decode step was launched ahead, but generate() then called the model with "
                                   "inputs of another structure; the cache has already advanced",
                                   hint="patch the model with cuda_graphs=False and report this")
        if self.mismatch is None:
            self.mismatch = torch.zeros((), dtype=torch.bool, device=self._never.device)
        _compare_into(self.mismatch, kwargs, self.slot.static_inputs)
        self.ready_for_next = True
        return copy.copy(self.slot.static_output)

    def ran_graph(self) -> None:
        """The loop's last model call replayed (or captured) the graph."""
        self.ready_for_next = True

    def finish(self) -> bool:
        """End of the call: wait for a step still in flight; whether every launched step's inputs
        were the loop's (one synchronisation)."""
        if self.pending:
            self.slot.graph.wait_ahead()
            self.pending = False
        return self.mismatch is None or not bool(self.mismatch)


def _compare_into(flag: torch.Tensor, given, static) -> None:
    if isinstance(static, torch.Tensor):
        torch.logical_or(flag, (given != static).any(), out=flag)
    elif isinstance(static, dict):
        for key, value in static.items():
            _compare_into(flag, given.get(key) if isinstance(given, dict) else None, value)
