"""ReplaySSM for the delta-rule mixers.

Gated DeltaNet: Qwen3Next, Qwen3.5, Qwen3.5-MoE, Qwen4Exp, OlmoHybrid.
Kimi Delta Attention: KimiLinear, BailingHybrid, GLM5-Next.

Decode step (mirrors transformers' own, except for the recurrence): projections -> conv
step on the cache's conv state (transformers' own ``causal_conv1d_update``) -> q, k
L2-normalised in fp32 (q scaled by K^-1/2), beta = sigmoid(b) in fp32 (never rounded
through bf16), log-decay g in fp32 -> ``delta_replay_decode`` (checkpoint in the cache's
recurrent state + ring of (u, k, g)) -> the module's own gated norm -> output projection.
With ``buffer_len=1`` the fused per-step kernel (``delta_step_decode``) runs instead: the
per-step baseline inside the same decode.
Heads are never expanded here: value head h reads key head h // (HV / Hk) inside the
kernels, so the 5.17 vs 5.23 difference in where transformers expands them does not matter.
On a cache recording its past (speculative decoding) the same step takes T >= 1 tokens: the conv
over the window with a roll-back-able history and ``delta_replay_verify`` (``speculative``).
"""

from __future__ import annotations

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.delta.gdn_gates import gdn_gates
from replayssm.kernels.delta.prologue import gdn_prologue
from replayssm.kernels.delta import (delta_replay_decode, delta_replay_materialize, delta_replay_verify, delta_step_decode,
                                     l2norm_qk)

from . import compat, speculative
from .base import ReplayMixin, apply_padding_mask
from .cache_state import ReplayBuffers
from .fused_linear import linear_concat, linear_outputs
from .fused_norm import gated_norm
from .kinds import GATED_DELTANET, KDA
from .packed_linear import pack_linears
from .quant_state import kernel_args, needs_replay_path


#: projections of one input that a one-row decode step launches together (``fused_linear.linear_outputs``
#: / ``linear_concat``): Qwen3Next's, Qwen3.5's (and Qwen3.5-MoE's, Qwen4Exp's), q/k/v (OlmoHybrid, KDA)
#: and OlmoHybrid's gate inputs
QWEN3_NEXT_PROJECTIONS = ("in_proj_qkvz", "in_proj_ba")
QWEN3_5_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
QKV_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
OLMO_GATE_PROJECTIONS = ("g_proj", "b_proj", "a_proj")
PROJECTION_GROUPS = (QWEN3_NEXT_PROJECTIONS, QWEN3_5_PROJECTIONS, QKV_PROJECTIONS, OLMO_GATE_PROJECTIONS)


class _DeltaReplayMixin(ReplayMixin):
    """Shared decode for both delta-rule kinds; subclasses supply projections and output."""

    state_scale_dim = -2  # one scale per (value head, value column) over the key dim

    def _projections(self, names) -> tuple:
        return tuple(getattr(self, n) for n in names)

    def _replay_pack(self) -> None:
        for names in PROJECTION_GROUPS:
            if all(isinstance(getattr(self, n, None), torch.nn.Linear) for n in names):
                pack_linears(self._projections(names))

    def _replay_materialize(self, state, buffers: ReplayBuffers):
        t = buffers.tensors
        return delta_replay_materialize(state, t["u_buf"], t["k_buf"], t["g_buf"], buffers.cursor,
                                        *kernel_args(t, state))

    def _run_kernel(self, layer, buffers, q, k, v, g, beta, window: bool = False):
        """q, k (B, T, Hk, K); v (B, T, HV, V); g (B, T, HV[, K]); beta (B, T, HV) -> o (B, T, HV, V).
        T = 1 without ``window`` (a decode step); with it a verify of T tokens."""
        t = buffers.tensors
        batch, T = q.shape[:2]
        backend = self.replay_options.backend
        qn, kn = l2norm_qk(q.reshape(batch * T, *q.shape[2:]), k.reshape(batch * T, *k.shape[2:]),
                           q.shape[-1] ** -0.5, backend=backend)
        qn, kn = qn.view(q.shape), kn.view(k.shape)
        if window:
            state = compat.recurrent_state(layer)
            scale, rng = kernel_args(t, state)
            return delta_replay_verify(qn, kn, v, g, beta, state, t["u_buf"], t["k_buf"], t["g_buf"], buffers.cursor,
                                       state_scale=scale, state_rng=rng, backend=backend)
        return self._decode(layer, buffers, *(a[:, 0] for a in (qn, kn, v, g, beta)))[:, None]

    def _decode(self, layer, buffers, qn, kn, v, g, beta):
        """One decode step from normalised q, k (B, Hk, K) fp32, v (B, HV, V), g, beta -> o (B, HV, V)."""
        t = buffers.tensors
        backend = self.replay_options.backend
        state = compat.recurrent_state(layer)
        if self.replay_options.buffer_len == 1 and not needs_replay_path(self.replay_options):
            # every step writes the state: the fused per-step kernel
            o = delta_step_decode(qn, kn, v, g, beta, state, backend=backend)
        else:
            scale, rng = kernel_args(t, state)
            o = delta_replay_decode(qn, kn, v, g, beta, state, t["u_buf"], t["k_buf"], t["g_buf"], buffers.cursor,
                                    state_scale=scale, state_rng=rng, backend=backend)
        return o

    def _conv_tokens(self, layer, buffers, mixed, window):
        """mixed (B, T, C) conv inputs -> conv outputs (B, T, C)."""
        if not window:
            return self._conv(layer, mixed[:, 0])[:, None]
        return speculative.window_conv(self, layer, buffers, mixed)


