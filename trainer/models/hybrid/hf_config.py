"""NemotronH's config.json (transformers' `NemotronHConfig`) <-> our hybrid `ModelConfig`.

Why a module of its own: NemotronH (Nemotron-H, Nemotron Nano v2, Nemotron 3) describes a hybrid
model by block types, Mamba, attention and MoE sizes and routing options of its own; only what
Megatron's `HybridModel` computes the same way with our schema's fields is mapped, and every
other feature is refused in one line naming it. The block types give `model.hybrid_layer_pattern`
(`linear_attention`/`mamba` M, `full_attention`/`attention` *, `mlp` -, `moe` E; older configs
write the string `hybrid_override_pattern`); fields of a layer kind the pattern lacks are not
compared. No torch here: configs are checked before any heavy import.

- Routing. transformers' `NemotronHTopkRouter` takes sigmoid scores, adds
  `e_score_correction_bias` for the choice only, picks the top k (within the best `topk_group`
  of `n_group` groups), weighs by the unbiased scores, divides them by their sum when
  `norm_topk_prob`, and scales by `routed_scaling_factor`. Megatron does the same with
  `moe_router_score_function=sigmoid`, `moe_router_expert_bias` and its top-k scaling factor,
  but divides by the sum exactly when top-k > 1 (`transformer/moe/moe_utils.py:854-868`), and
  group-limited routing has no field here: other settings are refused.
- Latent MoE and MTP. `moe_latent_size` is ours. `num_nextn_predict_layers` counts the MTP
  depths a release stores (`mtp_layers_block_type`, or the older string
  `mtp_hybrid_override_pattern`, is one depth's layers); Megatron may run one stored depth
  several times (`model.mtp_use_repeated_layer`: Nemotron 3 Super stores 1 and trains 2,
  Megatron-Bridge@53d40d1:src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py:92-98), so
  the recipe's depths that hold weights are compared, and its layers after each '/'.
  transformers computes no MTP head (it skips `mtp.*` on load).
- dt. transformers 5.24's PyTorch path clamps softplus(dt) from below at `time_step_min`
  (`modeling_nemotron_h.py`: `time_step_limit = (config.time_step_min, inf)`); Megatron's mixer
  does not clamp (`ssm/mamba_mixer.py:755-773` passes no dt limit), as in the Megatron runs
  NemotronH models are trained with. A `time_step_min` > 0 is accepted (the imported model is
  Megatron's function; transformers differs where softplus(dt) < time_step_min); an export
  written from scratch sets `time_step_min=0`, so that transformers computes our function.
"""

from __future__ import annotations

import dataclasses
import math

from plugins.protocol.errors import ConfigError
from recipes.config.schema import ModelConfig
from recipes.models.hybrid.pattern import (
    MTP,
    layer_symbols,
    mamba_heads,
    mtp_built,
    mtp_depths,
    mtp_parts,
    mtp_pattern,
)
from recipes.models.kinds import ATTENTION, MAMBA, MLP, MOE
from trainer.models.gpt.hf_config import NORM_EPSILON, read_values, refuse_differences

ARCHITECTURE = "NemotronHForCausalLM"
BLOCK_SYMBOLS = {"linear_attention": MAMBA, "mamba": MAMBA, "full_attention": ATTENTION,
                 "attention": ATTENTION, "mlp": MLP, "moe": MOE}
BLOCK_NAMES = {MAMBA: "linear_attention", ATTENTION: "full_attention", MLP: "mlp", MOE: "moe"}
# Older config.json names transformers still reads (`NemotronHConfig.__post_init__`).
LEGACY_NAMES = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv",
                "chunk_size": "mamba_chunk_size", "use_conv_bias": "mamba_conv_bias",
                "time_step_limit": "mamba_dt_limit", "time_step_min": "mamba_dt_min"}

