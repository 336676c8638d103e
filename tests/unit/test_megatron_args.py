"""Megatron-LM command lines out and in: every registered recipe written as pretrain_gpt.py
(a hybrid: pretrain_hybrid.py) arguments and read back through Megatron-LM's own parser equals
the recipe, field by field, except the fields listed as having no flag; unknown and
inexpressible flags and choices are refused one line each; flags that only say where things
are are named, not dropped."""

from __future__ import annotations

import dataclasses

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.megatron_args import (
    FLAGS,
    MIXER_DEFAULTS,
    SPELLED,
    command_text,
    mixer_note,
    no_flag_fields,
    to_megatron_args,
)
from recipes.config.schema import SchedulerConfig
from recipes.config.validation import validate
from recipes.plan.command import run_plan
from recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe
from trainer.entry.commands import PRETRAIN
from trainer.entry.contract import main
from trainer.tools.megatron_args import config_from_megatron_args, read_argument_file

SECTIONS = ("model", "parallel", "cluster", "train", "optimizer", "scheduler", "precision",
            "data", "checkpoint", "logging")


def _differences(cfg, back) -> list[str]:
    skip = set(no_flag_fields(cfg))
    found = []
    for section in SECTIONS:
        for f in dataclasses.fields(getattr(cfg, section)):
            key = f"{section}.{f.name}"
            mine, theirs = getattr(getattr(cfg, section), f.name), getattr(
                getattr(back, section), f.name)
            if key not in skip and mine != theirs:
                found.append(f"{key}: {mine!r} -> {theirs!r}")
    for f in dataclasses.fields(cfg.plugins.fp8):  # the one plugin Megatron-LM's flags carry
        mine, theirs = getattr(cfg.plugins.fp8, f.name), getattr(back.plugins.fp8, f.name)
        if mine != theirs:
            found.append(f"plugins.fp8.{f.name}: {mine!r} -> {theirs!r}")
    return found


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_to_megatron_args_and_back_is_the_recipe(name) -> None:
    cfg = get_recipe(name)
    cfg.phases = []  # Megatron-LM has no phases: a phased run's line is refused (below)
    back, notes = config_from_megatron_args(to_megatron_args(cfg), cfg.cluster)
    # a recipe that keeps the softmax in bf16 (the Nemotron ones) is read back so, and said
    said = ["--attention-softmax-in-fp32"] if not cfg.model.attention_softmax_in_fp32 \
        and cfg.precision.dtype != "fp32" else []
    assert _differences(cfg, back) == [] and [n.split(" ")[0] for n in notes] == said


FP8_CASES = {
    "delayed": ["plugins.fp8.format=hybrid", "plugins.fp8.amax_history_len=16",
                "plugins.fp8.amax_compute_algo=most_recent", "plugins.fp8.margin=1"],
    "nemotron_h": ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
                   "plugins.fp8.first_layers_bf16=1", "plugins.fp8.last_layers_bf16=1",
                   "plugins.fp8.param_gather=true", "optimizer.distributed=true"],
    "blockwise": ["plugins.fp8.format=e4m3", "plugins.fp8.recipe=blockwise"],
    # NVFP4: --fp4-format / --fp4-recipe / --fp4-param-gather, not the fp8 flags.
    "nvfp4": ["plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4",
              "plugins.fp8.last_layers_bf16=1", "plugins.fp8.param_gather=true",
              "optimizer.distributed=true"],
}


@pytest.mark.parametrize("case", FP8_CASES)
def test_fp8_to_megatron_args_and_back(case) -> None:
    from recipes.config.overrides import apply_overrides

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=bf16", *FP8_CASES[case]])
    args = to_megatron_args(cfg)
    fp4 = cfg.plugins.fp8.fp4
    assert ("--fp8-param-gather" in args) == (cfg.plugins.fp8.param_gather and not fp4)
    assert ("--fp4-param-gather" in args) == (cfg.plugins.fp8.param_gather and fp4)
    assert ("--fp8-format" in args) != fp4
    back, notes = config_from_megatron_args(args, cfg.cluster)
    assert _differences(cfg, back) == [] and notes == []


