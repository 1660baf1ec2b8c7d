"""A graph-decoded step's inputs, without transformers' per-step preparation.

transformers' ``prepare_inputs_for_generation`` rebuilds each decode step's inputs on the host, a
4-D attention mask over the whole static cache included; that takes longer than launching the
captured step, and the GPU waits for it (``generate`` synchronises once per step). ``StepInputs``
builds a step's inputs from the first decode step's: the new token, the next position ids, and the
2-D padding mask (all ones where generate passes none) written into one fixed 4-D mask tensor
(positions past the sequence stay False, as in transformers' causal mask over a static cache). It
is trusted only after it reproduced transformers' own inputs exactly (keys, values, shapes, dtypes,
strides) on a step, and again for every call whose inputs have another structure; otherwise the
pooled slot keeps transformers' preparation.

An assisted slot's verify windows of T tokens get the same, one ``StepInputs(T)`` per window
length: the last T tokens and positions, and the padding mask written into T rows, row t seeing the
positions up to the window's t-th token (the causal edge over the window's own columns).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class StepInputs:
    """Decode-step inputs of one pooled slot, or its verify windows of ``T`` tokens (module notes)."""

    def __init__(self, T: int = 1) -> None:
        self.T = T
        self._causal: torch.Tensor | None = None  # (T, T) lower triangle, on the mask's device
        self.trusted: bool | None = None  # None until checked against transformers once
        self.checked_form: tuple | None = None  # the structure of the call the check passed on
        self.template: dict[str, Any] | None = None
        self.mask: torch.Tensor | None = None
        self._stale_mask = True

    def new_call(self) -> None:
        """A ``generate`` call starts: its first decode step is prepared by transformers."""
        self.template = None
        self._stale_mask = True

    def prepare(self, original: Callable[[], dict], input_ids: torch.Tensor, kwargs: dict) -> dict:
        if self.trusted is False:
            return original()
        if self.template is None:
            self.template = original()
            if self.trusted and _form(self.template, kwargs) != self.checked_form:
                self.trusted = None  # a call of another structure (other inputs): check it again
            return dict(self.template)  # (assisted generation sets logits_to_keep in what it gets)
        lean = self._build(input_ids, kwargs)
        if self.trusted and lean is not None:
            return lean
        want = original()
        self.trusted = lean is not None and same_inputs(lean, want)
        self.checked_form = _form(self.template, kwargs) if self.trusted else None
        return want

    def _build(self, input_ids: torch.Tensor, kwargs: dict) -> dict | None:
        mask2d = kwargs.get("attention_mask")
        if mask2d is None and input_ids.dim() == 2:  # no padding mask: every position so far is a token
            mask2d = torch.ones((), dtype=torch.bool, device=input_ids.device).expand(input_ids.shape)
        if not (isinstance(mask2d, torch.Tensor) and mask2d.dim() == 2 and input_ids.dim() == 2):
            return None
        mask = self._mask(self.template.get("attention_mask"), mask2d)
        if mask is None:
            return None
        T = self.T
        if input_ids.shape[1] < T:
            return None
        lean = dict(self.template)
        lean["input_ids"] = input_ids[:, -T:].clone(memory_format=torch.contiguous_format)
        lean["attention_mask"] = mask
        if "position_ids" in lean:
            positions = kwargs.get("position_ids")
            if not isinstance(positions, torch.Tensor):
                return None
            lean["position_ids"] = positions[..., -T:].clone(memory_format=torch.contiguous_format)
        return lean

    def _mask(self, like, mask2d: torch.Tensor):
        """The step's 4-D mask in the form of the template's ``like`` (a (B, 1, T, capacity) bool tensor,
        or a dict of them and None per attention type), or None where it has another form."""
        if isinstance(like, dict):
            out = {key: None if value is None else self._mask(value, mask2d) for key, value in like.items()}
            return None if any(out[k] is None and like[k] is not None for k in like) else out
        T, n = self.T, mask2d.shape[1]
        if not (isinstance(like, torch.Tensor) and like.dtype == torch.bool and like.dim() == 4
                and like.shape[1] == 1 and like.shape[2] == T and T <= n <= like.shape[3]):
            return None
        if self.mask is None or self.mask.shape != like.shape or self.mask.device != like.device:
            self.mask, self._stale_mask = torch.zeros_like(like), False
        if self._stale_mask:  # positions a previous call reached
            self.mask.zero_()
            self._stale_mask = False
        self.mask[:, 0, :, :n].copy_(mask2d[:, None, :].expand(mask2d.shape[0], T, n))
        if T > 1:  # window token t sees the window's tokens up to itself
            if self._causal is None or self._causal.device != like.device:
                self._causal = torch.ones(T, T, dtype=torch.bool).tril().to(like.device)
            self.mask[:, 0, :, n - T:n] &= self._causal
        return self.mask


def _structure(value: Any):
    """What a call's inputs look like apart from their values: keys, types, tensor dtypes and shapes."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.device)
    if isinstance(value, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_structure(v) for v in value))
    if isinstance(value, (bool, int, float, str, type(None))):
        return ("value", value)
    return ("object", id(value))


def _form(template: dict, kwargs: dict) -> tuple:
    """The structure of a call: its first step's prepared inputs and the names generate passes."""
    return _structure(template), tuple(sorted(kwargs))


def same_inputs(a: Any, b: Any) -> bool:
    """Whether two step inputs are interchangeable for a captured graph: equal tensors of the same
    shape, dtype, device and strides; the same other objects."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and a.stride() == b.stride() and torch.equal(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(same_inputs(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_inputs(x, y) for x, y in zip(a, b))
    if a is b:
        return True
    try:
        return isinstance(a, (bool, int, float, str, type(None))) and type(a) is type(b) and a == b
    except Exception:  # pragma: no cover - objects whose comparison fails are not the same input
        return False