# Our `ModelConfig` field -> the config.json name, per the layer kind that needs it (None: all).
FIELDS = {
    None: {"num_layers": "num_hidden_layers", "hybrid_layer_pattern": "layers_block_type",
           "hidden_size": "hidden_size", "vocab_size": "vocab_size",
           "share_embeddings_and_output_weights": "tie_word_embeddings"},
    ATTENTION: {"num_attention_heads": "num_attention_heads",
                "num_query_groups": "num_key_value_heads", "kv_channels": "head_dim"},
    MLP: {"ffn_hidden_size": "intermediate_size"},
    MAMBA: {"mamba_num_heads": "mamba_num_heads", "mamba_head_dim": "mamba_head_dim",
            "mamba_num_groups": "n_groups", "mamba_state_dim": "ssm_state_size",
            "mamba_conv_kernel": "conv_kernel", "mamba_chunk_size": "chunk_size"},
    MOE: {"num_moe_experts": "n_routed_experts", "moe_router_topk": "num_experts_per_tok",
          "moe_ffn_hidden_size": "moe_intermediate_size",
          "moe_shared_expert_ffn_hidden_size": "moe_shared_expert_intermediate_size",
          "moe_router_topk_scaling_factor": "routed_scaling_factor",
          "moe_latent_size": "moe_latent_size",
          # What transformers' router always does, as our fields say it.
          "moe_router_score_function": "the router's score",
          "moe_router_expert_bias": "gate.e_score_correction_bias"},
}
FIELD_NAMES = {ours: theirs for kind in FIELDS.values() for ours, theirs in kind.items()}
# What the NemotronH recipes fix and the mapping relies on (`recipes/nemotron/nemotron_h.py`).
# The MTP settings and their schema defaults, which a model without MTP depths must keep.
MTP_DEFAULTS = {field.name: field.default for field in dataclasses.fields(ModelConfig)
                if field.name in ("mtp_loss_scaling_factor", "mtp_use_repeated_layer")}
SHAPE = {"activation": "squared_relu", "normalization": "RMSNorm", "position_embedding": "none",
         "add_bias_linear": False, "layernorm_zero_centered_gamma": False}


# The config.json scalars this mapping reads (transformers' names and the older ones), by the
# JSON type each must have, as `trainer/models/gpt/hf_config.py` states its own.
HF_SCALARS = {
    **dict.fromkeys(("num_hidden_layers", "hidden_size", "intermediate_size",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                     "num_experts_per_tok", "mamba_num_heads", "mamba_head_dim", "n_groups",
                     "mamba_n_groups", "ssm_state_size", "conv_kernel", "mamba_d_conv",
                     "chunk_size", "mamba_chunk_size", "n_routed_experts",
                     "moe_intermediate_size", "moe_latent_size", "n_group", "topk_group"),
                    "size"),
    **dict.fromkeys(("num_nextn_predict_layers", "moe_shared_expert_intermediate_size"),
                    "count"),
    **dict.fromkeys(("layer_norm_epsilon", "routed_scaling_factor", "time_step_min",
                     "mamba_dt_min"), "number"),
    **dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias", "use_bias",
                     "use_conv_bias", "mamba_conv_bias", "residual_in_fp32", "norm_topk_prob"),
                    "flag"),
}
HF_NULLABLE = {"num_key_value_heads", "head_dim", "moe_latent_size", "num_nextn_predict_layers"}
# The config.json fields this mapping reads inside of, by the JSON shape each must have (block
# type names, or a list), as `trainer/models/gpt/hf_config.py` states its own; null is absent.
HF_NESTED = {**dict.fromkeys(("layers_block_type", "layer_types", "mtp_layers_block_type"),
                             "names"),
             **dict.fromkeys(("time_step_limit", "mamba_dt_limit"), "list")}


def _get(hf: dict, name: str, default: object = KeyError):
    """A config.json value by transformers' name or its older one; `default` when absent."""
    for key in (name, LEGACY_NAMES.get(name)):
        if key is not None and key in hf:
            return hf[key]
    if default is KeyError:
        raise KeyError(name)
    return default


def _symbols(blocks: list, key: str) -> str:
    unknown = sorted({str(b) for b in blocks if b not in BLOCK_SYMBOLS})
    if unknown:
        raise ConfigError(f"config.json {key} block type {', '.join(unknown)} is not mapped; "
                          f"NemotronH layers map from {', '.join(sorted(set(BLOCK_SYMBOLS)))}")
    return "".join(BLOCK_SYMBOLS[b] for b in blocks)


def hf_mtp(hf: dict) -> tuple[int, str]:
    """(MTP depths the release stores, one depth's layer symbols); (0, '') without MTP.
    transformers' default depth is attention then MoE (`NemotronHConfig.__post_init__`)."""
    stored = int(_get(hf, "num_nextn_predict_layers", 0) or 0)
    if not stored:
        return 0, ""
    blocks = hf.get("mtp_layers_block_type")
    if blocks is None:
        legacy = hf.get("mtp_hybrid_override_pattern")
        blocks = ([BLOCK_NAMES.get(symbol, symbol) for symbol in str(legacy)] if legacy
                  else ["full_attention", "moe"])
    return stored, _symbols(list(blocks), "mtp_layers_block_type")


