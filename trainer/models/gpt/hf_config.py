"""The GPT family's Hugging Face config: `config.json` of Llama and Mixtral <-> our `ModelConfig`.

Why: a converted checkpoint is only right if the recipe builds the very model the published
weights were trained as. Field by field, the Hugging Face names are matched to the recipe's
(`num_hidden_layers` <-> `model.num_layers`, ...) and every difference is named in one line, with
the override that fixes it. What Megatron Core fixes and the schema does not carry (RMSNorm
epsilon 1e-5, SiLU-gated MLP, no biases) must hold in the Hugging Face config, else the import is
refused. RoPE scaling maps only Llama 3.1's `llama3` rule with its published constants, the one
Megatron Core implements (`models/common/embeddings/rotary_pos_embedding.py:92-124`). Mixtral is
Llama with MoE layers (`num_local_experts`, `num_experts_per_tok`). `read_values` and
`refuse_differences` serve every family's mapping. No torch here: configs are checked before
any heavy import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import as_written
from recipes.config.schema import ModelConfig

NORM_EPSILON = 1e-5  # Megatron Core's layernorm_epsilon default (the schema has no field)
# Llama 3.1's `llama3` RoPE scaling constants, as Megatron Core hard-codes them.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


# The config.json scalars this mapping reads, by the JSON type each must have: a size (an
# integer of at least 1), a count (at least 0), a number or a flag (`trainer/interop/hf_config.py`
# refuses another type before any value here is converted); NULLABLE ones may be null.
HF_SCALARS = {
    **dict.fromkeys(("num_hidden_layers", "hidden_size", "intermediate_size",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                     "num_local_experts", "num_experts_per_tok"), "size"),
    **dict.fromkeys(("rope_theta", "rms_norm_eps", "partial_rotary_factor",
                     *(f"{rope}.{key}" for rope in ("rope_parameters", "rope_scaling")
                       for key in ("rope_theta", "factor", *LLAMA3_ROPE))), "number"),
    **dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias"), "flag"),
}
HF_NULLABLE = {"num_key_value_heads", "head_dim"}
# The config.json fields this mapping reads inside of, by the JSON shape each must have (an
# object; `trainer/interop/hf_config.py` refuses another before any is read); null is absent.
HF_NESTED = dict.fromkeys(("rope_parameters", "rope_scaling"), "object")


def _rope(hf: dict) -> dict:
    """transformers 5 writes `rope_parameters`; published configs `rope_theta`/`rope_scaling`."""
    rope = dict(hf.get("rope_parameters") or {})
    rope.update(hf.get("rope_scaling") or {})
    if "rope_theta" in hf:
        rope.setdefault("rope_theta", hf["rope_theta"])
    return rope


def rope_scaling_factor(hf: dict) -> float | None:
    rope = _rope(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    constants = {key: float(rope.get(key, -1)) for key in LLAMA3_ROPE}
    if kind != "llama3" or constants != LLAMA3_ROPE:
        raise ConfigError(f"RoPE scaling {rope} is not mapped; only Llama 3.1's llama3 rule with "
                          f"{LLAMA3_ROPE} is (Megatron Core implements only that one)")
    return float(rope["factor"])


def _check_fixed(hf: dict) -> None:
    """What Megatron Core fixes and our schema does not carry must hold in the HF config."""
    fixed = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    for name, wanted in fixed.items():
        if hf.get(name, wanted) != wanted:
            raise ConfigError(f"config.json {name}={hf[name]} is not mapped; the trainer builds "
                              f"{name}={wanted} (Llama/Mixtral shape)")
    share = float(hf.get("partial_rotary_factor", 1.0))
    if share != 1.0:
        raise ConfigError(f"config.json partial_rotary_factor={share:g} is not mapped; Llama and "
                          "Mixtral rotate the whole head (model.rotary_percent=1.0)")
    eps = float(hf.get("rms_norm_eps", NORM_EPSILON))
    if abs(eps - NORM_EPSILON) > 1e-12:
        raise ConfigError(f"config.json rms_norm_eps={eps:g} is not mapped; Megatron Core's "
                          f"RMSNorm uses {NORM_EPSILON:g} (Llama 3 and Mixtral)")


# Our `ModelConfig` field -> the Hugging Face config's name for it.
FIELD_NAMES = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",  # Mixtral: the width of one expert
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "vocab_size": "vocab_size",
    "rotary_base": "rope_theta",
    "rope_scaling_factor": "rope_scaling.factor",
    "share_embeddings_and_output_weights": "tie_word_embeddings",
    "num_moe_experts": "num_local_experts",
    "moe_router_topk": "num_experts_per_tok",
}


def hf_values(hf: dict) -> dict[str, object]:
    """The HF config's values under our field names, defaults resolved as transformers does."""
    return read_values(_values, hf)


def read_values(read: Callable[[dict], dict[str, object]], hf: dict) -> dict[str, object]:
    """`read(hf)`, with a missing or malformed config.json field as one line (every family)."""
    try:
        return read(hf)
    except ConfigError:  # already one line naming what is refused
        raise
    except KeyError as missing:
        raise ConfigError(f"config.json lacks field {missing.args[0]}; re-download the model's "
                          "config.json") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"config.json has a malformed field ({error}); re-download the "
                          "model's config.json") from None


