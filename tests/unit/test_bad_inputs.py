"""Every user mistake is one line naming the field and the fix, across the whole schema.

One table of command lines that must each be refused by `resolve_config` or, for the paths,
the trainer's `validate_paths` after it (as the entry pipeline runs them) with a `ConfigError`
whose message contains the expected text and no newline; `{tmp}` stands for a directory holding
the files and checkpoint layouts the path cases name (built by `paths_dir`). A second table
holds the command lines only a launching process can refuse (the fit on this machine, the nodes
a cluster file places the ranks on), run through that process's checks: pretrain.py's
`ready_to_launch` and launch.py's `plan_launch`, before any rank starts or job is submitted. A
few cases then run the real entry point to show the user sees `error: <that line>` and exit
code 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from plugins.protocol.errors import ConfigError, error_lines
from recipes.config.path_rules import check_output_dir
from recipes.registry import get_recipe
from recipes.resolve import resolve_config
from tests.hang import HANG_S
from tests.unit.dataset_fixtures import write_dataset
from tests.unit.test_fast_path_rules import CASES as FAST_PATH_CASES
from trainer.checkpoint.preflight import validate_paths
from trainer.entry.commands import PRETRAIN
from trainer.entry.contract import main

REPO = Path(__file__).resolve().parents[2]
SECTIONS = (
    "model, parallel, cluster, train, optimizer, scheduler, precision, data, checkpoint, logging, "
    "plugins.fp8, plugins.context_parallel, plugins.moe"
)

# The fast-path rules' cases as command lines (each breaks exactly its rule).
FAST_PATH_BAD_INPUTS = [([f"recipe={recipe}", *overrides], line)
                        for _, recipe, overrides, line in FAST_PATH_CASES]

# (argv, text the one-line message must contain); the default recipe is tiny_tp2_pp2.
BAD_INPUTS: list[tuple[list[str], str]] = [
    # model
    (["model.hidden_size=0"], "model.hidden_size=0 must be at least 1"),
    (["model.num_layers=-2"], "model.num_layers=-2 must be at least 1"),
    (["model.num_layers=2.5"], "model.num_layers expects an integer, got '2.5'"),
    (["model.activation=relu"], "model.activation expects one of gelu, swiglu, squared_relu, "
     "got 'relu'"),
    (["model.normalization=rmsnorm"], "model.normalization expects one of LayerNorm, RMSNorm"),
    (["train.manual_gc_interval=-1"], "train.manual_gc_interval=-1 must not be negative"),
    (["model.transformer_impl=te"], "model.transformer_impl expects one of auto, "
     "transformer_engine, local, got 'te'"),
    (["model.hidden_size=66"], "model.hidden_size=66 is not divisible by "
     "model.num_attention_heads=4"),
    (["model.num_attention_heads=3", "model.kv_channels=16"],
     "model.num_attention_heads=3 is not divisible by parallel.tensor=2"),
    (["model.num_query_groups=3"], "model.num_query_groups=3 (KV heads) and "
     "parallel.tensor=2 must divide one another"),
    # hybrid models
    (["recipe=hybrid_tiny_dp1", "model.hybrid_layer_pattern=M*-xE-"],
     "has the unknown symbol 'x'"),
    (["recipe=hybrid_tiny_dp1", "model.hybrid_layer_pattern=M*-ME-/"],
     "has an empty MTP depth ('/' with no layers after it)"),
    # Nemotron 3 Super's features: MTP depths after '/', their settings, a latent MoE
    (["recipe=super_tiny_dp1", "model.hybrid_layer_pattern=MEM*EME/*E/E*"],
     "has MTP depths of different layers (*E, E*)"),
    (["recipe=super_tiny_pp2", "model.hybrid_layer_pattern=MEM*|EME/*|E/*|E"],
     "cuts an MTP depth with '|'; MTP layers all live on the last pipeline stage"),
    (["recipe=super_tiny_dp1", "model.mtp_loss_scaling_factor=-0.3"],
     "model.mtp_loss_scaling_factor=-0.3 must be positive"),
    (["recipe=hybrid_tiny_dp1", "model.mtp_use_repeated_layer=true"],
     "model.mtp_use_repeated_layer=True needs MTP depths"),
    (["recipe=super_tiny_dp1", "model.mtp_loss_scaling_factor=nan"],
     "model.mtp_loss_scaling_factor=nan must be a finite number"),
    (["recipe=super_tiny_dp1", "parallel.context=2", "cluster.gpus_per_node=2",
      "data.source=blend", "data.blend=x.yaml", "data.documents=packed",
      "train.micro_batch_size=1"],
     "MTP depths with data.documents=packed (packed rows) and parallel.context=2"),
    (["recipe=super_tiny_dp1", "model.moe_latent_size=0"],
     "model.moe_latent_size=0 must be at least 1"),
    (["recipe=super_tiny_dp1", "model.moe_latent_size=128"],
     "model.moe_latent_size=128 is not below model.hidden_size=64"),
    (["recipe=tiny_dp1", "model.moe_latent_size=32"],
     "model.moe_latent_size=32 needs an MoE model"),
    (["recipe=mixtral_tiny_ep2_dp2", "model.moe_router_topk=1"],
     "model.moe_router_topk=1 with model.moe_router_score_function=softmax gives the router"),
    (["recipe=hybrid_tiny_dp1", "model.num_layers=8"],
     "model.hybrid_layer_pattern has 6 layers but model.num_layers=8"),
    (["recipe=hybrid_tiny_pp2_pipes", "parallel.pipeline=1", "cluster.gpus_per_node=1"],
     "has 2 '|' segments but PP1 needs 1"),
    (["recipe=hybrid_tiny_pp2", "parallel.virtual_pipeline=2", "model.num_layers=4",
      "model.hybrid_layer_pattern=M*ME"], "with a hybrid model needs '|'"),
    (["recipe=hybrid_tiny_tp2_sp", "model.mamba_num_groups=1"],
     "model.mamba_num_groups=1 is not divisible by parallel.tensor=2"),
    (["recipe=hybrid_tiny_tp2_sp", "parallel.sequence_parallel=false"],
     "MoE with parallel.tensor=2 needs sequence parallel"),
    (["recipe=hybrid_tiny_dp1", "model.mamba_state_dim=0"], "model.mamba_state_dim=0 must be "
     "at least 1"),
    (["recipe=hybrid_tiny_dp1", "model.mamba_conv_kernel=-1"],
     "model.mamba_conv_kernel=-1 must be at least 1"),
    (["recipe=hybrid_tiny_dp1", "model.moe_router_score_function=softmax"],
     "needs model.moe_router_score_function=sigmoid"),
    (["recipe=hybrid_tiny_dp1", "model.moe_load_balancing=global"],
     "model.moe_load_balancing expects one of aux_loss, seq_aux_loss, got 'global'"),
    (["model.rotary_percent=1.5"], "model.rotary_percent=1.5 must be in (0, 1], the share of "
     "each head's channels RoPE rotates"),
    (["recipe=hybrid_tiny_dp1", "model.rotary_percent=0.5"], "model.rotary_percent=0.5 only "
     "applies to RoPE, but model.position_embedding=none"),
    (["model.rotary_percent=0.2"], "model.rotary_percent=0.2 rotates 3 of a head's 16 channels; "
     "RoPE turns channel pairs"),
    (["model.layernorm_zero_centered_gamma=true", "model.transformer_impl=local"],
     "model.layernorm_zero_centered_gamma=true needs Transformer Engine's norms, but "
     "model.transformer_impl=local builds torch's"),
    (["model.vocab_size=100"], "model.vocab_size=100 is smaller than the byte tokenizer's 256"),
    (["model.hidden_dropout=1.5"], "model.hidden_dropout=1.5 must be in [0, 1)"),
    (["model.init_method_std=nan"], "model.init_method_std=nan must be a finite number"),
    (["model.num_moe_experts=2"], "set model.add_bias_linear=false"),
    (["model.hiden_size=64"], "unknown config key 'model.hiden_size'; did you mean "
     "model.hidden_size"),
    (["model.hidden_size.x=3"], "model.hidden_size is a value, not a section"),
    (["model.kv_channels="], "model.kv_channels is empty; give it a value (an integer), or "
     "model.kv_channels=null"),
    # parallel
    (["parallel.tensor=0"], "parallel.tensor=0 must be at least 1"),
    (["parallel.tensor=3"], "is not divisible by TP3 x PP2 x CP1 = 6"),
    (["recipe=tiny_pp2", "model.num_layers=5"], "model.num_layers=5 cannot be split evenly "
     "over PP2 model chunks"),
    (["parallel.virtual_pipeline=1"], "parallel.virtual_pipeline=1 is not interleaving"),
    (["parallel.sequence_parallel=maybe"], "parallel.sequence_parallel expects true or false, "
     "got 'maybe'"),
    (["recipe=tiny_dp2", "parallel.sequence_parallel=true"],
     "parallel.sequence_parallel=true needs parallel.tensor > 1"),
    (["recipe=tiny_dp2", "parallel.expert=2"], "parallel.expert=2 / expert_tensor need an MoE "
     "model"),
    (["recipe=tiny_pp2_vpp2", "parallel.batch_p2p_comm=true"], "set parallel.batch_p2p_comm=false"),
    (["recipe=tiny_dp2", "parallel.context=2", "model.seq_length=130"],
     "model.seq_length=130 must be divisible by 2 x parallel.context = 4"),
    (["parallel.tp=2"], "unknown config key 'parallel.tp'; did you mean parallel.tensor"),
    (["parallel.data=2"], "'parallel.data' cannot be set; data parallel size is derived"),
    # cluster
    (["cluster.gpus_per_node=6"], "world size 6 (1 node x 6) is not divisible by "
     "TP2 x PP2 x CP1 = 4"),
    (["cluster.nodes=0"], "cluster.nodes=0 must be at least 1"),
    (["cluster.gpu_memory_gib=-1"], "cluster.gpu_memory_gib=-1.0 must be positive"),
    (["cluster.gpu_memory_gib=inf"], "cluster.gpu_memory_gib=inf must be a finite number"),
    (["cluster.gpus=8"], "unknown config key 'cluster.gpus'; did you mean cluster.gpus_per_node"),
    # A world no batch of this recipe fills: named by the field set, not by the DP it gives.
    (["cluster.nodes=1000000"], "cluster.nodes=1,000,000 (x cluster.gpus_per_node=4) gives "
     "world size 4,000,000, so DP1,000,000 at TP2 x PP2 x CP1, but train.global_batch_size=8 "
     "holds 4 micro-batches of train.micro_batch_size=2: enough for DP4 at most; set "
     "cluster.nodes=4 at most"),
    # train
    (["recipe=tiny_dp2", "train.global_batch_size=6"], "train.global_batch_size=6 is not "
     "divisible by train.micro_batch_size=2 x DP2 = 4"),
    (["train.micro_batch_size=0"], "train.micro_batch_size=0 must be at least 1"),
    (["train.micro_batch_size=abc"], "train.micro_batch_size expects an integer, got 'abc' "
     "(currently train.micro_batch_size=2)"),
    (["train.recompute=partial"], "train.recompute expects one of none, full, selective"),
    (["train.eval_iters=-1"], "train.eval_iters=-1 must not be negative"),
    (["train.eval_interval=50", "train.eval_iters=0"], "train.eval_interval=50 with "
     "train.eval_iters=0 evaluates nothing"),
    (["train.train_iters=0"], "train.train_iters=0 must be at least 1"),
    (["train.lr=1e-4"], "unknown config key 'train.lr'; did you mean optimizer.lr"),
    # optimizer
    (["optimizer.lr=nan"], "optimizer.lr=nan must be a finite number (not nan or inf); set it, "
     "e.g. optimizer.lr="),
    (["optimizer.adam_eps=inf"], "optimizer.adam_eps=inf must be a finite number"),
    (["optimizer.weight_decay=-inf"], "optimizer.weight_decay=-inf must be a finite number"),
    (["optimizer.lr=0"], "optimizer.lr=0.0 must be positive"),
    (["optimizer.min_lr=1"], "optimizer.min_lr=1.0 must be between 0 and optimizer.lr"),
    (["optimizer.lr=fast"], "optimizer.lr expects a number, got 'fast'"),
    (["optimizer.lr="], "optimizer.lr is empty; give it a value, e.g. optimizer.lr="),
    (["optimizer.clip_grad=-1"], "optimizer.clip_grad=-1.0 must not be negative"),
    (["optimizer.bucket_size=0"], "optimizer.bucket_size=0 must be at least 1"),
    (["optimizer.overlap_param_gather=true"], "optimizer.overlap_param_gather=true needs the "
     "distributed optimizer"),
    (["optimizer.fsdp=zero3"], "optimizer.fsdp expects one of none, optim, optim_grads, "
     "optim_grads_params, got 'zero3'"),
    (["recipe=tiny_dp2_distopt", "optimizer.fsdp=optim_grads_params", "parallel.pipeline=2",
      "cluster.gpus_per_node=4"], "Megatron FSDP's device mesh spans DP x CP x EP x TP only"),
    (["recipe=tiny_dp2_fsdp", "checkpoint.async_save=true"], "checkpoint.async_save=true with "
     "optimizer.fsdp=optim_grads_params: Megatron FSDP's fsdp_dtensor checkpoints are written "
     "synchronously here"),
    (["recipe=tiny_dp2_fsdp", "checkpoint.optimizer_format=fully_reshardable"],
     "checkpoint.optimizer_format=fully_reshardable is the distributed optimizer's format"),
    (["recipe=tiny_dp2_distopt", "optimizer.torch_fsdp2=true"], "optimizer.torch_fsdp2=true is "
     "not trained here"),
    (["recipe=tiny_dp2", "precision.dtype=bf16", "optimizer.cpu_offload=true"],
     "optimizer.cpu_offload=true runs Megatron's hybrid-device optimizer inside the distributed "
     "optimizer"),
    (["recipe=tiny_dp2_bf16_offload", "precision.dtype=fp32"], "cannot take the distributed "
     "optimizer's fp32 shards"),
    (["recipe=tiny_dp2_bf16_offload", "optimizer.fsdp=optim_grads"], "fails on Megatron FSDP's "
     "DTensor gradients"),
    (["recipe=tiny_dp2_bf16_offload", "optimizer.offload_fraction=2"],
     "optimizer.offload_fraction=2.0 is the share of the optimizer state moved to CPU memory"),
    # scheduler
    (["scheduler.style=step"], "scheduler.style expects one of cosine, wsd, linear, constant"),
    (["scheduler.warmup_iters=300"], "scheduler.warmup_iters=300 must be shorter than the decay "
     "span (train.train_iters=300)"),
    (["scheduler.decay_iters=5"], "must be shorter than the decay span "
     "(scheduler.decay_iters=5)"),
    (["scheduler.style=wsd", "scheduler.wsd_decay_iters=1000"], "scheduler.wsd_decay_iters=1000 "
     "is longer than the decay span"),
    (["sched.warmup_iters=5"], "there is no section 'sched' (nearest: scheduler); did you mean "
     "scheduler.warmup_iters?"),
    # precision
    (["precision.dtype=fp64"], "precision.dtype expects one of fp32, bf16, fp16, got 'fp64'"),
    (["precision.grad_reduce_in_fp32=sometimes"], "precision.grad_reduce_in_fp32 expects true "
     "or false"),
    (["precision.fp8=hybrid"], "unknown config key 'precision.fp8'; did you mean "
     "plugins.fp8.format"),
    (["precision.hysteresis=two"], "precision.hysteresis expects an integer, got 'two'"),
    (["precision.loss_scale=big"], "precision.loss_scale expects a number or null, got 'big'"),
    # data
    (["data.source=wikipedia"], "data.source expects one of python_stdlib, synthetic"),
    (["data.tokenizer=gpt2"], "data.tokenizer expects one of byte, got 'gpt2'"),
    (["data.heldout_fraction=0"], "data.heldout_fraction=0.0 must be in (0, 1)"),
    (["data.heldout_fraction=nan"], "data.heldout_fraction=nan must be a finite number"),
    (["data.max_corpus_bytes=0"], "data.max_corpus_bytes=0 must be at least 1"),
    (["data.documents=chunks"],
     "data.documents expects one of concatenate, inter_document, packed"),
    (["recipe=tiny_dp1", "data.source=blend"], "data.source=blend needs data.blend=<file>"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/no_blend.yaml"],
     "no_blend.yaml does not exist; name a blend file"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/damaged_blend.yaml"],
     "{tmp}/data/short.idx is truncated: 20 bytes, shorter than the 34-byte header; prepare "
     "{tmp}/data/short again with scripts/prepare_data.py"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/wide_blend.yaml",
      "model.vocab_size=4096"], "prefix {tmp}/data/wide holds token id 8,191 (largest of 3 "
     "tokens looked at), but the blend's vocab_size is 4,096"),
    # checkpoint
    (["checkpoint.load_model_only=true"], "checkpoint.load_model_only=true needs a checkpoint"),
    (["checkpoint.async_save=true", "checkpoint.save=false"],
     "checkpoint.async_save=true writes checkpoints in the background, but checkpoint.save=false"),
    (["checkpoint.async_save=maybe"], "checkpoint.async_save"),
    (["checkpoint.load="], "checkpoint.load is empty; give it a value (a string), or "
     "checkpoint.load=null to leave it unset"),
    (["checkpoint.load=''"], "checkpoint.load='' is empty; give it a value, or "
     "checkpoint.load=null"),
    (["checkpoint.save_interval=-5"], "checkpoint.save_interval=-5 must not be negative"),
    (["checkpoint.optimizer_format=zero3"], "checkpoint.optimizer_format expects one of "
     "fully_reshardable, dp_reshardable"),
    (["checkpoint.load={tmp}/missing"], "checkpoint.load={tmp}/missing does not exist; point it "
     "at a saved checkpoint"),
    (["checkpoint.load=~/no-such-checkpoint-dir"], "(~ is not expanded; write the full path)"),
    (["checkpoint.load={tmp}/a_file.txt"], "checkpoint.load={tmp}/a_file.txt is a file, not a "
     "checkpoint directory"),
    (["checkpoint.load={tmp}/ckpt/metadata.json"], "is a file, not a checkpoint directory; set "
     "checkpoint.load={tmp}/ckpt"),
    (["checkpoint.load={tmp}/empty_dir"], "checkpoint.load={tmp}/empty_dir is an empty "
     "directory"),
    (["cluster.spec={tmp}/empty_dir"], "cluster.spec={tmp}/empty_dir is a folder, not a file; "
     "name a cluster file"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/empty_dir"],
     "data.blend={tmp}/empty_dir is a folder, not a file; name a blend file"),
    (["cluster.spec={tmp}/missing.yaml"], "cluster.spec={tmp}/missing.yaml does not exist; name "
     "a cluster file"),
    (["checkpoint.load={tmp}/not_ckpt"], "checkpoint.load={tmp}/not_ckpt is not a Megatron "
     "checkpoint (no metadata.json, no latest file and no latest_checkpointed_iteration.txt)"),
    # Megatron-LM's layout (latest_checkpointed_iteration.txt, iter_NNNNNNN)
    (["checkpoint.load={tmp}/mlm_bad_tracker"], "its latest_checkpointed_iteration.txt file "
     "names no step ('')"),
    (["checkpoint.load={tmp}/mlm_missing_iter"], "latest_checkpointed_iteration.txt names "
     "iter_0000010, but {tmp}/mlm_missing_iter/iter_0000010 does not exist"),
    (["checkpoint.load={tmp}/mlm_legacy"], "checkpoint.load={tmp}/mlm_legacy is a Megatron-LM "
     "checkpoint in the older torch format (mp_rank_* files)"),
    (["checkpoint.load={tmp}/mlm_dcp"], "checkpoint.load={tmp}/mlm_dcp is a torch DCP checkpoint "
     "without Megatron's metadata.json (Megatron-LM's torch_dcp or fsdp_dtensor format)"),
    (["checkpoint.format=megatron"], "checkpoint.format expects one of mcore_recipes, "
     "megatron_lm, got 'megatron'"),
    (["checkpoint.format=megatron_lm", "checkpoint.save=false"], "checkpoint.format=megatron_lm "
     "writes checkpoints Megatron-LM resumes, but checkpoint.save=false writes none"),
    (["checkpoint.load={tmp}/run"], "checkpoint.load={tmp}/run is a run directory, not a "
     "checkpoint; set checkpoint.load={tmp}/run/checkpoints"),
    (["checkpoint.load={tmp}/bad_latest"], "latest names step_0000300, but "
     "{tmp}/bad_latest/step_0000300 does not exist"),
    # A root whose `latest` is broken but which holds a complete step resumes from that step
    # (tests/unit/test_checkpoint_publication.py); only a root with no complete step is refused.
    (["checkpoint.load={tmp}/unfinished"], "{tmp}/unfinished/step_0000300 has no metadata.json "
     "(an unfinished save?) and no other step is complete; point checkpoint.load at another "
     "checkpoint or set checkpoint.load=null"),
    (["checkpoint.load={tmp}/empty_latest"], "its latest file names no step"),
    (["checkpoint.load={tmp}/tmp_only"], "checkpoint.load={tmp}/tmp_only holds no complete "
     "checkpoint, only unfinished saves (step_0000100.tmp-100-ab12); point checkpoint.load at "
     "another checkpoint or set checkpoint.load=null"),
    (["ckpt.load=/x"], "there is no section 'ckpt' (nearest: checkpoint); did you mean "
     "checkpoint.load?"),
    # logging
    (["logging.log_interval=0"], "logging.log_interval=0 must be at least 1"),
    (["logging.progress_bar=sometimes"], "logging.progress_bar expects true or false"),
    (["logging.log_intervl=5"], "unknown config key 'logging.log_intervl'; did you mean "
     "logging.log_interval"),
    (["logging.metrics_file=false"], "logging.metrics_file was removed: every run writes "
     "metrics.jsonl"),
    # cluster: where ranks compute
    (["cluster.threads_per_rank=0"], "cluster.threads_per_rank=0 must be at least 1"),
    (["cluster.device=maybe"], "cluster.device expects one of auto, gpu, cpu, got 'maybe'"),
    (["cpu_runtime.device=cpu"], "there is no section 'cpu_runtime' (nearest: cluster); did you "
     "mean cluster.device?"),
    (["plugins.cpu_runtime.enabled=on"], "plugins.cpu_runtime.enabled was moved: where ranks "
     "compute is cluster.device (auto, gpu or cpu; on was cpu, off was gpu); set cluster.device "
     "instead"),
    # plugins.packing: on exactly when data.documents makes packed rows; its switch is gone
    (["plugins.packing.enabled=true"], "override 'plugins.packing.enabled=true': "
     "plugins.packing.enabled was removed: packing follows data.documents (on for "
     "data.documents=packed or inter_document on a blend); delete the key, and set "
     "data.documents=packed to train on packed rows"),
    (["plugins.packing=true"], "'plugins.packing' is a section with no settings"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend=x.yaml", "data.documents=packed"],
     "data.documents=packed makes packed rows, which need train.micro_batch_size=1"),
    # plugins.moe: on exactly for a model with experts; its switch is gone
    (["plugins.moe.enabled=true"], "plugins.moe.enabled was removed: the router figures follow "
     "model.num_moe_experts (on for every model with experts); delete the key"),
    (["plugins.moe.per_expert=maybe"], "plugins.moe.per_expert expects true or false"),
    # plugins.context_parallel
    (["recipe=tiny_cp2", "plugins.context_parallel.comm_type=ring"],
     "plugins.context_parallel.comm_type expects one of p2p, a2a, all_gather, a2a+p2p"),
    (["recipe=tiny_cp2", "plugins.context_parallel.comm_type=allgather"],
     "plugins.context_parallel.comm_type expects one of p2p, a2a, all_gather, a2a+p2p, got "
     "'allgather'"),
    (["recipe=tiny_cp4", "plugins.context_parallel.comm_type=a2a+p2p"],
     "comm_type=a2a+p2p needs plugins.context_parallel.hierarchical_sizes [a2a size, p2p size], "
     "each at least 1, whose product is parallel.context=4, got None"),
    (["recipe=tiny_cp2", "plugins.context_parallel.hierarchical_sizes=[2,1]"],
     "plugins.context_parallel.hierarchical_sizes=[2, 1] is only used with comm_type=a2a+p2p"),
    (["recipe=tiny_cp4", "plugins.context_parallel.comm_type=a2a",
      "model.num_attention_heads=2", "model.hidden_size=64"],
     "comm_type=a2a splits heads over 4 CP ranks, but model.num_attention_heads=2"),
    # plugins.fp8
    (["plugins.fp8.format=e5m2"], "plugins.fp8.format expects one of hybrid, e4m3, e2m1 or "
     "null"),
    # NVFP4, the plugin's FP4 preset
    (["plugins.fp8.format=e2m1"], "plugins.fp8.format=e2m1 (NVFP4) is scaled by "
     "plugins.fp8.recipe=nvfp4, not delayed"),
    (["plugins.fp8.format=e4m3", "plugins.fp8.recipe=nvfp4"],
     "plugins.fp8.recipe=nvfp4 scales 4-bit E2M1 values, but plugins.fp8.format=e4m3"),
    (["plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4", "model.ffn_hidden_size=272"],
     "plugins.fp8.recipe=nvfp4 needs model.ffn_hidden_size divisible by 32, got 272"),
    (["plugins.fp8.format=hybrid", "model.ffn_hidden_size=200"], "plugins.fp8.format=hybrid "
     "needs model.ffn_hidden_size divisible by 16, got 200"),
    (["fp8.format=hybrid"], "there is no section 'fp8' (nearest: plugins.fp8); did you mean "
     "plugins.fp8.format"),
    (["plugins.fp8=hybrid"], "'plugins.fp8' is a section, not a value"),
    (["plugins.fp8.recipe=fp8"], "plugins.fp8.recipe expects one of delayed, tensorwise, "
     "blockwise, mxfp8, nvfp4, got 'fp8'"),
    (["plugins.fp8.amax_compute_algo=mean"], "plugins.fp8.amax_compute_algo expects one of max, "
     "most_recent"),
    (["plugins.fp8.recipe=mxfp8"], "plugins.fp8.recipe=mxfp8 has no effect while "
     "plugins.fp8.format=null; turn FP8 on with plugins.fp8.format=hybrid"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.first_layers_bf16=1"],
     "plugins.fp8.first_layers_bf16=1 cannot be used with plugins.fp8.recipe=delayed"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise", "plugins.fp8.margin=2"],
     "plugins.fp8.margin=2 is read only by delayed scaling, but plugins.fp8.recipe=tensorwise"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.amax_history_len=0"],
     "plugins.fp8.amax_history_len=0 must be at least 1"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.last_layers_bf16=3"], "plugins.fp8.last_layers_bf16=3 exceeds the 2 layers of "
     "one pipeline stage (model.num_layers=4 / parallel.pipeline=2); lower it to 2 or less"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.first_layers_bf16=2", "plugins.fp8.last_layers_bf16=2"],
     "keep all 4 layers in bf16, so nothing trains in FP8"),
    (["plugins.fp8.param_gather=true"], "plugins.fp8.param_gather=True has no effect while "
     "plugins.fp8.format=null"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.param_gather=true"],
     "plugins.fp8.param_gather=true keeps the weights in FP8 and refreshes them from the "
     "distributed optimizer's fp32 shards, but optimizer.distributed=false"),
    (["plugins.fp8.format=hybrid", "plugins.fp8.recipe=mxfp8", "model.ffn_hidden_size=272"],
     "plugins.fp8.recipe=mxfp8 needs model.ffn_hidden_size divisible by 32, got 272"),
    (["plugins.zz=1"],
     "unknown config key 'plugins.zz'; section plugins has fp8, packing, context_parallel, "
     "moe"),
    # top-level keys
    (["dry_run=perhaps"], "dry_run expects true or false, got 'perhaps'"),
    (["name="], "name is empty; give it a value, e.g. name=stdlib_bpe_tp2_pp2"),
    (["output_dir="], "output_dir is empty; give it a value, e.g. output_dir=runs"),
    (["output_dir=' '"], "output_dir=' ' is empty"),
    (["run_dir="], "run_dir is empty; give it a value (a string), or run_dir=null"),
    (["output_dir={tmp}/a_file.txt"], "output_dir={tmp}/a_file.txt is a file, not a directory"),
    (["output_dir={tmp}/a_file.txt/runs"], "output_dir={tmp}/a_file.txt/runs cannot be created: "
     "{tmp}/a_file.txt is a file"),
    (["run_dir={tmp}/a_file.txt"], "run_dir={tmp}/a_file.txt is a file, not a directory; set "
     "run_dir to a writable directory, or run_dir=null"),
    (["output_dir=/proc/nope"], "output_dir=/proc/nope cannot be created (under /proc: "),
    (["run_dir=/proc/nope/run"], "run_dir=/proc/nope/run cannot be created (under /proc: "),
    (["model=3"], "'model' is a section, not a value; set one of its fields"),
    (["modle=3"], "unknown config key 'modle'; did you mean the section model?"),
    # sections that do not exist
    (["modle.hidden_size=8"], "there is no section 'modle' (nearest: model); did you mean "
     "model.hidden_size?"),
    (["foo.bar=1"], f"there is no section 'foo'; the sections are {SECTIONS}"),
    (["plugin.fp8.format=hybrid"], "there is no section 'plugin'"),
    # recipe= and config= mistakes
    (["recipe=tiny_dp3"], "unknown recipe 'tiny_dp3'; did you mean tiny_dp2"),
    (["recipe="], "recipe= is empty; give it a value, e.g. recipe=tiny_dp1"),
    (["recipe=tiny_dp1", "recipe=tiny_dp2"], "recipe= given twice (tiny_dp1, tiny_dp2); keep one"),
    (["recipe=tiny_dp1", "config=x.yaml"], "give either recipe=tiny_dp1 or config=x.yaml, not "
     "both"),
    (["config="], "config= is empty; give it a value, e.g. config=runs/<run>/config.yaml"),
    (["config={tmp}/missing.yaml"], "config file {tmp}/missing.yaml does not exist; pass a saved "
     "config"),
    (["config={tmp}/empty_dir"], "config file {tmp}/empty_dir is a directory, not a file"),
    (["config={tmp}/run"], "is a directory, not a file; pass the file, e.g. "
     "config={tmp}/run/config.yaml"),
    (["config={tmp}/bad.yaml"], "config file {tmp}/bad.yaml is not valid YAML at line 2"),
    (["config={tmp}/twice.yaml"], "config file {tmp}/twice.yaml: key 'train_iters' is given twice "
     "(line 3); keep one"),
    (["config={tmp}/list.yaml"], "must hold a mapping of config sections, not a list"),
    (["config={tmp}/empty.yaml"], "config file {tmp}/empty.yaml is empty"),
    (["config={tmp}/modle.yaml"], "config file {tmp}/modle.yaml: there is no section 'modle'"),
    (["config={tmp}/typo.yaml"], "config file {tmp}/typo.yaml: unknown config key "
     "'train.micro_batch'"),
    (["config={tmp}/nan.yaml"], "optimizer.lr=nan must be a finite number"),
    # phases
    (["recipe=tiny_dp1", "phases=[{name: a, tokenz: 1.0}]"], "a phase has no field 'tokenz'; "
     "did you mean tokens?"),
    (["recipe=tiny_dp1", "phases=[{name: a, tokens: lots}]"], "a phase's tokens expects a "
     "number or null, got 'lots'"),
    (["recipe=tiny_dp1", "phases=[{name: a, tokens: 0.6}, {name: b, tokens: 0.6}]"],
     "phases' token shares add up to 1.2, not 1"),
    (["recipe=tiny_dp1", "phases=[{name: a, end_step: 100}]"], "the last phase ends at step "
     "100 but the run has train.train_iters=300"),
    (["recipe=tiny_dp1", "phases=[{name: a, end_step: 100}, {name: b, end_step: 300, "
      "context: 2}]"], "phases[1] (b): changing context (1 -> 2) needs a new launch"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/ok_blend.yaml",
      "phases=[{name: a, end_step: 100}, {name: b, end_step: 300, "
      "blend: {tmp}/no_phase_blend.yaml}]"],
     "phases[1] (b): data.blend={tmp}/no_phase_blend.yaml does not exist"),
    (["recipe=tiny_dp1", "data.source=blend", "data.blend={tmp}/few_blend.yaml"],
     "has 5 documents, too few for its held-out share (split 95/5 gives it 0; Megatron's "
     "dataset builder would wait forever)"),
    (["recipe=tiny_dp1", "checkpoint.save=false", "phases=[{name: a, end_step: 100, "
      "seq_length: 128}, {name: b, end_step: 300, seq_length: 256, relaunch: true}]"],
     "phases with relaunch: true continue from the checkpoint the launch before saves"),
    (["recipe=tiny_dp2_distopt", "phases=[{name: a, end_step: 100, seq_length: 128}, "
      "{name: b, end_step: 300, seq_length: 256, context: 2, relaunch: true}]"],
     "set checkpoint.optimizer_format=fully_reshardable"),
    # values torch or Megatron refuse only on the ranks, with a traceback
    (["recipe=tiny_dp1", "optimizer.adam_beta1=1.5"],
     "optimizer.adam_beta1=1.5 must be in [0, 1)"),
    (["recipe=tiny_dp1", "optimizer.adam_beta2=1.5"],
     "optimizer.adam_beta2=1.5 must be in [0, 1)"),
    (["recipe=tiny_dp1", "optimizer.adam_eps=-1"], "optimizer.adam_eps=-1 must be positive"),
    (["recipe=tiny_dp1", "model.init_method_std=-0.02"],
     "model.init_method_std=-0.02 must be positive"),
    (["recipe=tiny_dp1", "train.seed=-5"], "train.seed=-5 must be between 0 and 4,294,967,295"),
    (["recipe=tiny_dp1", "train.seed=99999999999"],
     "train.seed=99999999999 must be between 0 and 4,294,967,295"),
    (["recipe=tiny_dp1", "model.rope_scaling_factor=-8"],
     "model.rope_scaling_factor=-8 must be positive"),
    # counts below what they count
    (["recipe=tiny_dp1", "train.cuda_graphs=transformer_engine",
      "train.cuda_graph_warmup_steps=-1"],
     "train.cuda_graph_warmup_steps=-1 must not be negative"),
    (["recipe=tiny_dp1", "plugins.profiler.start_step=-1"],
     "plugins.profiler.start_step=-1 must be at least 1"),
    (["recipe=tiny_dp1", "plugins.profiler.steps=0"],
     "plugins.profiler.steps=0 must be at least 1"),
    # malformed command lines
    (["--lr", "1"], "'--lr' is not an override; write KEY=VALUE without dashes"),
    (["a.b", "=", "c"], "'a.b' is not an override; write KEY=VALUE with no spaces around '='"),
    (["tp=2"], "unknown config key 'tp'; did you mean parallel.tensor?"),
    (["dp=2"], "'dp' cannot be set; data parallel size is derived"),
    (["gbs=16"], "unknown config key 'gbs'; did you mean train.global_batch_size"),
    (["recipe=llama3_8b_tp8_dp8"], "llama3_8b_tp8_dp8 runs on 8 nodes but data.source="
     "python_stdlib is the built-in demo corpus; train on prepared data: data.source=blend"),
    (["tiny_dp1"], "'tiny_dp1' is not an override; write KEY=VALUE"),
    (["model..hidden_size=3"], "the key 'model..hidden_size' has an empty part between dots"),
    (["model.hidden_size=[1,"], "cannot parse the value '[1,'"),
    (["optimizer.lr=${foo}"], "cannot resolve 'optimizer.lr'"),
    # GPU fast paths: types, then every combination Megatron or Transformer Engine would assert
    # on at run time (one case per rule, tests/unit/test_fast_path_rules.py)
    (["model.moe_flex_backend=ncclep"], "model.moe_flex_backend expects one of deepep, "
     "hybridep, got 'ncclep'"),
    (["train.cuda_graphs=full_iteration"], "train.cuda_graphs expects one of none, "
     "transformer_engine, local, got 'full_iteration'"),
    (["train.recompute_modules=moe"], "train.recompute_modules expects a list of strings"),
    (["phases={}"], "phases is a list; write e.g. phases=[{name: general, tokens: 0.8}"),
    (["train.rampup_batch_size=[a,b,c]"], "train.rampup_batch_size[0] expects an integer, got "
     "'a'; write e.g. train.rampup_batch_size=[32,32,1000]"),
    *FAST_PATH_BAD_INPUTS,
]


# (script, argv, texts the one-line message must contain, in order), refused before launch.
BAD_LAUNCHES: list[tuple[str, list[str], list[str]]] = [
    # A sequence no machine holds: the field, the need in a readable unit, the longest that fits.
    ("pretrain.py", ["model.seq_length=1000000000000"], [
        "model.seq_length=1000000000000 needs 6.4e+16 GB on a rank of pipeline stage 0 but a "
        "rank has ", "and no machine can hold it (a 64-bit process addresses at most 1.8e+10 GB)",
        "at this layout model.seq_length=", " fits at most, or split each sequence over more "
        "ranks (parallel.context, or parallel.tensor with parallel.sequence_parallel=true)"]),
    # LayerNorm1p exists in Transformer Engine's norms only; these ranks run on CPU.
    ("pretrain.py", ["recipe=tiny_dp1", "model.layernorm_zero_centered_gamma=true"],
     ["model.layernorm_zero_centered_gamma=true needs Transformer Engine's norms on GPU ranks, "
      "but this run's ranks are on CPU"]),
    # NVFP4 needs Blackwell GPUs; these ranks run on CPU.
    ("pretrain.py", ["recipe=super_tiny_dp1", "precision.dtype=bf16", "plugins.fp8.format=e2m1",
                     "plugins.fp8.recipe=nvfp4", "model.hidden_size=64"],
     ["plugins.fp8.format=e2m1 needs CUDA GPUs (Transformer Engine's NVFP4 GEMMs, on "
      "Blackwell), but this run would train on the CPU runtime"]),
    # The built-in demo corpus on the 2 nodes the cluster file gives a 1-node recipe's 4 ranks.
    ("launch.py", ["recipe=tiny_tp2_pp2", "cluster=conf/cluster/cpu_slurm_2x2.yaml"],
     ["tiny_tp2_pp2 runs on 2 nodes but data.source=python_stdlib is the built-in demo corpus; "
      "train on prepared data: data.source=blend"]),
    ("launch.py", ["recipe=tiny_tp2_pp2", "cluster=conf/cluster/cpu_slurm_2x2.yaml",
                   "--dry-run"], ["tiny_tp2_pp2 runs on 2 nodes but data.source=python_stdlib"]),
    ("pretrain.py", ["recipe=tiny_dp2", "cluster.nodes=2", "cluster.gpus_per_node=1"],
     ["tiny_dp2 runs on 2 nodes but data.source=python_stdlib is the built-in demo corpus"]),
    # Megatron-LM's release checkpoint holds weights only: a full resume is refused.
    ("pretrain.py", ["recipe=tiny_dp1", "checkpoint.load={tmp}/mlm_release"],
     ["checkpoint.load={tmp}/mlm_release resumes from Megatron-LM's release checkpoint, which "
      "holds weights only (no step, optimizer or schedule); start from its weights with "
      "checkpoint.load_model_only=true"]),
    # What the parity check cannot compare, refused before its ranks start.
    ("check_megatron_parity.py", ["recipe=tiny_dp1", "train.global_batch_size=16",
                                  "train.rampup_batch_size=[4,4,24]"],
     ["check_megatron_parity runs one phase at one batch size; drop phases and "
      "train.rampup_batch_size"]),
    # A checkpoint in the format the other kind of run writes (Megatron FSDP's fsdp_dtensor).
    ("pretrain.py", ["recipe=tiny_dp2_distopt", "checkpoint.load={tmp}/fsdp_ckpt"],
     ["checkpoint.load={tmp}/fsdp_ckpt cannot be loaded by this run: it was saved fsdp_dtensor "
      "by Megatron FSDP (optimizer.fsdp=optim_grads_params), which only a Megatron FSDP run "
      "reads; resume with optimizer.fsdp=optim_grads_params"]),
    ("pretrain.py", ["recipe=tiny_dp2_distopt", "checkpoint.load={tmp}/fsdp_ckpt",
                     "checkpoint.load_model_only=true"], ["which only a Megatron FSDP run reads"]),
    ("pretrain.py", ["recipe=tiny_dp2_fsdp", "checkpoint.load={tmp}/distopt_ckpt"],
     ["checkpoint.load={tmp}/distopt_ckpt cannot be loaded by this run: it was saved torch_dist "
      "(optimizer.fsdp=none) and Megatron FSDP (optimizer.fsdp=optim_grads_params) resumes only "
      "fsdp_dtensor; resume with optimizer.fsdp=none, or start from its weights with "
      "checkpoint.load_model_only=true"]),
]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _checkpoint(path: Path, backend: str = "torch_dist", fsdp: str | None = None) -> None:
    """A finished Megatron checkpoint directory, as far as the path rules look; with `fsdp`, the
    `run.json` of a distributed-optimizer run at that Megatron FSDP level (the pre-flight's)."""
    _write(path / "metadata.json", f'{{"sharded_backend": "{backend}"}}')
    if fsdp is None:
        return
    import json

    from trainer.checkpoint.manifest import file_record

    manifest = {"format": 1, "step": 2, "consumed_samples": 16, "consumed_tokens": 2000,
                "world_size": 2, "layout": {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1,
                                            "dp": 2},
                "versions": {}, "files": {"metadata.json": file_record(path / "metadata.json")},
                "config": {"optimizer": {"distributed": True, "fsdp": fsdp}}}
    _write(path / "run.json", json.dumps(manifest))


@pytest.fixture(scope="module")
def paths_dir(tmp_path_factory) -> Path:
    """Files, broken checkpoints and config files the table names as `{tmp}/...`. The default
    recipe's blend is prepared first, as the entry pipeline would before the path rules: the
    rules after the data's (the cluster file's) must not depend on an earlier test having made
    it."""
    from data_prep.blend_prepare import prepare_missing_data
    from recipes.resolve import build_config

    prepare_missing_data(build_config([]))
    tmp = tmp_path_factory.mktemp("bad_inputs")
    _write(tmp / "a_file.txt", "not a directory\n")
    (tmp / "empty_dir").mkdir()
    _write(tmp / "not_ckpt" / "notes.txt", "hello\n")
    _checkpoint(tmp / "ckpt")
    _write(tmp / "run" / "config.yaml", "name: tiny_tp2_pp2\n")
    _checkpoint(tmp / "run" / "checkpoints" / "step_0000300")
    _write(tmp / "run" / "checkpoints" / "latest", "step_0000300")
    _write(tmp / "bad_latest" / "latest", "step_0000300\n")
    _write(tmp / "unfinished" / "latest", "step_0000300")
    (tmp / "unfinished" / "step_0000300").mkdir()
    _write(tmp / "empty_latest" / "latest", "")
    _checkpoint(tmp / "tmp_only" / "step_0000100.tmp-100-ab12")  # a crash before the rename
    _write(tmp / "mlm_bad_tracker" / "latest_checkpointed_iteration.txt", "ten")
    _write(tmp / "mlm_missing_iter" / "latest_checkpointed_iteration.txt", "10")
    _write(tmp / "mlm_legacy" / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt", "")
    _write(tmp / "mlm_legacy" / "latest_checkpointed_iteration.txt", "10")
    _write(tmp / "mlm_dcp" / "iter_0000010" / ".metadata", "")
    _write(tmp / "mlm_dcp" / "iter_0000010" / "__0_0.distcp", "")
    _checkpoint(tmp / "mlm_release" / "release")
    _write(tmp / "mlm_release" / "latest_checkpointed_iteration.txt", "release")
    _checkpoint(tmp / "fsdp_ckpt", "fsdp_dtensor", "optim_grads_params")
    _checkpoint(tmp / "distopt_ckpt", "torch_dist", "none")
    _write(tmp / "bad.yaml", "model: [\n")
    _write(tmp / "twice.yaml", "train:\n  train_iters: 5\n  train_iters: 6\n")
    _write(tmp / "list.yaml", "- 1\n- 2\n")
    _write(tmp / "empty.yaml", "")
    _write(tmp / "modle.yaml", "modle:\n  hidden_size: 8\n")
    _write(tmp / "typo.yaml", "train:\n  micro_batch: 2\n")
    _write(tmp / "nan.yaml", "optimizer:\n  lr: .nan\n")
    (tmp / "data").mkdir()
    short = write_dataset(tmp / "data" / "short", [[1, 2, 0]])
    with open(f"{short}.idx", "r+b") as index:
        index.truncate(20)
    _write(tmp / "damaged_blend.yaml", f"train:\n  - {{prefix: {short}}}\neod_id: 0\n"
           "vocab_size: 256\n")
    wide = write_dataset(tmp / "data" / "wide", [[5, 8191, 0]])
    _write(tmp / "wide_blend.yaml", f"train:\n  - {{prefix: {wide}}}\neod_id: 0\n"
           "vocab_size: 4096\n")
    # whole, 20 documents (one held out at 95/5): only the phases are wrong
    ok = write_dataset(tmp / "data" / "ds", [[1, 2, 0]] * 20)
    few = write_dataset(tmp / "data" / "few", [[1, 2, 0]] * 5)  # 95/5 holds none out
    _write(tmp / "few_blend.yaml", f"train: [{{prefix: {few}}}]\neod_id: 0\nvocab_size: 256\n")
    _write(tmp / "ok_blend.yaml", f"train: [{{prefix: {ok}}}]\neod_id: 0\nvocab_size: 256\n")
    return tmp


def _fill(texts: list[str], tmp: Path) -> list[str]:
    return [text.replace("{tmp}", str(tmp)) for text in texts]


def test_table_is_large_distinct_and_covers_every_section() -> None:
    argvs = [tuple(argv) for argv, _ in BAD_INPUTS]
    assert len(argvs) >= 60 and len(set(argvs)) == len(argvs)
    text = " ".join(" ".join(argv) for argv in argvs)
    for section in SECTIONS.split(", "):
        assert f"{section}." in text, section
    for kind in ("recipe=", "config=", "=nan", "=inf", "output_dir=", "run_dir=", "dry_run="):
        assert kind in text, kind


@pytest.mark.parametrize(
    ("argv", "expected"), BAD_INPUTS, ids=[" ".join(argv) for argv, _ in BAD_INPUTS]
)
def test_bad_input_is_one_line_naming_the_fix(argv, expected, paths_dir) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_paths(resolve_config(_fill(argv, paths_dir)))
    # every mistake the input makes is said, each in one line (error_lines: what is printed)
    lines = error_lines(caught.value)
    assert any(_fill([expected], paths_dir)[0] in line for line in lines)
    assert all("\n" not in line and line.strip() == line for line in lines)


def _plan_the_launch(script: str, argv: list[str], tmp: Path) -> None:
    """What the launching process of `script` checks before it starts anything (on CPU ranks:
    the fit is planned against this machine's memory)."""
    from trainer.entry.commands import CHECK_MEGATRON_PARITY, LAUNCH, PRETRAIN
    from trainer.entry.contract import parse_arguments

    if script == "check_megatron_parity.py":  # the command's own check, then the launcher's
        args = parse_arguments(CHECK_MEGATRON_PARITY, [*argv, f"output_dir={tmp / 'runs'}"])
        CHECK_MEGATRON_PARITY.run.check(args)
    if script == "launch.py":
        from trainer.launch.cluster import launch_args, plan_launch

        args = parse_arguments(LAUNCH, [*argv, f"job_dir={tmp / 'jobs'}"])
        plan_launch(launch_args(args.options, args.flags, args.rest))
        return
    from trainer.entry.pipeline import ready_to_launch, resolve

    command = CHECK_MEGATRON_PARITY if script == "check_megatron_parity.py" else PRETRAIN
    args = parse_arguments(command, [*argv, f"output_dir={tmp / 'runs'}"])
    ready_to_launch(resolve(args), args)


@pytest.mark.parametrize(("script", "argv", "expected"), BAD_LAUNCHES,
                         ids=[f"{script} {' '.join(argv)}" for script, argv, _ in BAD_LAUNCHES])
def test_bad_launch_is_one_line_before_anything_starts(script, argv, expected, paths_dir,
                                                       tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU ranks: the machine these lines name
    with pytest.raises(ConfigError) as caught:
        _plan_the_launch(script, _fill(argv, paths_dir), tmp_path)
    message = str(caught.value)
    found = [message.find(text) for text in _fill(expected, paths_dir)]
    assert -1 not in found and found == sorted(found), message
    assert "\n" not in message and message.strip() == message
    assert not (tmp_path / "runs").exists() and not (tmp_path / "jobs").exists()


def test_output_dir_that_cannot_be_written_is_named(tmp_path, monkeypatch) -> None:
    # Root may write anywhere a mode bit forbids, so the refusal of the probe file is stubbed.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("recipes.config.path_rules.tempfile.mkstemp", refuse)
    cfg = get_recipe("tiny_dp1")
    cfg.output_dir = str(tmp_path / "new" / "runs")
    message = check_output_dir(cfg)
    assert message == (
        f"output_dir={tmp_path}/new/runs cannot be created (under {tmp_path}: Permission "
        f"denied); set output_dir to a writable directory, e.g. output_dir={Path.home() / 'runs'}"
    )
    assert not (tmp_path / "new").exists()  # the attempt leaves nothing behind
    cfg.output_dir = str(tmp_path)
    assert check_output_dir(cfg).startswith(f"output_dir={tmp_path} cannot be written (it: ")


@pytest.mark.parametrize("key", ["output_dir", "run_dir"])
def test_directory_under_proc_is_refused_by_trying_to_create_it(key) -> None:
    # os.access says root may write /proc; creating /proc/nope fails, and that is the answer.
    assert os.access("/proc", os.W_OK) or os.geteuid() != 0
    with pytest.raises(ConfigError) as caught:
        validate_paths(resolve_config(["recipe=tiny_dp1", f"{key}=/proc/nope"]))
    assert str(caught.value).startswith(f"{key}=/proc/nope cannot be created (under /proc: ")


def test_directory_that_can_be_created_is_left_as_it_was(tmp_path) -> None:
    cfg = get_recipe("tiny_dp1")
    cfg.output_dir = str(tmp_path / "a" / "b")
    assert check_output_dir(cfg) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "expected", "as_script"),
    [
        (["modle.hidden_size=8"], "error: override 'modle.hidden_size=8': there is no section "
         "'modle' (nearest: model); did you mean model.hidden_size?", True),
        (["optimizer.lr=nan"], "error: optimizer.lr=nan must be a finite number", False),
        (["recipe=tiny_dp1", "optimizer.adam_beta1=1.5", "print=config"],
         "error: optimizer.adam_beta1=1.5 must be in [0, 1)", False),
        (["recipe=tiny_dp1", "model.num_layers=99999999999999999999", "dry_run=true"],
         "error: dry run: the layout needs ", True),
        (["recipe=tiny_dp1", "phases={}", "print=config"],
         "error: override 'phases={}': phases is a list; write e.g. phases=[{name: general, ",
         False),
        (["plugins.packing.enabled=true"], "error: override 'plugins.packing.enabled=true': "
         "plugins.packing.enabled was removed: packing follows data.documents", False),
        (["checkpoint.load={tmp}/empty_dir"], "error: checkpoint.load={tmp}/empty_dir is an "
         "empty directory", False),
    ],
)
def test_entry_point_prints_one_error_line_and_exits_2(args, expected, as_script, paths_dir,
                                                       capsys, monkeypatch) -> None:
    """Two cases run scripts/pretrain.py itself (a parse-time and a run-time refusal: the exit
    code and stderr a shell sees); the others call the function it exits with, `main(PRETRAIN)`,
    in this process: the same line and code, without an interpreter start each (1-2 s)."""
    argv = _fill(args, paths_dir)
    if as_script:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("RANK", None)
        done = subprocess.run(
            [sys.executable, "scripts/pretrain.py", *argv],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S,
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        monkeypatch.delenv("RANK", raising=False)
        with mock.patch.dict(os.environ):  # main sets the command's environment
            code = main(PRETRAIN, argv)
        out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(_fill([expected], paths_dir)[0])
    assert "Traceback" not in err + out