def hf_pattern(hf: dict) -> str:
    """The layer symbols of the config's block types."""
    blocks = hf.get("layers_block_type") or hf.get("layer_types")
    if blocks is None:
        pattern = str(_get(hf, "hybrid_override_pattern"))
        blocks = [BLOCK_NAMES.get(symbol, symbol) for symbol in pattern]
    return _symbols(list(blocks), "layers_block_type")


def _limit_is_open(limit: object) -> bool:
    """time_step_limit (0, inf), as json or transformers (`{"__float__": "Infinity"}`) writes."""
    if not isinstance(limit, list | tuple) or len(limit) != 2:
        return False
    high = limit[1].get("__float__") if isinstance(limit[1], dict) else limit[1]
    return float(limit[0]) == 0.0 and math.isinf(float(high))


def _refusals(hf: dict, pattern: str) -> list[tuple[bool, str]]:
    """(does it hold, the message when not) for every feature our model cannot express."""
    topk = int(_get(hf, "num_experts_per_tok", 2))
    normalise = bool(_get(hf, "norm_topk_prob", True))
    groups = (int(_get(hf, "n_group", 1)), int(_get(hf, "topk_group", 1)))
    return [
        (_get(hf, "mlp_hidden_act", "relu2") == "relu2",
         f"mlp_hidden_act={_get(hf, 'mlp_hidden_act', '')} is not mapped; the hybrid models "
         "here build squared-ReLU MLPs (relu2)"),
        (abs(float(_get(hf, "layer_norm_epsilon", NORM_EPSILON)) - NORM_EPSILON) < 1e-12,
         f"layer_norm_epsilon={_get(hf, 'layer_norm_epsilon', '')} is not mapped; Megatron "
         f"Core's RMSNorm uses {NORM_EPSILON:g}"),
        (not any(_get(hf, name, False) for name in ("use_bias", "mlp_bias", "attention_bias")),
         "biases (use_bias, mlp_bias or attention_bias true) are not mapped; the hybrid models "
         "here have no linear biases"),
        (not _get(hf, "residual_in_fp32", False),
         "residual_in_fp32=true is not mapped; the hybrid models here keep the residual in the "
         "run's dtype"),
        (MAMBA not in pattern or _get(hf, "mamba_hidden_act", "silu") == "silu",
         f"mamba_hidden_act={_get(hf, 'mamba_hidden_act', '')} is not mapped; Megatron's Mamba "
         "mixer uses silu"),
        (MAMBA not in pattern or bool(_get(hf, "use_conv_bias", True)),
         "use_conv_bias=false is not mapped; Megatron's Mamba mixer always has a conv bias "
         "(ssm/mamba_mixer.py:275)"),
        (MAMBA not in pattern or _limit_is_open(_get(hf, "time_step_limit", [0.0, math.inf])),
         f"time_step_limit={_get(hf, 'time_step_limit', '')} is not mapped; Megatron's Mamba "
         "mixer limits dt to (0, inf)"),
        (ATTENTION not in pattern or _get(hf, "sliding_window", None) is None,
         f"sliding_window={_get(hf, 'sliding_window', None)} is not mapped; the attention "
         "layers here attend to the whole sequence"),
        (MOE not in pattern or groups == (1, 1),
         f"n_group={groups[0]} topk_group={groups[1]} (group-limited routing) is not mapped; "
         "the MoE layers here route over all experts (n_group=1 topk_group=1)"),
        (MOE not in pattern or normalise == (topk > 1),
         f"norm_topk_prob={str(normalise).lower()} with num_experts_per_tok={topk} is not "
         "mapped; Megatron's sigmoid router divides the top-k weights by their sum exactly "
         "when top-k > 1"),
    ]


