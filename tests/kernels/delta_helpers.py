"""Shared pieces of the delta-rule kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import dataclasses

from replayssm.kernels.delta.config import SMALL_BATCH_MAX, default_config


def launch_config(K, V, state_dtype, kda, one_launch=False, **knobs):
    """The default launch configuration of the separate launches (with ``one_launch``: of the
    one-launch kernel at batch 4) for a layer, with ``knobs`` laid over it."""
    base = default_config(SMALL_BATCH_MAX if one_launch else SMALL_BATCH_MAX + 1, K, V, state_dtype, kda)
    return dataclasses.replace(base, **knobs)
