"""Delta-rule (Gated DeltaNet, Kimi Delta Attention) ReplaySSM kernels and references."""