def _values(hf: dict) -> dict[str, object]:
    if hf.get("model_type", "nemotron_h") != "nemotron_h":
        raise ConfigError(f"config.json model_type={hf['model_type']} with architecture "
                          f"{ARCHITECTURE}; re-download the model's config.json")
    pattern = hf_pattern(hf)
    for holds, message in _refusals(hf, pattern):
        if not holds:
            raise ConfigError(f"config.json {message}")
    found: dict[str, object] = {
        "num_layers": len(pattern), "hybrid_layer_pattern": pattern,
        "hidden_size": int(_get(hf, "hidden_size")), "vocab_size": int(_get(hf, "vocab_size")),
        "share_embeddings_and_output_weights": bool(_get(hf, "tie_word_embeddings", False)),
    }
    if ATTENTION in pattern:
        heads = int(_get(hf, "num_attention_heads"))
        found.update(num_attention_heads=heads,
                     num_query_groups=int(_get(hf, "num_key_value_heads") or heads),
                     kv_channels=int(_get(hf, "head_dim")))
    if MLP in pattern:
        found["ffn_hidden_size"] = int(_get(hf, "intermediate_size"))
    if MAMBA in pattern:
        found.update({ours: int(_get(hf, theirs)) for ours, theirs in FIELDS[MAMBA].items()
                      if ours not in ("mamba_conv_kernel", "mamba_chunk_size")})
        found["mamba_conv_kernel"] = int(_get(hf, "conv_kernel", 4))
        found["mamba_chunk_size"] = int(_get(hf, "chunk_size", 128))
    if MOE in pattern:
        found.update(
            num_moe_experts=int(_get(hf, "n_routed_experts")),
            moe_router_topk=int(_get(hf, "num_experts_per_tok")),
            moe_ffn_hidden_size=int(_get(hf, "moe_intermediate_size")),
            moe_shared_expert_ffn_hidden_size=int(_get(hf, "moe_shared_expert_intermediate_size")),
            moe_router_topk_scaling_factor=float(_get(hf, "routed_scaling_factor", 1.0)),
            moe_latent_size=(None if _get(hf, "moe_latent_size", None) is None
                             else int(_get(hf, "moe_latent_size"))),
            moe_router_score_function="sigmoid", moe_router_expert_bias=True)
    return found


def hf_values(hf: dict) -> dict[str, object]:
    """The config's values under our field names (only the layer kinds it has)."""
    return read_values(_values, hf)


def our_values(model: ModelConfig) -> dict[str, object]:
    """The recipe's values in the same conventions (defaults resolved as Megatron does)."""
    return {
        "num_layers": model.num_layers,
        "hybrid_layer_pattern": layer_symbols(model.hybrid_layer_pattern or ""),
        "hidden_size": model.hidden_size, "vocab_size": model.vocab_size,
        "share_embeddings_and_output_weights": model.share_embeddings_and_output_weights,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_query_groups or model.num_attention_heads,
        "kv_channels": model.kv_channels or model.hidden_size // model.num_attention_heads,
        "ffn_hidden_size": model.ffn_hidden_size,
        "mamba_num_heads": mamba_heads(model), "mamba_head_dim": model.mamba_head_dim,
        "mamba_num_groups": model.mamba_num_groups, "mamba_state_dim": model.mamba_state_dim,
        "mamba_conv_kernel": model.mamba_conv_kernel, "mamba_chunk_size": model.mamba_chunk_size,
        "num_moe_experts": model.num_moe_experts, "moe_router_topk": model.moe_router_topk,
        "moe_ffn_hidden_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "moe_shared_expert_ffn_hidden_size": model.moe_shared_expert_ffn_hidden_size,
        "moe_router_topk_scaling_factor": float(model.moe_router_topk_scaling_factor or 1.0),
        "moe_latent_size": model.moe_latent_size,
        "moe_router_score_function": model.moe_router_score_function,
        "moe_router_expert_bias": model.moe_router_expert_bias,
    }


def check_shaped(model: ModelConfig, where: str) -> None:
    """The NemotronH mapping covers hybrid models built the Nemotron-H way only."""
    if not model.is_hybrid:
        raise ConfigError(f"{where} is a GPT model, not a hybrid one; {ARCHITECTURE} maps to "
                          "recipes with model.hybrid_layer_pattern (e.g. the nemotron_h ones)")
    wrong = [f"model.{k}={getattr(model, k)}" for k, v in SHAPE.items() if getattr(model, k) != v]
    if wrong:
        fix = " ".join(f"model.{k}={v}" for k, v in SHAPE.items())
        raise ConfigError(f"{where} is not NemotronH-shaped ({', '.join(wrong)}); only hybrid "
                          f"models with {fix} map to {ARCHITECTURE}")


def mtp_difference(hf: dict, model: ModelConfig) -> str | None:
    """What differs between the release's MTP depths and the recipe's, or None."""
    stored, layers = read_values(hf_mtp, hf)
    built, ours = mtp_built(model), mtp_pattern(model.hybrid_layer_pattern)
    if (stored, layers) == (built, ours):
        return None
    return (f"num_nextn_predict_layers={stored} of layers '{layers}' but the recipe's pattern "
            f"stores {built} MTP depth(s) of '{ours}' "
            f"({mtp_depths(model.hybrid_layer_pattern)} run)")