def _values(hf: dict) -> dict[str, object]:
    _check_fixed(hf)
    moe = "MixtralForCausalLM" in (hf.get("architectures") or [hf.get("model_type")])
    heads = int(hf["num_attention_heads"])
    return {
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": int(hf["hidden_size"]),
        "ffn_hidden_size": int(hf["intermediate_size"]),
        "num_attention_heads": heads,
        "num_query_groups": int(hf.get("num_key_value_heads") or heads),
        "kv_channels": int(hf.get("head_dim") or hf["hidden_size"] // heads),
        "vocab_size": int(hf["vocab_size"]),
        "rotary_base": float(_rope(hf).get("rope_theta", 10000.0)),
        "rope_scaling_factor": rope_scaling_factor(hf),
        "share_embeddings_and_output_weights": bool(hf.get("tie_word_embeddings", False)),
        "num_moe_experts": int(hf["num_local_experts"]) if moe else None,
        "moe_router_topk": int(hf["num_experts_per_tok"]) if moe else None,
    }


def our_values(model: ModelConfig) -> dict[str, object]:
    """The recipe's values in the same conventions (defaults resolved as Megatron does)."""
    moe = model.num_moe_experts is not None
    return {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": (model.moe_ffn_hidden_size or model.ffn_hidden_size),
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_query_groups or model.num_attention_heads,
        "kv_channels": model.kv_channels or model.hidden_size // model.num_attention_heads,
        "vocab_size": model.vocab_size,
        "rotary_base": float(model.rotary_base),
        "rope_scaling_factor": model.rope_scaling_factor,
        "share_embeddings_and_output_weights": model.share_embeddings_and_output_weights,
        "num_moe_experts": model.num_moe_experts,
        "moe_router_topk": model.moe_router_topk if moe else None,
    }


def check_shaped(model: ModelConfig, where: str) -> None:
    """The mappings cover SwiGLU, RMSNorm (plain gamma), RoPE over the whole head, bias-free
    blocks only (Nemotron-4's half-rotated heads and LayerNorm1p have no Llama form)."""
    wanted = {"activation": "swiglu", "normalization": "RMSNorm", "position_embedding": "rope",
              "add_bias_linear": False, "rotary_percent": 1.0,
              "layernorm_zero_centered_gamma": False}
    wrong = [f"model.{k}={getattr(model, k)}" for k, v in wanted.items() if getattr(model, k) != v]
    if wrong:
        fix = " ".join(f"model.{k}={v}" for k, v in wanted.items())
        raise ConfigError(f"{where} is not Llama/Mixtral-shaped ({', '.join(wrong)}); only "
                          f"models with {fix} map to Hugging Face")


def _text(value: object) -> str:
    """A compared value as an override writes it. `rotary_base` is compared as a float
    (config.json writes rope_theta either way) though the schema's field is an integer, whose
    override refuses `500000.0`: a whole float is written as the integer it is."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return as_written(value)


def compare_with_recipe(hf: dict, model: ModelConfig, recipe: str) -> None:
    """Refuse, in one line naming each differing field, a recipe that is not the HF model."""
    check_shaped(model, f"recipe {recipe}")
    refuse_differences(hf_values(hf), our_values(model), FIELD_NAMES, recipe)


def refuse_differences(theirs: dict, ours: dict, names: dict[str, str], recipe: str, *,
                       more: Sequence[str] = (), fixes: dict | None = None) -> None:
    """One line naming every field where the HF config (`theirs`) and the recipe differ, with
    the overrides that make the recipe the HF model; nothing when they agree. A family adds
    the differences its fields do not show (`more`: a hybrid's MTP depths) and, where the
    differing fields' values are not the whole fix, the overrides (`fixes`, field -> value)."""
    differing = {field: value for field, value in theirs.items() if ours[field] != value}
    diffs = [f"{names[field]}={_text(value)} but model.{field}={_text(ours[field])}"
             for field, value in differing.items()] + list(more)
    if diffs:
        named = " ".join(f"model.{field}={_text(value)}"
                         for field, value in (differing if fixes is None else fixes).items())
        raise ConfigError(f"the Hugging Face model does not match recipe {recipe}: "
                          f"{'; '.join(diffs)}; pick a recipe of this shape or override {named}")


def _rope_fields(model: ModelConfig) -> dict:
    scaling = None
    if model.rope_scaling_factor is not None:
        scaling = {"rope_type": "llama3", "factor": model.rope_scaling_factor, **LLAMA3_ROPE}
    return {"rope_theta": float(model.rotary_base), "rope_scaling": scaling}


def hf_config_for(model: ModelConfig, dtype: str, base: dict | None = None) -> dict:
    """The config.json of an exported model: the imported one (`base`, kept for its tokenizer
    ids and context length) with every mapped field set from the run's model."""
    check_shaped(model, "the checkpoint's model")
    moe = model.num_moe_experts is not None
    config = {key: value for key, value in (base or {}).items() if key != "rope_parameters"}
    config.setdefault("max_position_embeddings", model.seq_length)
    config.update({
        "architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
        "model_type": "mixtral" if moe else "llama",
        "hidden_act": "silu",
        "rms_norm_eps": NORM_EPSILON,
        "attention_bias": False,
        "dtype": dtype,
        **_rope_fields(model),
    })
    for field, value in our_values(model).items():
        if value is not None and field not in ("rotary_base", "rope_scaling_factor"):
            config[FIELD_NAMES[field]] = value
    if not moe:
        config["mlp_bias"] = False
    return config
