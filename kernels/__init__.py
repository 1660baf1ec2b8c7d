"""ReplaySSM kernels: torch + triton only (never imports transformers).

Every kernel has a plain PyTorch reference with the same signature; the
reference is also the CPU path. ``replayssm.kernels.backend`` picks one.
"""