class ReplayGatedDeltaNetMixer(_DeltaReplayMixin):
    """Replay decode for the Gated DeltaNet mixers (scalar log-decay per value head)."""

    layer_kind = GATED_DELTANET

    def _project(self, h: torch.Tensor):
        """h (B, T, hidden) -> mixed_qkv (B, T, conv_dim), gate z (B, T, Hv, dv), b, a (B, T, Hv), beta scale."""
        batch, T = h.shape[:2]
        scale = 1.0
        if hasattr(self, QWEN3_NEXT_PROJECTIONS[0]):  # Qwen3Next: interleaved per key-head group
            qkvz, ba = linear_outputs(h, self._projections(QWEN3_NEXT_PROJECTIONS))
            q, k, v, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
            mixed = torch.cat([t.reshape(batch, T, -1) for t in (q, k, v)], dim=-1)
        elif hasattr(self, QWEN3_5_PROJECTIONS[0]):  # Qwen3.5, Qwen3.5-MoE, Qwen4Exp
            mixed, z, b, a = linear_outputs(h, self._projections(QWEN3_5_PROJECTIONS))
        else:  # OlmoHybrid
            mixed = linear_concat(h, self._projections(QKV_PROJECTIONS))
            z, b, a = linear_outputs(h, self._projections(OLMO_GATE_PROJECTIONS))
            if getattr(self, "allow_neg_eigval", False):
                scale = 2.0
        return (mixed, z.reshape(batch, T, self.num_v_heads, self.head_v_dim),
                b.reshape(batch, T, self.num_v_heads), a.reshape(batch, T, self.num_v_heads), scale)

    def _replay_step(self, hidden_states, layer, buffers: ReplayBuffers, attention_mask, window: bool = False):
        batch, T = hidden_states.shape[:2]
        h = apply_padding_mask(hidden_states, attention_mask)
        mixed, z, b, a, beta_scale = self._project(h)
        if not window and self.activation == "silu" and (
                resolve_backend(self.replay_options.backend, h.device) == "triton"):
            # one launch for the conv step, the q / k norms and the gates
            heads = (self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim)
            qn, kn, v, g, beta = gdn_prologue(
                compat.conv_state(layer), mixed[:, 0], self.conv1d.weight.squeeze(1), self.conv1d.bias, a[:, 0],
                b[:, 0], self.A_log, self.dt_bias, heads, self.head_k_dim ** -0.5, beta_scale,
                count=compat.token_count(layer, h.device), backend=self.replay_options.backend)
            o = self._decode(layer, buffers, qn, kn, v, g, beta)[:, None]
            return self._gated_output(o, z, batch, T)
        mixed = self._conv_tokens(layer, buffers, mixed, window)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(batch, T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(batch, T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(batch, T, self.num_v_heads, self.head_v_dim)
        g, beta = gdn_gates(a.reshape(batch * T, -1), b.reshape(batch * T, -1), self.A_log, self.dt_bias, beta_scale,
                            backend=self.replay_options.backend)
        g, beta = g.view(batch, T, -1), beta.view(batch, T, -1)
        o = self._run_kernel(layer, buffers, q, k, v, g, beta, window)  # (B, T, Hv, dv)
        return self._gated_output(o, z, batch, T)

    def _gated_output(self, o, z, batch: int, T: int):
        """o (B, T, Hv, dv), gate z -> the output projection of the gated norm."""
        norm = self.norm if hasattr(self, "norm") else self.o_norm
        o = gated_norm(norm, o.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim),
                       self.replay_options.backend).reshape(batch, T, -1)
        proj = self.out_proj if hasattr(self, "out_proj") else self.o_proj
        return proj(o)


class ReplayKimiDeltaMixer(_DeltaReplayMixin):
    """Replay decode for the Kimi Delta Attention mixers (log-decay per key channel)."""

    layer_kind = KDA

    def _replay_step(self, hidden_states, layer, buffers: ReplayBuffers, attention_mask, window: bool = False):
        batch, T = hidden_states.shape[:2]
        H, D = self.num_heads, self.head_dim
        h = apply_padding_mask(hidden_states, attention_mask)
        mixed = linear_concat(h, self._projections(QKV_PROJECTIONS))
        mixed = self._conv_tokens(layer, buffers, mixed, window)
        q, k, v = (t.reshape(batch, T, H, D) for t in torch.split(mixed, [self.qkv_dim] * 3, dim=-1))
        g = self.forget_gate(h).float().reshape(batch, T, H, D)
        beta = torch.sigmoid(self.b_proj(h).float()).reshape(batch, T, H)
        o = self._run_kernel(layer, buffers, q, k, v, g, beta, window)  # (B, T, H, D)
        gate = self.g_proj(h) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(h))
        o = gated_norm(self.o_norm, o.reshape(batch, T, H, D), gate.reshape(batch, T, H, D),
                       self.replay_options.backend).reshape(batch, T, -1)
        return self.o_proj(o)
