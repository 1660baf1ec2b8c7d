"""The host-side launch helpers that the kernel families share (``replayssm.kernels.backend``)."""

import triton

from replayssm.kernels.backend import is_pow2, pow2


def test_pow2_is_the_smallest_covering_power_of_two():
    """Against triton.next_power_of_2 (which the families used before), with 1 for v <= 1."""
    for v in [*range(-3, 2100), 4095, 4096, 4097, 2 ** 31 - 1, 2 ** 31, 2 ** 40 + 1]:
        assert pow2(v) == triton.next_power_of_2(max(1, v)), v


def test_is_pow2():
    powers = {1 << i for i in range(48)}
    assert [v for v in range(-4, 1100) if is_pow2(v)] == sorted(p for p in powers if p < 1100)
    assert is_pow2(1 << 47) and not is_pow2((1 << 47) + 1) and not is_pow2(0)
