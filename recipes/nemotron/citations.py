"""The sources the Nemotron recipes cite, each spelled once: code as owner/repo@commit:path (the
recipes add :line), documents as their title and section. Commits are the ones read; a file that
changed later is cited at the commit whose text the value comes from. A document read only
through a summary of it says so in its name.
"""

from __future__ import annotations

BRIDGE = "NVIDIA-NeMo/Megatron-Bridge"
# Megatron Bridge: the model providers (shapes), the pretraining recipes (demo runs, not
# NVIDIA's published ones) and the named precision recipes.
H_PROVIDER = f"{BRIDGE}@38b4a06:src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
MAMBA_PROVIDER = f"{BRIDGE}@38b4a06:src/megatron/bridge/models/mamba/mamba_provider.py"
H_RECIPE = f"{BRIDGE}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotronh.py"
V2_RECIPE = f"{BRIDGE}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotron_nano_v2.py"
N3_RECIPE = f"{BRIDGE}@928a7e5:src/megatron/bridge/recipes/nemotronh/nemotron_3_nano.py"
N3_PROVIDER = f"{BRIDGE}@928a7e5:src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
N4_PROVIDER = f"{BRIDGE}@dc805f5:src/megatron/bridge/models/nemotron/nemotron_provider.py"
GPT_PROVIDER = f"{BRIDGE}@dc805f5:src/megatron/bridge/models/gpt_provider.py"
BRIDGE_COMMON = f"{BRIDGE}@38b4a06:src/megatron/bridge/recipes/common.py"
BRIDGE_OPTIMIZER = f"{BRIDGE}@38b4a06:src/megatron/bridge/recipes/utils/optimizer_utils.py"
MIXED_PRECISION = f"{BRIDGE}@38b4a06:src/megatron/bridge/training/mixed_precision.py"
# Megatron Bridge's scheduler overwrites the optimizer's weight decay every step.
BRIDGE_WEIGHT_DECAY = (
    f"Megatron Bridge's recipes set 0.1 ({BRIDGE_OPTIMIZER}:108-123) but their scheduler applies "
    "0.033 every step (start/end_weight_decay, :162-173; megatron-core 0.19.2 "
    "optimizer_param_scheduler.py:184-202, 300)")
# Megatron Bridge's providers keep attention scores in the run's precision (False); ours: True.
SOFTMAX_NOTE = ("Megatron Core's default and this project's: True; Megatron Core's local "
                "attention reads it, Transformer Engine's is not given it")
# Megatron Bridge's communication overlap rules and its H100 performance configs (the fast
# paths its benchmarks turn on).
COMM_OVERLAP = f"{BRIDGE}@38b4a06:src/megatron/bridge/training/comm_overlap.py"
N3_RECIPE_NOW = f"{BRIDGE}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotron_3_nano.py"
H_PERF = (f"{BRIDGE}@38b4a06:scripts/performance/configs/nemotronh/"
          "nemotronh_workload_base_configs.py")
N3_PERF = (f"{BRIDGE}@38b4a06:scripts/performance/configs/nemotronh/"
           "nemotron_3_workload_base_configs.py")