def test_every_field_is_carried_or_listed() -> None:
    cfg = get_recipe("llama3_8b_tp8_dp8")
    carried = {f.field for f in FLAGS} | {n for s in SPELLED for n in s.fields}
    carried.discard("data.source")  # carried only as --mock-data (synthetic data)
    listed = set(no_flag_fields(cfg))
    for section in SECTIONS:
        for f in dataclasses.fields(getattr(cfg, section)):
            key = f"{section}.{f.name}"
            assert (key in carried) != (key in listed), key


def test_a_changed_field_changes_the_arguments() -> None:
    cfg = get_recipe("tiny_dp1")
    cfg.train.recompute = "full"
    cfg.model.activation = "swiglu"
    args = to_megatron_args(cfg)
    assert "--swiglu" in args and args[args.index("--recompute-granularity") + 1] == "full"


def test_unknown_and_inexpressible_flags_are_one_line_each() -> None:
    argv = ["--num-layers", "4", "--num-layrs", "3", "--qk-layernorm", "--bogus-flag"]
    with pytest.raises(ConfigError) as error:
        config_from_megatron_args(argv)
    lines = str(error.value).split("\nerror: ")
    assert len(lines) == 3
    assert lines[0].startswith("--num-layrs is not a Megatron-LM pretrain_gpt.py flag; did you "
                               "mean --num-layers?")
    assert any(line.startswith("--qk-layernorm is a Megatron-LM flag the project cannot "
                               "express") for line in lines)


def test_path_flags_are_named_not_dropped(tmp_path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nnodes 1 pretrain_gpt.py \\\n  --num-layers 4 --hidden-size 64"
                      " --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \\\n"
                      "  --micro-batch-size 2 --global-batch-size 8 --vocab-size 256 "
                      "--tensor-model-parallel-size 2 --data-path /data/x --save /ckpt  # c\n")
    cfg, notes = config_from_megatron_args(read_argument_file(str(script)))
    assert cfg.parallel.tensor == 2 and cfg.cluster.gpus_per_node == 2
    assert cfg.model.hidden_dropout == 0.1  # Megatron-LM's default, not ours
    assert [n.split(" ")[2] for n in notes if n.startswith("not carried")] == [
        "--data-path", "--save"]


def test_plan_reads_a_megatron_file(tmp_path, capsys) -> None:
    cfg = get_recipe("tiny_tp2_pp2")
    script = tmp_path / "args.txt"
    script.write_text(" ".join(to_megatron_args(cfg)))

    def read(path, cluster):
        return config_from_megatron_args(read_argument_file(path), cluster)

    assert run_plan(["cluster.gpus_per_node=4"], {"megatron_args": str(script)},
                    read_megatron=read) == 0
    out = capsys.readouterr().out
    assert "TP2 x PP2 x DP1" in out and out.startswith("plan for ")  # no notes: no empty line


def test_pretrain_prints_the_megatron_command_line(capsys) -> None:
    assert main(PRETRAIN, ["recipe=tiny_cp2", "print=megatron_args"]) == 0
    out = capsys.readouterr().out
    assert out == command_text(get_recipe("tiny_cp2")) + "\n"
    assert "--context-parallel-size 2" in out and "# no Megatron-LM flag for" in out


def test_what_this_trainer_always_does_is_on_every_command_line_and_missing_ones_noted() -> None:
    args = to_megatron_args(get_recipe("tiny_dp1"))
    assert "--calculate-per-token-loss" in args
    _, notes = config_from_megatron_args(["--num-layers", "4"])
    assert [n.split(" ")[0] for n in notes] == ["--calculate-per-token-loss"]


@pytest.mark.parametrize(("line", "noted"), [
    (["--bf16"], True), (["--bf16", "--attention-softmax-in-fp32"], False), ([], False)])
def test_a_half_precision_line_without_the_softmax_flag_says_it_trains_the_softmax_so(
        line, noted) -> None:
    """Megatron-LM normalises attention scores in bf16 unless told; read back, such a line
    trains so here too, and says it, since this project's default is fp32."""
    cfg, notes = config_from_megatron_args(["--num-layers", "4", *line])
    said = [n for n in notes if n.startswith("--attention-softmax-in-fp32")]
    assert cfg.model.attention_softmax_in_fp32 is ("--attention-softmax-in-fp32" in line)
    assert said == (["--attention-softmax-in-fp32 is not given: the attention softmax trains in "
                     "bf16 as Megatron-LM's does (model.attention_softmax_in_fp32=false; this "
                     "project's default is true)"] if noted else [])


