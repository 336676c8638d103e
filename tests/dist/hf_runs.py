"""Per-rank functions for the Hugging Face interop tests (run through the `launch_ranks` fixture),
and the tiny random-weight Hugging Face models they convert (built by the test process).

Conversions run on a launched rank because they set up Megatron's parallel state and the CPU
runtime's process-wide patches, which the pytest process must not carry. Sessions are built by
`layout_runs._session`, exactly as a run builds them, from the imported checkpoint
(`checkpoint.load=<dir> checkpoint.load_model_only=true`).
"""

from __future__ import annotations

from pathlib import Path

from tests.dist.layout_runs import _finish, _session

VOCAB = 300  # the tiny Llama and Mixtral recipes' vocabulary (padded to 320 by Megatron)
VOCABS = {"llama": VOCAB, "mixtral": VOCAB, "nemotron_h": 256,  # NemotronH: also padded to 320
          "nemotron_super": 256}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def nemotron_h_config():
    """The transformers config of recipe hf_tiny_nemotron_h's model (recipes/hf_tiny.py):
    one block of each type, MoE routed as Nemotron 3 (sigmoid, e_score_correction_bias,
    n_group 1, normalised top-2, x2.5, a shared expert)."""
    from transformers import NemotronHConfig

    return NemotronHConfig(
        vocab_size=VOCABS["nemotron_h"], hidden_size=32,
        layers_block_type=["linear_attention", "full_attention", "mlp", "moe"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, conv_kernel=4,
        chunk_size=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5, n_group=1,
        topk_group=1, norm_topk_prob=True, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        initializer_range=0.1, max_position_embeddings=32,
    )


def nemotron_super_config():
    """The transformers config of recipe hf_tiny_nemotron_super's model: the NemotronH one with
    its experts in a latent width of 16, and one stored MTP depth of attention + MoE (Nemotron 3
    Super's `num_nextn_predict_layers` 1, `mtp_hybrid_override_pattern` *E)."""
    config = nemotron_h_config()
    config.moe_latent_size = 16
    config.num_nextn_predict_layers = 1
    config.mtp_layers_block_type = ["full_attention", "moe"]
    return config


def hf_config(kind: str):
    """The transformers config of recipe hf_tiny_<kind>'s model (recipes/hf_tiny.py)."""
    from transformers import LlamaConfig, MixtralConfig

    if kind == "nemotron_h":
        return nemotron_h_config()
    if kind == "nemotron_super":
        return nemotron_super_config()
    common = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 32}
    if kind == "llama":
        return LlamaConfig(**common, num_hidden_layers=4, rope_theta=500_000.0,
                           rope_scaling=LLAMA3_SCALING, tie_word_embeddings=False)
    return MixtralConfig(**common, num_hidden_layers=2, rope_theta=1_000_000.0,
                         num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=True)


def config_json(kind: str, architecture: str) -> dict:
    """The tiny model's config.json as transformers writes it (recipe hf_tiny_<kind>)."""
    import json

    return {**json.loads(hf_config(kind).to_json_string()), "architectures": [architecture]}


def copy_model(model: Path, to: Path) -> Path:
    """A copy of a model directory's files, to damage without touching the shared one."""
    to.mkdir()
    for path in model.iterdir():
        (to / path.name).write_bytes(path.read_bytes())
    return to


# NemotronH tensors transformers initialises to constants (ones, zeros, log 1..H): moved off them
# so that a mapping that dropped or swapped one would show in the logits.
_CONSTANT_AT_INIT = ("norm.weight", "norm_f.weight", "mixer.D", "mixer.A_log", "mixer.dt_bias",
                     "conv1d.bias", "e_score_correction_bias")


def _away_from_defaults(model) -> None:
    import torch

    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(_CONSTANT_AT_INIT):
                tensor.add_(torch.empty_like(tensor).uniform_(-0.3, 0.3))