MEGATRON_CORE = "megatron-core 0.19.2:megatron/core"
NEMO_N4_TEMPLATE = "NVIDIA/NeMo@023dfbe:nemo/collections/llm/recipes/nemotron4_15b.py"
# NVIDIA's own recipe repository: docs of the published runs and the stage-0 configs.
NEMOTRON = "NVIDIA-NeMo/Nemotron@e27b371"
N3_DOCS = f"{NEMOTRON}:docs/nemotron/nano3/pretrain.md"
N3_PAPER = f"{NEMOTRON}:skills/nemotron-nano3/paper/pretraining.md"  # NVIDIA's report summary
N3_ARCHITECTURE = f"{NEMOTRON}:skills/nemotron-nano3/paper/architecture.md"
SUPER_STAGE0 = f"{NEMOTRON}:src/nemotron/recipes/super3/stage0_pretrain/config"
SUPER_PHASE1 = f"{SUPER_STAGE0}/phase1.yaml"
SUPER_PHASE2 = f"{SUPER_STAGE0}/phase2.yaml"
SUPER_LC1 = f"{SUPER_STAGE0}/long_context_1m.yaml"
SUPER_LC2 = f"{SUPER_STAGE0}/long_context_mixed.yaml"
# NVIDIA's per-dataset blend weights of each stage (conf/data/nemotron3_super_*.yaml carry them).
SUPER_BLEND1 = f"{SUPER_STAGE0}/data_prep/data_blend_raw_phase1.json"
SUPER_BLEND2 = f"{SUPER_STAGE0}/data_prep/data_blend_raw_phase2.json"
SUPER_BLEND_LC = f"{SUPER_STAGE0}/data_prep/data_blend_raw_long_context.json"
S3_DOCS = f"{NEMOTRON}:docs/nemotron/super3/pretrain.md"
S3_PAPER = f"{NEMOTRON}:skills/nemotron-super3/paper/pretraining.md"  # NVIDIA's report summary
S3_TINY = f"{NEMOTRON}:src/nemotron/recipes/super3/tiny_model.py"
# Megatron Bridge's Nemotron 3 Super recipe (its model from the HF config through the NemotronH
# bridge, whose MoE defaults every HF-loaded Nemotron-H gets) and its NVFP4 precision recipe.
S3_RECIPE = f"{BRIDGE}@53d40d1:src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py"
S3_BRIDGE = f"{BRIDGE}@53d40d1:src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py"
S3_PROVIDER = f"{BRIDGE}@53d40d1:src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
S3_PRECISION = f"{BRIDGE}@53d40d1:src/megatron/bridge/training/mixed_precision.py"
S3_COMMON = f"{BRIDGE}@53d40d1:src/megatron/bridge/recipes/common.py"
# Reports and model cards.
N4_REPORT = "Nemotron-4 15B technical report (arXiv 2402.16819; read through a summary)"
N340B_REPORT = "Nemotron-4 340B technical report, continued training (read through a summary)"
H_PAGE = "Nemotron-H research page (research.nvidia.com/labs/adlr/nemotronh)"
H_4B_CARD = "Nemotron-H-4B-Base-8K model card"
H_47B_CARD = "Nemotron-H-47B-Base-8K model card"
NANO2_CARD = "NVIDIA-Nemotron-Nano-12B-v2-Base model card, 'Model design'"
NANO2_REPORT = ("Nemotron Nano 2 technical report (arXiv 2508.14444; read through summaries of "
                "it)")
N3_CARD = "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card, 'Training'"
N3_REPORT = ("Nemotron 3 Nano technical report (arXiv 2512.20848), pretraining, MoE load "
             "balancing (read through a quotation of it)")
# Hugging Face configs, read through third-party transcriptions (Hugging Face not reachable).
H8B_CONFIG = "nvidia/Nemotron-H-8B-Base-8K config.json (a third-party transcription)"
V2_9B_CONFIG = "nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json (a third-party transcription)"
N3_CONFIG = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B config.json (a third-party transcription)"
S3_CONFIG = ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4 config.json (a third-party "
             "transcription)")

# Short names docs/nemotron.md uses for these sources (a legend at its head).
LABELS: tuple[tuple[str, str], ...] = (
    ("B-prov", H_PROVIDER), ("B-mamba", MAMBA_PROVIDER), ("B-H", H_RECIPE), ("B-v2", V2_RECIPE),
    ("B-n3", N3_RECIPE), ("B-n3-prov", N3_PROVIDER), ("B-n4", N4_PROVIDER),
    ("B-gpt", GPT_PROVIDER), ("B-common", BRIDGE_COMMON), ("B-opt", BRIDGE_OPTIMIZER),
    ("B-mp", MIXED_PRECISION), ("B-overlap", COMM_OVERLAP), ("B-n3-38b", N3_RECIPE_NOW),
    ("B-perf-H", H_PERF), ("B-perf-n3", N3_PERF),
    ("MC", MEGATRON_CORE), ("NeMo-n4", NEMO_N4_TEMPLATE),
    ("N-nano3-docs", N3_DOCS), ("N-nano3-paper", N3_PAPER), ("N-nano3-arch", N3_ARCHITECTURE),
    ("N-super3-phase1", SUPER_PHASE1), ("N-super3-phase2", SUPER_PHASE2),
    ("N-super3-lc1", SUPER_LC1), ("N-super3-lc2", SUPER_LC2), ("N-super3-blend1", SUPER_BLEND1),
    ("N-super3-blend2", SUPER_BLEND2), ("N-super3-blend-lc", SUPER_BLEND_LC),
    ("N-super3-docs", S3_DOCS),
    ("N-super3-paper", S3_PAPER), ("N-super3-tiny", S3_TINY), ("B-s3", S3_RECIPE),
    ("B-s3-bridge", S3_BRIDGE), ("B-s3-prov", S3_PROVIDER), ("B-s3-mp", S3_PRECISION),
    ("B-s3-common", S3_COMMON),
    ("hf-s3", S3_CONFIG),
    ("r-n4", N4_REPORT), ("r-340B", N340B_REPORT),
    ("r-H", H_PAGE), ("card-H-4B", H_4B_CARD), ("card-H-47B", H_47B_CARD),
    ("card-v2-12B", NANO2_CARD), ("r-v2", NANO2_REPORT), ("card-n3", N3_CARD),
    ("r-n3", N3_REPORT),
    ("hf-H-8B", H8B_CONFIG), ("hf-v2-9B", V2_9B_CONFIG), ("hf-n3", N3_CONFIG),
)