def test_wsd_writes_its_resolved_anneal_and_reads_it_back_as_unset() -> None:
    cfg = get_recipe("tiny_dp1")
    cfg.scheduler.style = "wsd"
    args = to_megatron_args(cfg)
    assert args[args.index("--lr-wsd-decay-iters") + 1] == str(cfg.train.train_iters // 10)
    back, _ = config_from_megatron_args(args, cfg.cluster)
    assert back.scheduler.wsd_decay_iters is None
    cfg.scheduler.wsd_decay_iters = 7
    back, _ = config_from_megatron_args(to_megatron_args(cfg), cfg.cluster)
    assert back.scheduler.wsd_decay_iters == 7


def test_a_line_without_a_wsd_shape_plans_and_one_with_wsd_takes_megatrons() -> None:
    """A launch line that types no --lr-wsd-decay-style: on a cosine (or linear) schedule
    Megatron-LM's default shape does nothing and reads as unset, so the validation does not
    refuse what the user never typed; on WSD it is Megatron-LM's exponential."""
    argv = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
            "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-3"]
    for style in ("cosine", "linear"):
        cfg, _ = config_from_megatron_args([*argv, "--lr-decay-style", style])
        assert cfg.scheduler.wsd_decay_style == SchedulerConfig().wsd_decay_style
        validate(cfg)
    cfg, _ = config_from_megatron_args([*argv, "--lr-decay-style", "WSD"])
    assert cfg.scheduler.wsd_decay_style == "exponential"
    cfg, _ = config_from_megatron_args([*argv, "--lr-wsd-decay-style", "cosine"])
    assert cfg.scheduler.wsd_decay_style == "cosine"  # typed: kept, and refused as inert
    with pytest.raises(ConfigError, match="shapes the WSD schedule's anneal"):
        validate(cfg)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "model:\n  num_layers: 4\n",
                                  "torchrun pretrain_gpt.py\n"])
def test_a_file_without_megatron_flags_is_one_line(tmp_path, text) -> None:
    path = tmp_path / "args.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^megatron_args={path} holds no pretrain_gpt.py "
                       r"flags \(--num-layers \.\.\.\); give a Megatron-LM launch line \(a "
                       r"saved config.yaml goes in config=\)$"):
        read_argument_file(str(path))


def test_a_hybrid_is_a_pretrain_hybrid_line_with_its_pattern_mamba_sizes_and_routing() -> None:
    cfg = get_recipe("hybrid_tiny_dp1")
    text = command_text(cfg)
    line = text.splitlines()[1]
    assert " pretrain_hybrid.py " in line and " pretrain_gpt.py " not in line
    args = to_megatron_args(cfg)
    given = {flag: args[args.index(flag) + 1] for flag in (
        "--hybrid-layer-pattern", "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-heads",
        "--mamba-num-groups", "--moe-router-score-function", "--moe-router-load-balancing-type",
        "--moe-router-dtype", "--moe-shared-expert-intermediate-size")}
    assert given == {"--hybrid-layer-pattern": "M*-ME-", "--mamba-state-dim": "16",
                     "--mamba-head-dim": "16", "--mamba-num-heads": "8",
                     "--mamba-num-groups": "2", "--moe-router-score-function": "sigmoid",
                     "--moe-router-load-balancing-type": "seq_aux_loss",
                     "--moe-router-dtype": "fp32", "--moe-shared-expert-intermediate-size": "64"}
    assert "--moe-router-enable-expert-bias" in args
    assert cfg.model.position_embedding == "none"  # no RoPE, so no flag of it
    assert not [a for a in args if a.startswith(ROPE_ONLY)]
    listed = [n for n in no_flag_fields(cfg) if n.startswith("model.")]
    assert listed == ["model.mamba_conv_kernel", "model.mamba_chunk_size"]
    assert "model.mamba_chunk_size=32 (Megatron-LM: 128)" in text  # the mixer note


# Flags the rotary embedding alone reads: beside `--position-embedding-type none` only noise.
ROPE_ONLY = ("--rotary-", "--use-rope-scaling", "--rope-scaling-factor")