def _whole(pattern: str | None) -> str:
    """A pattern's layers then its MTP depths, without stage cuts."""
    return layer_symbols(pattern or "") + "".join(MTP + part for part in mtp_parts(pattern))


def whole_pattern(hf: dict, model: ModelConfig) -> str:
    """The pattern, MTP depths included, that makes the recipe the release: its layers, then
    its stored depths; one stored depth that the recipe repeats keeps the recipe's run count."""
    stored, layers = read_values(hf_mtp, hf)
    runs = stored
    if stored == 1 and model.mtp_use_repeated_layer:
        runs = max(mtp_depths(model.hybrid_layer_pattern), 1)
    return read_values(hf_pattern, hf) + (MTP + layers) * runs


def overrides(hf: dict, model: ModelConfig) -> dict[str, object]:
    """Every override the recipe needs to be the release, the pattern given whole (its layers
    and MTP depths: one round of fixes)."""
    theirs, ours = hf_values(hf), our_values(model)
    fixes = {field: value for field, value in theirs.items() if ours[field] != value}
    pattern = whole_pattern(hf, model)
    if pattern != _whole(model.hybrid_layer_pattern):
        fixes["hybrid_layer_pattern"] = pattern
    return {**fixes, **_mtp_settings(read_values(hf_mtp, hf)[0], model)}


def _mtp_settings(stored: int, model: ModelConfig) -> dict[str, object]:
    """The MTP settings `stored` depths need: at their defaults without depths (validation
    refuses them there), unshared unless exactly one depth is stored."""
    if stored == 0:
        return {name: MTP_DEFAULTS[name] for name in MTP_DEFAULTS
                if getattr(model, name) != MTP_DEFAULTS[name]}
    return {"mtp_use_repeated_layer": False} if stored > 1 and model.mtp_use_repeated_layer else {}


def compare_with_recipe(hf: dict, model: ModelConfig, recipe: str) -> None:
    """Refuse, in one line naming each differing field and every override, a recipe that is
    not the HF model."""
    check_shaped(model, f"recipe {recipe}")
    mtp = mtp_difference(hf, model)
    refuse_differences(hf_values(hf), our_values(model), FIELD_NAMES, recipe,
                       more=[mtp] if mtp else [], fixes=overrides(hf, model))


def _mtp_fields(model: ModelConfig, config: dict) -> dict:
    """The MTP depths the export stores, in every form the imported config used."""
    built = mtp_built(model)
    fields: dict[str, object] = {"num_nextn_predict_layers": built}
    if built:
        layers = mtp_pattern(model.hybrid_layer_pattern)
        fields["mtp_layers_block_type"] = [BLOCK_NAMES[symbol] for symbol in layers]
        if "mtp_hybrid_override_pattern" in config:
            fields["mtp_hybrid_override_pattern"] = layers
    return fields


def hf_config_for(model: ModelConfig, dtype: str, base: dict | None = None) -> dict:
    """The config.json of an exported model: the imported one (`base`, kept for its token ids,
    context length and dt settings) with every mapped field set from the run's model."""
    check_shaped(model, "the checkpoint's model")
    pattern = layer_symbols(model.hybrid_layer_pattern)
    config = dict(base or {"time_step_min": 0.0})  # from scratch: Megatron's unclamped dt
    config.setdefault("max_position_embeddings", model.seq_length)
    config.update({
        "architectures": [ARCHITECTURE], "model_type": "nemotron_h", "dtype": dtype,
        "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu", "use_conv_bias": True,
        "use_bias": False, "mlp_bias": False, "attention_bias": False,
        "layer_norm_epsilon": NORM_EPSILON, "residual_in_fp32": False,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": model.moe_router_topk > 1,
        "moe_latent_size": model.moe_latent_size,
    })
    config.update(_mtp_fields(model, config))
    skip = ("hybrid_layer_pattern", "moe_router_score_function", "moe_router_expert_bias")
    for field, value in our_values(model).items():
        if value is not None and field not in skip:
            config[FIELD_NAMES[field]] = value
    blocks = [BLOCK_NAMES[symbol] for symbol in pattern]
    forms = {"layers_block_type": blocks, "layer_types": blocks, "hybrid_override_pattern": pattern}
    if not any(key in config for key in forms):
        config["layers_block_type"] = blocks
    for key, value in forms.items():  # in every form the imported config used
        if key in config:
            config[key] = value
    return config
