"""Triton helpers for the gate rings of the delta-rule programs.

Slot j of a KDA gate ring row holds ``G_j = g_0 + ... + g_j`` (fp32, one per key channel)
over the tokens buffered since the checkpoint, so the decay between entries is one
subtraction (``exp(G_c - G_j)``) with no cumulative sum over the window. A new entry needs
only the previous slot: ``G_c = G_{c-1} + g_c`` with ``G_{-1} = 0``. A Gated DeltaNet ring
row holds the per-token scalar log-decays ``g_j`` themselves (``gdn_decay_window``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def previous_gate_sum(gb_base, sgb_l, sgb_k, offs_k, mk, c):
    """``G_{c-1}`` (fp32) over the key channels ``offs_k`` (mask ``mk``) of a ring row
    ``gb_base``; zeros when ``c <= 0``."""
    has = (offs_k * 0 + c) > 0  # as a vector: c may be a plain integer (e.g. L - 1)
    return tl.load(gb_base + (c - 1) * sgb_l + offs_k * sgb_k, mask=mk & has, other=0.0).to(tl.float32)


@triton.jit
def append_gate_sum(g_base, sg_k, gb_base, sgb_l, sgb_k, c, K, BK: tl.constexpr, NK: tl.constexpr):
    """Store ``G_c = G_{c-1} + g_c`` at slot ``c`` of a ring row, key tile by key tile
    (``g_base``: the current token's (K,) log-decays)."""
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        gv = tl.load(g_base + offs_k * sg_k, mask=mk, other=0.0).to(tl.float32)
        gt = previous_gate_sum(gb_base, sgb_l, sgb_k, offs_k, mk, c) + gv
        tl.store(gb_base + c * sgb_l + offs_k * sgb_k, gt.to(gb_base.dtype.element_ty), mask=mk)


@triton.jit
def gdn_decay_window(gb_row, g_cur, offs_l, ml, inl, lay):
    """Gated DeltaNet decays of one (row, value head): (w (LP,) = exp(G_c - G_j) over the ring
    slots ``ml``, zero elsewhere; exp(G_c)), from its gate ring row and current gate."""
    gh = tl.load(gb_row + offs_l * lay.gb_l, mask=inl, other=0.0).to(tl.float32)
    gh = tl.where(ml, gh, 0.0)
    gtot = tl.sum(gh, axis=0) + tl.load(g_cur).to(tl.float32)
    return tl.where(ml, tl.exp(gtot - tl.cumsum(gh, axis=0)), 0.0), tl.exp(gtot)