@pytest.mark.parametrize("name", list(RECIPES))
def test_only_a_rope_recipes_line_carries_rope_flags(name) -> None:
    cfg = get_recipe(name)
    cfg.phases = []
    rope = [a for a in to_megatron_args(cfg) if a.startswith(ROPE_ONLY)]
    if cfg.model.position_embedding != "rope":
        assert rope == []
    else:
        assert {"--rotary-base", "--rotary-percent"} <= set(rope)
        assert ("--rope-scaling-factor" in rope) == (cfg.model.rope_scaling_factor is not None)


def test_a_gpt_line_carries_no_hybrid_or_routing_flag() -> None:
    args = to_megatron_args(get_recipe("tiny_dp1"))
    assert not [a for a in args if a.startswith(("--mamba", "--hybrid", "--moe-router-score"))]
    assert mixer_note(get_recipe("tiny_dp1")) is None


# Flags that set up experts: on a dense model's line they would only mislead.
MOE_ONLY = ("--moe-", "--num-experts", "--expert-model-parallel-size",
            "--expert-tensor-parallel-size", "--use-fused-weighted-squared-relu",
            "--overlap-moe-expert-parallel-comm")


@pytest.mark.parametrize("name", list(RECIPES))
def test_only_an_moe_recipes_line_carries_moe_flags(name) -> None:
    cfg = get_recipe(name)
    cfg.phases = []
    moe = [a for a in to_megatron_args(cfg) if a.startswith(MOE_ONLY)]
    if cfg.model.num_moe_experts is None:
        assert moe == []
    else:
        assert {"--num-experts", "--moe-router-topk", "--moe-token-dispatcher-type",
                "--moe-aux-loss-coeff", "--expert-model-parallel-size"} <= set(moe)
        flex = cfg.model.moe_token_dispatcher == "flex"
        assert ("--moe-flex-dispatcher-backend" in moe) == flex  # read by that dispatcher only


