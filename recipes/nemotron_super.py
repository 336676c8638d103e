"""Nemotron 3 Super 120B-A12B, and tiny Super-shaped hybrids for CPU ranks.

Nemotron 3 Super is a hybrid Mamba-Transformer whose MoE layers route in a latent space
(`model.moe_latent_size`: 512 experts, top-22, latent 1024 of the model's 4096), with two
multi-token-prediction depths sharing one set of weights (`/*E/*E` after the pattern,
`model.mtp_use_repeated_layer`), pretrained on 25T tokens in NVFP4 with the last layers in
BF16. The tiny hybrids have every one of those features at CPU size: NVIDIA's own tiny Super
pattern `MEM*EME` (Mamba2, latent MoE, attention) with two shared MTP depths of an attention
and a latent-MoE layer; `super_tiny_dp1` is the one-rank reference every layout must match.
"""

from __future__ import annotations

from recipes.config.schema import ParallelConfig, RunConfig
from recipes.nemotron_h import hybrid_tiny_base

# NVIDIA's tiny Super (Nemotron@e27b371:src/nemotron/recipes/super3/tiny_model.py:57, 72-74):
# the main pattern, then two MTP depths of attention + MoE sharing their weights.
TINY_SUPER_MAIN = "MEM*EME"
TINY_SUPER_MTP = "/*E/*E"


def super_tiny_base(ranks: int = 1, main: str = TINY_SUPER_MAIN) -> RunConfig:
    """The tiny hybrid's sizes with Super's features: latent MoE (latent 32 of 64), two MTP
    depths of attention + latent MoE sharing one layer, MTP loss scale 0.3."""
    cfg = hybrid_tiny_base(ranks, pattern=main + TINY_SUPER_MTP)
    cfg.model.moe_latent_size = 32
    cfg.model.mtp_use_repeated_layer = True
    cfg.model.mtp_loss_scaling_factor = 0.3
    return cfg


def super_tiny_dp1() -> RunConfig:
    """Tiny Super-shaped hybrid (MEM*EME/*E/*E, latent MoE, 2 shared MTP depths) on one rank:
    the reference every layout must match."""
    return super_tiny_base(ranks=1)


def super_tiny_tp2_sp() -> RunConfig:
    """Tiny Super, TP2 + sequence parallel (the latent projections whole on both ranks)."""
    cfg = super_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True)
    return cfg


def super_tiny_pp2() -> RunConfig:
    """Tiny Super, 2 pipeline stages (MEM* | EME), the MTP depths on the last."""
    cfg = super_tiny_base(ranks=2, main="MEM*|EME")
    cfg.parallel = ParallelConfig(pipeline=2)
    return cfg


def super_tiny_pp2_vpp2() -> RunConfig:
    """Tiny Super, PP2 x VPP2 from four segments (ME | M* | EM | E), the MTP depths on the
    last stage's last virtual stage."""
    cfg = super_tiny_base(ranks=2, main="ME|M*|EM|E")
    cfg.parallel = ParallelConfig(pipeline=2, virtual_pipeline=2)
    return cfg


def super_tiny_ep2() -> RunConfig:
    """Tiny Super, each MoE layer's 4 latent experts split over 2 ranks (EP2 x DP2)."""
    cfg = super_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(expert=2)
    return cfg


def super_tiny_dp2_distopt() -> RunConfig:
    """Tiny Super, 2 data-parallel ranks with the distributed optimizer."""
    cfg = super_tiny_base(ranks=2)
    cfg.optimizer.distributed = True
    return cfg


def super_tiny_tp2_sp_pp2_ep2() -> RunConfig:
    """Tiny Super, three at once on 4 ranks: TP2 + SP x PP2 (MEM* | EME, MTP on the last
    stage), the experts over EP2 without expert-TP."""
    cfg = super_tiny_base(ranks=4, main="MEM*|EME")
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True, pipeline=2, expert=2,
                                  expert_tensor=1)
    return cfg


RECIPES = (
    super_tiny_dp1,
    super_tiny_tp2_sp,
    super_tiny_pp2,
    super_tiny_pp2_vpp2,
    super_tiny_ep2,
    super_tiny_dp2_distopt,
    super_tiny_tp2_sp_pp2_ep2,
)