def make_hf_model(kind: str, directory: Path, seed: int = 0) -> Path:
    """A randomly initialised model of that shape, saved as transformers saves it. NemotronH's
    is saved with `time_step_min=0`: transformers clamps dt from below there, Megatron at 0
    (trainer/models/hybrid/hf_config.py), so both compute the same function; transformers'
    own initialisation needs it > 0 (log), so it is set after building."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind), dtype=torch.float32)
    if kind.startswith("nemotron"):
        _away_from_defaults(model)
        model.config.time_step_min = 0.0
    model.save_pretrained(directory)
    if kind == "nemotron_super":
        _add_mtp_depth(directory, seed)
    return directory


def _add_mtp_depth(directory: Path, seed: int) -> None:
    """A release's MTP depth beside transformers' weights (transformers builds none): its two
    layers as transformers itself saves an attention and an MoE block (another NemotronH of
    that pattern, `backbone.layers.{0,1}` renamed `mtp.layers.{0,1}`), the embedding and
    hidden-state norms and their projection with the first, the final norm with the last
    (Megatron Bridge's names, trainer/models/hybrid/hf_tensors.py)."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config = nemotron_super_config()
    config.layers_block_type = ["full_attention", "moe"]
    config.num_nextn_predict_layers = 0
    torch.manual_seed(seed + 1)
    depth = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _away_from_defaults(depth)
    with tempfile.TemporaryDirectory() as scratch:
        depth.save_pretrained(scratch)
        blocks = load_file(Path(scratch) / "model.safetensors")
    (shard,) = directory.glob("*.safetensors")
    tensors = load_file(shard)
    for name, tensor in blocks.items():
        if name.startswith("backbone.layers."):
            tensors["mtp.layers." + name.removeprefix("backbone.layers.")] = tensor
    hidden = config.hidden_size
    for name, shape in (("0.enorm", (hidden,)), ("0.hnorm", (hidden,)),
                        ("0.eh_proj", (hidden, 2 * hidden)), ("1.final_layernorm", (hidden,))):
        tensors[f"mtp.layers.{name}.weight"] = torch.empty(shape).uniform_(-0.3, 0.3)
    save_file(tensors, shard, metadata={"format": "pt"})


def _quiet_progress():
    from rich.progress import Progress

    return Progress(disable=True)


def import_checkpoint(payload: dict) -> dict:
    """scripts/convert.py import on this (only) rank; the import's figures."""
    from recipes.resolve import resolve_config
    from trainer.interop.importer import import_hf

    cfg = resolve_config([f"recipe={payload['recipe']}", *payload.get("overrides", [])])
    with _quiet_progress() as progress:
        result = import_hf(Path(payload["hf"]), cfg, Path(payload["out"]), progress)
    return {"tensors": result.tensors, "bytes": result.bytes, "seconds": result.seconds,
            "peak_rss": _peak_rss()}


def export_checkpoint(payload: dict) -> dict:
    """scripts/convert.py export on this (only) rank."""
    from trainer.interop.exporter import export_hf

    with _quiet_progress() as progress:
        result = export_hf(Path(payload["checkpoint"]), Path(payload["out"]), progress,
                           payload.get("max_shard_bytes", 5 * 1024**3))
    return {"tensors": result.tensors, "bytes": result.bytes, "seconds": result.seconds,
            "peak_rss": _peak_rss()}


def export_error(payload: dict) -> str:
    """scripts/convert.py export of a checkpoint it must refuse: the one-line error."""
    from plugins.protocol.errors import ConfigError

    try:
        export_checkpoint(payload)
    except ConfigError as error:
        return str(error)
    raise AssertionError("the export was not refused")


def _loaded_session(payload: dict):
    return _session({**payload, "overrides": [
        f"checkpoint.load={payload['checkpoint']}", "checkpoint.load_model_only=true",
        *payload.get("overrides", []),
    ]})


def logits(payload: dict) -> list:
    """One forward pass of the one-rank model loaded from the checkpoint: [b, s, padded vocab]."""
    import torch

    session = _loaded_session(payload)
    tokens = torch.tensor(payload["tokens"])
    positions = torch.arange(tokens.shape[1]).expand_as(tokens).contiguous()
    model = session.model[0]
    model.eval()
    with torch.no_grad():
        out = model(input_ids=tokens, position_ids=positions, attention_mask=None)
    _finish()
    return out.tolist()


def _microbatches(rows: list, micro_batch: int) -> list[dict]:
    import torch

    samples = torch.tensor(rows)
    tokens, labels = samples[:, :-1].contiguous(), samples[:, 1:].contiguous()
    positions = torch.arange(tokens.shape[1]).expand_as(tokens).contiguous()
    return [{"tokens": tokens[i:i + micro_batch], "labels": labels[i:i + micro_batch],
             "position_ids": positions[i:i + micro_batch],
             "loss_mask": torch.ones_like(tokens[i:i + micro_batch], dtype=torch.float32)}
            for i in range(0, len(rows), micro_batch)]


def layout_loss_and_save(payload: dict) -> dict:
    """Load the checkpoint into this layout, the mean loss over `rows` (every DP rank runs all of
    them: the mean is unchanged), then save the weights from this layout for the export; with
    `train_steps`, then train that many optimizer steps and give their losses."""
    import torch

    from recipes.config.io import save_config
    from tests.dist.reference_weights import save_model_weights
    from trainer.metrics import reduce_loss_over_world
    from trainer.step import run_schedule, train_step

    session = _loaded_session(payload)
    cfg = session.cfg
    for chunk in session.model:
        chunk.eval()
    with torch.no_grad():
        reports = run_schedule(session.model, _microbatches(payload["rows"], 2), session.plugins,
                               seq_length=cfg.model.seq_length, micro_batch_size=2,
                               forward_only=True)
    loss, tokens = reduce_loss_over_world(reports)
    save_model_weights(payload["save_dir"], cfg, session.model)
    if torch.distributed.get_rank() == 0:
        save_config(cfg, Path(payload["save_dir"]) / "config.yaml")
    for chunk in session.model:
        chunk.train()
    trained = [train_step(session).loss for _ in range(payload.get("train_steps", 0))]
    _finish()
    return {"loss": loss, "tokens": tokens, "train_losses": trained}


def train_and_save(payload: dict) -> dict:
    """Load the checkpoint into this layout, train `steps` optimizer steps and save a full
    checkpoint into `<run_dir>/checkpoints` as the run loop does (Megatron FSDP: fsdp_dtensor),
    with the run's config.yaml in `run_dir`; the lr each step applied (read before the step:
    the step's metrics give the scheduler's next one)."""
    import torch

    from recipes.config.io import save_config
    from trainer.checkpoint.save import save_checkpoint
    from trainer.step import train_step

    session = _loaded_session(payload)
    lrs = []
    for _ in range(payload["steps"]):
        lrs.append(session.optimizer.param_groups[0]["lr"])
        train_step(session)
    step = save_checkpoint(session, Path(payload["run_dir"]) / "checkpoints")
    if torch.distributed.get_rank() == 0:
        save_config(session.cfg, Path(payload["run_dir"]) / "config.yaml")
    _finish()
    return {"lrs": lrs, "step": str(step)}


def published_shapes(payload: dict) -> dict:
    """For each recipe: the Megatron names and shapes the import writes (from the mapping) and
    those of the recipe's real model built on the meta device at TP1, vocabulary padded as the
    recipe's layout pads it."""
    from recipes.registry import get_recipe
    from trainer.interop import megatron_side
    from trainer.interop.mapping import rules, shapes_of
    from trainer.models.gpt.hf_tensors import megatron_shape

    found = {}
    for recipe in payload["recipes"]:
        cfg = get_recipe(recipe)
        shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
        with megatron_side.one_process(cfg) as one:
            model = megatron_side.weight_shapes(megatron_side.meta_template(one))
        found[recipe] = {
            "imported": {r.megatron: list(megatron_shape(r, shapes)) for r in rules(shapes)},
            "model": {name: list(shape) for name, shape in model.items()},
        }
    return found


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