def test_the_default_recipes_printed_line_has_no_moe_flag(capsys) -> None:
    assert get_recipe(DEFAULT_RECIPE).model.num_moe_experts is None  # the default is dense
    assert main(PRETRAIN, ["print=megatron_args"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert not [w for w in line.split() if w.startswith(MOE_ONLY)]


def test_a_dense_line_reads_the_moe_flags_it_types_and_the_projects_defaults_for_the_rest(
) -> None:
    from trainer.tools.megatron_args import megatron_parser

    # Megatron-LM's own default differs from the project's: read, a dense line would carry it.
    assert megatron_parser().get_default("moe_token_dispatcher_type") == "allgather"
    back, _ = config_from_megatron_args(["--num-layers", "4"])
    assert back.model.moe_token_dispatcher == "alltoall"
    moe, _ = config_from_megatron_args(["--num-layers", "4", "--num-experts", "4"])
    assert moe.model.moe_token_dispatcher == "allgather"  # what Megatron-LM trains there
    cfg = get_recipe("tiny_dp1")
    typed = [*to_megatron_args(cfg), "--moe-token-dispatcher-type", "allgather"]
    back, _ = config_from_megatron_args(typed, cfg.cluster)
    assert back.model.moe_token_dispatcher == "allgather"  # typed: read, never dropped
    # A dense line printed with the MoE flags (as this project once did) reads back alike.
    old = [*to_megatron_args(cfg), "--moe-router-topk", "2", "--moe-token-dispatcher-type",
           "alltoall", "--moe-aux-loss-coeff", "0.0", "--expert-model-parallel-size", "1",
           "--moe-flex-dispatcher-backend", "deepep"]
    back, notes = config_from_megatron_args(old, cfg.cluster)
    assert _differences(cfg, back) == [] and notes == []


def test_the_mixer_defaults_are_megatron_cores() -> None:
    import inspect

    from megatron.core.ssm.mamba_mixer import MambaMixer

    defaults = inspect.signature(MambaMixer.__init__).parameters
    assert MIXER_DEFAULTS == {"model.mamba_conv_kernel": defaults["d_conv"].default,
                              "model.mamba_chunk_size": defaults["chunk_size"].default}


def test_the_older_pattern_flag_reads_as_the_pattern() -> None:
    cfg, _ = config_from_megatron_args(["--hybrid-override-pattern", "M*-", "--num-layers", "3"])
    assert cfg.model.hybrid_layer_pattern == "M*-"


@pytest.mark.parametrize(("argv", "start"), [
    (["--num-experts", "4", "--moe-router-score-function", "sqrtsoftplus"],
     "--moe-router-score-function sqrtsoftplus is not one the project trains"),
    (["--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn"],
     "--moe-router-load-balancing-type sinkhorn is not one the project trains"),
    (["--num-experts", "4", "--moe-router-dtype", "fp64"],
     "--moe-router-dtype fp64 is not one the project trains"),
])
def test_a_megatron_choice_the_project_lacks_is_one_line(argv, start) -> None:
    with pytest.raises(ConfigError) as error:
        config_from_megatron_args(argv)
    assert str(error.value).startswith(start) and "\n" not in str(error.value)


def test_plan_reads_a_pretrain_hybrid_file(tmp_path, capsys) -> None:
    cfg = get_recipe("hybrid_tiny_dp1")
    script = tmp_path / "hybrid.sh"
    script.write_text(command_text(cfg).splitlines()[1])

    def read(path, cluster):
        back, notes = config_from_megatron_args(read_argument_file(path), cluster)
        assert back.model.hybrid_layer_pattern == "M*-ME-" and notes == []
        return back, notes

    assert run_plan([], {"megatron_args": str(script)}, read_megatron=read) == 0
    assert "TP1 x PP1 x DP1" in capsys.readouterr().out


FAST_PATH_CASES = {
    "moe": ("mixtral_tiny_ep2_dp2", [
        "precision.dtype=bf16", "model.moe_token_dispatcher=flex",
        "model.moe_flex_backend=hybridep", "model.moe_grouped_gemm=true",
        "model.moe_permute_fusion=true",
        "model.moe_router_fusion=true", "parallel.ep_comm_overlap=true",
        "train.recompute=selective", "train.recompute_modules=[moe_act,layernorm]",
        "train.offload_modules=[core_attn,attn_proj,expert_fc1]"],
        ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend hybridep",
         "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-router-fusion",
         "--overlap-moe-expert-parallel-comm",
         "--recompute-granularity selective --recompute-modules moe_act layernorm",
         "--fine-grained-activation-offloading --offload-modules core_attn attn_proj "
         "expert_fc1"]),
    "graphs": ("mixtral_tiny_tp2_sp_ep2_dp2", [
        "parallel.tp_comm_overlap=true", "train.cuda_graphs=transformer_engine",
        "train.cuda_graph_modules=[attn]", "train.cuda_graph_warmup_steps=2",
        "model.moe_shared_expert_ffn_hidden_size=64", "model.moe_shared_expert_overlap=true"],
        ["--tp-comm-overlap", "--cuda-graph-impl transformer_engine --cuda-graph-modules attn "
         "--cuda-graph-warmup-steps 2 --te-rng-tracker", "--moe-shared-expert-overlap"]),
    "srelu": ("hybrid_tiny_dp1", ["model.moe_fused_squared_relu=true",
                                  "train.cuda_graphs=transformer_engine"],
              ["--use-fused-weighted-squared-relu", "--moe-grouped-gemm",
               "--cuda-graph-impl transformer_engine --cuda-graph-warmup-steps 3"]),
}


@pytest.mark.parametrize("case", FAST_PATH_CASES)
def test_fast_paths_to_megatron_args_and_back(case) -> None:
    """Each GPU fast path is a Megatron-LM flag out and the same field back in."""
    from recipes.config.overrides import apply_overrides

    recipe, overrides, flags = FAST_PATH_CASES[case]
    cfg = apply_overrides(get_recipe(recipe), overrides)
    line = " ".join(to_megatron_args(cfg))
    for flag in flags:
        assert flag in line
    back, notes = config_from_megatron_args(to_megatron_args(cfg), cfg.cluster)
    # a recipe that keeps the softmax in bf16 (the Nemotron ones) is read back so, and said
    said = ["--attention-softmax-in-fp32"] if not cfg.model.attention_softmax_in_fp32 \
        and cfg.precision.dtype != "fp32" else []
    assert _differences(cfg, back) == [] and [n.split(" ")[0] for n in notes] == said


@pytest.mark.parametrize(("flags", "message"), [
    (["--moe-flex-dispatcher-backend", "ncclep"], "--moe-flex-dispatcher-backend ncclep drops"),
    (["--cuda-graph-impl", "full_iteration"], "--cuda-graph-impl full_iteration graphs the "),
])
def test_fast_paths_the_project_does_not_train_are_refused_in_one_line(flags, message) -> None:
    base = to_megatron_args(get_recipe("tiny_dp1"))
    with pytest.raises(ConfigError, match=message):
        config_from_megatron_args([*base, *flags])


@pytest.mark.parametrize(("field", "flags", "dests"), [
    ("optimizer.torch_fsdp2", ["--use-torch-fsdp2"], ["use_torch_fsdp2"]),
    # Megatron-LM 0.19.2 saves asynchronously only through its persistent worker.
    ("checkpoint.async_save", ["--async-save", "--use-persistent-ckpt-worker"],
     ["async_save", "use_persistent_ckpt_worker"]),
])
def test_torch_fsdp2_and_async_save_are_megatron_flags_out_and_fields_back(field, flags,
                                                                          dests) -> None:
    from trainer.tools.megatron_args import megatron_parser

    cfg = get_recipe("tiny_dp1")
    section, name = field.split(".")
    setattr(getattr(cfg, section), name, True)
    args = to_megatron_args(cfg)
    assert all(flag in args for flag in flags) and field not in no_flag_fields(cfg)
    parsed = vars(megatron_parser().parse_known_args(args)[0])
    assert all(parsed[dest] is True for dest in dests)
    back, notes = config_from_megatron_args(args, cfg.cluster)
    assert getattr(getattr(back, section), name) is True
    assert _differences(cfg, back) == [] and notes == []


def test_async_save_without_megatrons_persistent_worker_is_one_line() -> None:
    base = to_megatron_args(get_recipe("tiny_dp1"))
    with pytest.raises(ConfigError) as error:
        config_from_megatron_args([*base, "--async-save"])
    assert str(error.value).startswith("--async-save without --use-persistent-ckpt-worker: ")
    assert "\n" not in str(error.value)


RAMP = ["train.rampup_batch_size=[2,2,48]", "scheduler.style=wsd", "scheduler.decay_iters=40",
        "scheduler.wsd_decay_iters=12"]


def test_a_batch_ramp_up_is_megatrons_step_schedule_in_samples_and_reads_back() -> None:
    """Megatron-LM 0.19.2 ignores --rampup-batch-size; its step schedule (thresholds in tokens),
    driven through Megatron Core's own calculator as its training loop drives it, trains this
    ramp's batches for exactly this run's steps, and the line reads back as the ramp."""
    from megatron.core.num_microbatches_calculator import (
        StepBatchsizeNumMicroBatchesCalculator,
    )

    from recipes.config.overrides import apply_overrides
    from recipes.config.phases import run_samples_at
    from recipes.config.rampup import batch_at, ramp_schedule
    from trainer.tools.megatron_args import megatron_parser

    cfg = apply_overrides(get_recipe("tiny_dp1"), RAMP)
    args = to_megatron_args(cfg)
    assert not {"--rampup-batch-size", "--global-batch-size", "--train-iters", "--lr-decay-iters",
                "--lr-warmup-iters", "--lr-wsd-decay-iters"} & set(args)
    assert "train.rampup_batch_size" not in no_flag_fields(cfg)
    a = megatron_parser().parse_known_args(args)[0]
    calculator = StepBatchsizeNumMicroBatchesCalculator(
        a.micro_batch_size, cfg.layout.data_parallel, False, 0, a.step_batch_size_schedule,
        seq_length=a.seq_length)  # as set_global_variables builds it
    ramp, consumed, steps = ramp_schedule(cfg), 0, 0
    while consumed < a.train_samples:  # training.py update_train_iters
        calculator.update(consumed, consistency_check=False)
        assert calculator.get_current_global_batch_size() == batch_at(ramp, consumed)
        consumed, steps = consumed + calculator.get_current_global_batch_size(), steps + 1
    assert (steps, calculator.global_batch_size) == (cfg.train.train_iters, 8)
    assert a.eval_global_batch_size == 8 and a.lr_warmup_samples == run_samples_at(cfg, 10)
    assert a.lr_decay_samples == run_samples_at(cfg, 40)
    assert a.lr_wsd_decay_samples == run_samples_at(cfg, 40) - run_samples_at(cfg, 28)
    back, notes = config_from_megatron_args(args, cfg.cluster)
    assert back.train.rampup_batch_size == [2, 2, 48] and back.scheduler.wsd_decay_iters == 12
    assert _differences(cfg, back) == [] and notes == []


@pytest.mark.parametrize(("text", "seq"), [("0:384 200B:768 0.4T:1152", 4096),
                                           ("0:2, 12800:6 25600:8", 128), ("0:16 300K:1024", None)])
def test_the_step_schedule_is_read_as_megatron_core_reads_it(text, seq) -> None:
    from megatron.core.num_microbatches_calculator import (
        StepBatchsizeNumMicroBatchesCalculator,
    )

    from recipes.config.megatron_args import step_schedule

    assert step_schedule(text, seq) == tuple(
        StepBatchsizeNumMicroBatchesCalculator._parse_schedule(text, seq))


def test_the_nemotron4_ramp_is_written_in_tokens() -> None:
    args = to_megatron_args(get_recipe("nemotron4_15b_tp8_pp2_dp4"))
    schedule = args[args.index("--step-batch-size-schedule") + 1]
    # [384, 384, 97656250] to 1152: two increments, each at half the ramp's samples x 4096
    assert schedule == "0:384 200000000000:768 400000000000:1152"


@pytest.mark.parametrize(("extra", "start"), [
    (["--rampup-batch-size", "2", "2", "48"],
     "--rampup-batch-size 2 2 48 is ignored by Megatron-LM 0.19.2"),
    (["--global-batch-size", "8"], "--step-batch-size-schedule with --global-batch-size: "),
    (["--train-iters", "300"], "--train-samples with --train-iters: "),
    (["--step-batch-size-schedule", "0:2 12800:6 25600:8"],
     "--step-batch-size-schedule '0:2 12800:6 25600:8' is not a linear ramp-up"),
    (["--eval-global-batch-size", "4"], "--eval-global-batch-size 4: the project evaluates"),
])
def test_a_ramp_megatron_trains_otherwise_is_one_line(extra, start) -> None:
    from recipes.config.overrides import apply_overrides

    argv = [*to_megatron_args(apply_overrides(get_recipe("tiny_dp1"), RAMP)), *extra]
    with pytest.raises(ConfigError) as error:
        config_from_megatron_args(argv)
    assert str(error.value).startswith(start) and "\n" not in str(error.value)


def test_a_step_schedule_with_train_iters_is_one_line() -> None:
    argv = ["--num-layers", "2", "--step-batch-size-schedule", "0:2 128:8", "--train-iters", "9"]
    with pytest.raises(ConfigError, match="^--step-batch-size-schedule without --train-samples"):
        config_from_megatron_args(argv)


def test_a_phased_run_is_refused_in_one_line_that_says_how_to_print_a_phase(capsys) -> None:
    """Megatron-LM has no phases: one line would train the first phase's 8k layout for the whole
    run; the refusal names every phase, and its example overrides print the last one."""
    import shlex

    name = "nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16"
    assert main(PRETRAIN, [f"recipe={name}", "print=megatron_args"]) == 2
    captured = capsys.readouterr()
    assert "torchrun" not in captured.out
    [line] = [text for text in (captured.out + captured.err).splitlines() if text]
    assert line.startswith("error: phases: Megatron-LM has no phases")
    for phase in ("general (steps 0-933806)", "quality (steps 933806-993411, blend ",
                  "long_context (steps 993411-998219, blend conf/data/nemotron3_nano_long_"
                  "context.yaml, batch 48, sequence 524288, CP16, a new launch)"):
        assert phase in line
    overrides = shlex.split(line.split("for long_context: ")[1])
    assert main(PRETRAIN, [f"recipe={name}", *overrides, "print=megatron_args"]) == 0
    printed = capsys.readouterr().out.splitlines()[1]
    for flag in ("--seq-length 524288", "--context-parallel-size 16", "--global-batch-size 48"):
        assert flag in printed


def test_the_docs_list_of_fields_without_a_flag_is_the_printouts() -> None:
    """docs/megatron-lm.md names, in its 'Fields with no Megatron-LM flag' paragraph, exactly
    the fields `print=megatron_args` lists (data.source only when the data is not synthetic)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "megatron-lm.md").read_text(encoding="utf-8")
    paragraph = text[text.index("Fields with no Megatron-LM flag"):].split("\n\n")[0]
    named = [w for w in re.findall(r"`([^`]+)`", paragraph)
             if re.fullmatch(r"(?:[a-z_]+\.)?[a-z0-9_*]+", w)]
    cfg = get_recipe("tiny_dp1")
    cfg.data.source = "synthetic"
    listed = [item.split(" ")[0] for item in no_flag_fields(cfg)]
    cfg.data.source = "blend"
    assert sorted(named) == sorted(item.split(" ")[0] for item in no_flag_fields(cfg))
    assert sorted(set(named) - set(listed)) == ["data.source"]  # synthetic is --mock-data


def test_the_printed_torchrun_line_of_an_expert_recipe_plans_on_its_ranks(tmp_path, capsys):
    """The world size is torchrun's (--nnodes, --nproc-per-node), not a flag: an EP2 line
    (TP1 x PP1 x CP1) plans on the 2 ranks it was printed for, not on one."""
    from trainer.entry.commands import PLAN

    assert main(PRETRAIN, ["recipe=mixtral_tiny_ep2_dp2", "print=megatron_args"]) == 0
    line = tmp_path / "launch.sh"
    line.write_text(capsys.readouterr().out)
    assert main(PLAN, [f"megatron_args={line}"]) == 0
    assert "plan: TP1 x PP1 x DP2, EP2 on 1 x 2" in capsys.readouterr().out


@pytest.mark.parametrize(("words", "size"), [
    (["torchrun", "--nnodes=2", "--nproc-per-node=8"], (2, 8)),
    (["torchrun", "--nnodes", "4", "--nproc_per_node", "8"], (4, 8)),
    (["torchrun", "--nproc-per-node=8"], (1, 8)),
    (["torchrun", "--nnodes=1:4", "--nproc-per-node=8"], None),  # elastic: no one size
    (["torchrun", "--nnodes=2"], None),
    (["python"], None),
])
def test_the_launchers_size(words, size) -> None:
    from trainer.tools.megatron_args import launcher_size

    assert launcher_size(words) == size


def test_the_deprecated_full_graph_module_reads_as_the_whole_layer() -> None:
    """Megatron-LM: 'full scope is deprecated. Use empty cuda_graph_modules to capture the whole
    layer' (training/arguments.py:262-273)."""
    argv = [*to_megatron_args(get_recipe("tiny_dp1")), "--cuda-graph-impl", "transformer_engine",
            "--cuda-graph-modules", "full"]
    cfg, _ = config_from_megatron_args(argv)
    assert cfg.train.cuda_graphs == "transformer_engine" and cfg.train.cuda_graph_modules == []


def test_the_search_over_a_megatron_line_names_the_best_as_a_torchrun_line(tmp_path, capsys):
    """A config read from a Megatron-LM line names no recipe: `recipe=megatron_args` could not
    run. The best layout is said as the torchrun line that trains it, which reads back."""
    from trainer.entry.commands import PLAN
    from trainer.tools.megatron_args import read_launch_file

    line = tmp_path / "launch.sh"
    line.write_text(command_text(get_recipe("tiny_tp2_pp2")))
    assert main(PLAN, [f"megatron_args={line}", "cluster=conf/cluster/cpu_local.yaml",
                       "search=true"]) == 0
    best = [x for x in capsys.readouterr().out.splitlines() if x.startswith("train the best: ")]
    assert len(best) == 1 and best[0].startswith("train the best: torchrun --nnodes=1 ")
    again = tmp_path / "best.sh"
    again.write_text(best[0].removeprefix("train the best: "))
    argv, launched = read_launch_file(str(again))
    cfg, _ = config_from_megatron_args(argv, launched=launched)
    assert cfg.layout.world_size == 4
