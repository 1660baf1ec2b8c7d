"""ReplaySSM for the Mamba-2 mixers: Mamba2, NemotronH, Bamba, FalconH1, Zamba2, GraniteMoeHybrid.

Decode step (mirrors transformers' own, except for the SSM):
in_proj -> split (z | xBC | dt) -> conv step on the cache's conv state (transformers'
own ``causal_conv1d_update``) -> split (x | B | C) -> ``mamba2_replay_decode`` (checkpoint
in the cache's recurrent state + ring of (x, dt, B)) -> gated RMSNorm (the module's own
``norm``; FalconH1 without it gates with z inside the kernel) -> out_proj. With
``buffer_len=1`` every step writes the state anyway, so the fused per-step kernel
(``mamba2_step_decode``) runs instead: the per-step baseline inside the same decode (except
for int8 / fp8 or stochastically rounded checkpoints, which only the replay kernel writes).

On a cache recording its past (speculative decoding) the same step takes T >= 1 tokens: the conv
over the window with a roll-back-able history and ``mamba2_replay_verify`` (``speculative``).
"""

from __future__ import annotations

import torch

from replayssm.kernels.mamba2 import (mamba2_replay_decode, mamba2_replay_materialize, mamba2_replay_verify,
                                      mamba2_step_decode)

from . import compat, speculative
from .base import ReplayMixin, apply_padding_mask
from .cache_state import ReplayBuffers
from .fused_norm import gated_norm
from .kinds import MAMBA2
from .quant_state import kernel_args, needs_replay_path


class ReplayMamba2Mixer(ReplayMixin):
    """Replay decode for every Mamba-2-type mixer (mixed in before the original class)."""

    layer_kind = MAMBA2
    uses_arrival_counters = True
    state_scale_dim = -1  # one scale per (head, head-dim lane) over N

    def _replay_materialize(self, state, buffers: ReplayBuffers):
        t = buffers.tensors
        A = -torch.exp(self.A_log.float())
        return mamba2_replay_materialize(state, t["x_buf"], t["dt_buf"], t["B_buf"], buffers.cursor, A,
                                         *kernel_args(t, state))

    def _replay_step(self, hidden_states, layer, buffers: ReplayBuffers, attention_mask, window: bool = False):
        batch, T = hidden_states.shape[:2]
        dtype = hidden_states.dtype
        is_falcon_h1 = hasattr(self, "mup_vector") or hasattr(self, "ssm_in_multiplier")

        h = apply_padding_mask(hidden_states, attention_mask)
        if is_falcon_h1:
            h = h * self.ssm_in_multiplier
        projected = self.in_proj(h)
        if is_falcon_h1:
            projected = projected * self.mup_vector
        gate, xBC, dt = projected.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)

        if not window:
            xBC = self._conv(layer, xBC[:, 0])[:, None]
        else:
            xBC = speculative.window_conv(self, layer, buffers, xBC)
        xBC = apply_padding_mask(xBC, attention_mask)
        GN = self.n_groups * self.ssm_state_size
        x, Bm, Cm = torch.split(xBC, [self.intermediate_size, GN, GN], dim=-1)

        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.ssm_state_size
        z = None
        if is_falcon_h1 and not getattr(self, "mamba_rms_norm", True):
            z = gate.reshape(batch, T, H, P)
        t = buffers.tensors
        A = -torch.exp(self.A_log.float())
        args = (x.reshape(batch, T, H, P), dt.reshape(batch, T, H), Bm.reshape(batch, T, G, N),
                Cm.reshape(batch, T, G, N))
        backend = self.replay_options.backend
        state = compat.recurrent_state(layer)
        if window:  # speculative verify of T tokens (speculative.py)
            scale, rng = kernel_args(t, state)
            y = mamba2_replay_verify(*args, state, t["x_buf"], t["dt_buf"], t["B_buf"], buffers.cursor, A,
                                     self.dt_bias, self.D, z, True, state_scale=scale, state_rng=rng, backend=backend)
        else:
            args = tuple(a[:, 0] for a in args)
            z = z[:, 0] if z is not None else None
            if self.replay_options.buffer_len == 1 and not needs_replay_path(self.replay_options):
                # every step writes the state: the fused per-step kernel
                y = mamba2_step_decode(*args, state, A, self.dt_bias, self.D, z, True, backend=backend)
            else:
                scale, rng = kernel_args(t, state)
                y = mamba2_replay_decode(
                    *args, state, t["x_buf"], t["dt_buf"], t["B_buf"], buffers.cursor, A, self.dt_bias, self.D, z,
                    True, arrivals=buffers.extra.get("arrivals"), state_scale=scale, state_rng=rng,
                    backend=backend)
        y = y.reshape(batch, T, H * P)
        if not is_falcon_h1 or getattr(self, "mamba_rms_norm", True):
            y = gated_norm(self.norm, y, gate, backend)
        return self.out_proj(y.to(dtype))
