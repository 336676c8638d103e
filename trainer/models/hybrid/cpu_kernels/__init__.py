"""The Mamba2 kernels in torch, for CPU ranks: the chunked SSD scan, the causal depthwise conv1d,
the gated group RMSNorm, and the fused training call composed from them, each with the call
signature of the mamba-ssm / causal-conv1d kernel it stands in for (`docs/cpu-runtime.md`)."""
