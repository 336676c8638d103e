"""Which family's Hugging Face mapping a model directory or a checkpoint's model goes through.

The mappings themselves are the families' (`trainer/models/gpt/hf_config.py`: Llama and
Mixtral; `trainer/models/hybrid/hf_config.py`: NemotronH); this module reads a model
directory's `config.json`, names its family from `architectures` (anything else is refused in
one line listing what is mapped), and hands each question to that family. No torch here.

Why the checks here come first: the families convert values with `int()`/`float()`/`bool()`,
which take `"64"`, `64.5` or `"false"` silently, and compare the rest with the recipe, which
would offer `override model.num_attention_heads=0` for a broken file. So before any comparison
each rule below refuses one kind of broken config.json in one line naming the key and value:
`architectures` not a list of names (`listed_architectures`); no `architectures`, where the
architecture is the one `model_type` names, as transformers' AutoConfig picks the class, if
exactly one does (`architecture_of_model_type`); a field read inside of that is not an object
or list (`"rope_scaling": "x"`, `wrong_shape`); a value of the wrong JSON type
(`wrong_type`); a size no model has, 0 or negative (`impossible_size`); and a recipe of another
architecture of the same family, Mixtral for Llama, named before any field differs
(`other_architecture`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from plugins.protocol.errors import ConfigError
from recipes.config.schema import ModelConfig
from trainer.models.gpt import hf_config as gpt
from trainer.models.hybrid import hf_config as hybrid

# A Hugging Face architecture -> our name for it (its `model_type`) and the family module
# that maps it.
ARCHITECTURES = {"LlamaForCausalLM": ("llama", gpt), "MixtralForCausalLM": ("mixtral", gpt),
                 "NemotronHForCausalLM": ("nemotron_h", hybrid)}

# The config.json scalars the mappings read, by the JSON type each must have: what the
# families state beside the code that reads them (`HF_SCALARS`, `HF_NULLABLE`).
FAMILIES = tuple({id(module): module for _, module in ARCHITECTURES.values()}.values())
SCALARS = {key: kind for family in FAMILIES for key, kind in family.HF_SCALARS.items()}
NULLABLE = set().union(*(family.HF_NULLABLE for family in FAMILIES))
# The config.json fields the mappings read inside of (`rope_scaling.factor`, each block type
# of `layers_block_type`), by the JSON shape each must have (`HF_NESTED`); null is absent.
NESTED = {key: shape for family in FAMILIES for key, shape in family.HF_NESTED.items()}
SHAPE_WORDS = {"object": "an object ({...})", "list": "a list ([...])",
               "names": "a list of names ([\"...\", ...])"}
LEAST = {"size": 1, "count": 0}  # the smallest value a model has, by kind
KIND_WORDS = {"size": "an integer", "count": "an integer", "number": "a number",
              "flag": "true or false"}


def read_hf_config(model_dir: Path) -> dict:
    """The parsed config.json of a Hugging Face model directory (one-line error otherwise)."""
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise ConfigError(f"hf={model_dir} is not a directory; point hf= at a local Hugging "
                          "Face model directory (config.json + *.safetensors)")
    if not path.is_file():
        raise ConfigError(f"hf={model_dir} is not a Hugging Face model: it has no config.json; "
                          "point hf= at the directory holding config.json and the safetensors")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} is not readable JSON ({error}); re-download the model") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} does not hold a JSON object; re-download the model")
    return config


def listed_architectures(hf: dict) -> list[str]:
    """config.json's `architectures`: a list of class names; [] when absent, null or empty."""
    names = hf.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"config.json \"architectures\": {json.dumps(names)} is not a list of "
                          "class names; write it as a list, e.g. \"architectures\": "
                          "[\"LlamaForCausalLM\"]")
    return names


def architecture_of_model_type(hf: dict) -> str:
    """The architecture a config.json without `architectures` is loaded as: the one its
    `model_type` names (transformers' AutoConfig maps model_type to the class), if just one."""
    model_type = hf.get("model_type")
    if model_type is None:
        raise ConfigError("config.json has neither architectures nor model_type; add the "
                          "model's class, e.g. \"architectures\": [\"LlamaForCausalLM\"]")
    named = [name for name, (ours, _) in ARCHITECTURES.items() if ours == model_type]
    if len(named) != 1:
        supported = ", ".join(f"{ours} ({name})" for name, (ours, _) in ARCHITECTURES.items())
        raise ConfigError(f"config.json has no architectures and its model_type "
                          f"{json.dumps(model_type)} is not mapped; supported: {supported}")
    return named[0]


def architecture(hf: dict) -> str:
    """config.json's first mapped architecture (`LlamaForCausalLM`), or without
    `architectures` the one its `model_type` names; others are refused."""
    names = listed_architectures(hf)
    if not names:
        return architecture_of_model_type(hf)
    mapped = [name for name in names if name in ARCHITECTURES]
    if not mapped:
        raise ConfigError(f"architecture {', '.join(names)} is not mapped; supported: "
                          f"{', '.join(ARCHITECTURES)}")
    return mapped[0]


def _with_architecture(hf: dict) -> dict:
    """The config as the families read it: `architectures` naming the mapped one (a Mixtral
    config.json with only model_type is read as MoE)."""
    return {**hf, "architectures": [architecture(hf)]}


def _kind(value: object) -> str:
    """The JSON type of a value, as an error names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a decimal number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _lookup(hf: dict, key: str) -> tuple[bool, object]:
    """(present, value) of a key, `rope_scaling.factor` inside its object; absent inside
    anything else (`wrong_shape` names an outer value that is not an object)."""
    outer, _, inner = key.partition(".")
    if not inner:
        return key in hf, hf.get(key)
    nested = hf.get(outer)
    if not isinstance(nested, dict):
        return False, None
    return inner in nested, nested.get(inner)


def _shown(value: object, limit: int = 60) -> str:
    """A value as config.json writes it, cut at `limit` characters (a long list of blocks)."""
    text = json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _shape_miss(value: object, shape: str) -> str | None:
    """What `value` is where `shape` is wanted ("a string", "a list holding 3, an integer");
    None when it has that shape."""
    if shape == "object":
        return None if isinstance(value, dict) else _kind(value)
    if not isinstance(value, list):
        return _kind(value)
    odd = [item for item in value if not isinstance(item, str)] if shape == "names" else []
    return f"a list holding {_shown(odd[0], 20)}, {_kind(odd[0])}" if odd else None


def wrong_shape(hf: dict) -> str | None:
    """The line naming the first field the mappings read inside of (`NESTED`) whose value has
    the wrong JSON shape (`"rope_scaling": "x"`, a string where an object is read); None when
    every one is right or null. Checked before any value inside is looked up."""
    for key, shape in NESTED.items():
        value = hf.get(key)
        miss = None if value is None else _shape_miss(value, shape)
        if miss:
            words = SHAPE_WORDS[shape]
            return (f"config.json {key}={_shown(value)} is {miss}, not {words}; write it as "
                    f"{words} or null, or re-download the model's config.json")
    return None


def wrong_type(hf: dict) -> str | None:
    """The line naming the first read value of the wrong JSON type (a string, a decimal, a
    boolean or null where an integer is needed, ...); None when every one is right."""
    wanted = [(key, KIND_WORDS[kind]) for key, kind in SCALARS.items()]
    for key, kind in wanted:
        present, value = _lookup(hf, key)
        if not present or (value is None and key in NULLABLE):
            continue
        right = {"an integer": isinstance(value, int) and not isinstance(value, bool),
                 "a number": isinstance(value, int | float) and not isinstance(value, bool),
                 "true or false": isinstance(value, bool)}[kind]
        if not right:
            return (f"config.json {key}={json.dumps(value)} is {_kind(value)}, not {kind}; "
                    f"write it as {kind} (no quotes) or re-download the model's config.json")
    return None


def impossible_size(hf: dict) -> str | None:
    """The line naming the first size below 1 (a count below 0) that no model has: config.json
    is broken, not a model that a recipe override could become; None when all are possible."""
    for key, kind in SCALARS.items():
        value, least = hf.get(key), LEAST.get(kind)
        if least is not None and isinstance(value, int) and value < least:
            return (f"config.json {key}={value} is no model's size (at least {least}): the "
                    "file is broken; re-download the model's config.json")
    return None


def check_values(hf: dict) -> None:
    """Refuse a config.json field of the wrong shape, a value of the wrong type or an
    impossible size, in one line (the first rule that finds one; each reads only what the
    ones before it passed)."""
    for rule in (wrong_shape, wrong_type, impossible_size):
        problem = rule(hf)
        if problem:
            raise ConfigError(problem)


def _architecture(hf: dict) -> tuple[str, ModuleType]:
    return ARCHITECTURES[architecture(hf)]


def family(hf: dict) -> str:
    """'llama', 'mixtral' or 'nemotron_h' from the config's `architectures`; anything else is
    refused."""
    return _architecture(hf)[0]


def _module_for(model: ModelConfig) -> ModuleType:
    return hybrid if model.is_hybrid else gpt


FAMILY_KINDS = {gpt: "GPT", hybrid: "hybrid"}  # what `model.hybrid_layer_pattern` decides


def other_family(hf: dict, model: ModelConfig, recipe: str, example: str | None) -> str | None:
    """The line for a recipe of the other family than the HF model's (a hybrid recipe for a
    Llama, a GPT one for a NemotronH): what each is and a recipe of the model's family, whose
    fields the family's own check then compares; None when the families agree."""
    theirs, ours = FAMILY_KINDS[_architecture(hf)[1]], FAMILY_KINDS[_module_for(model)]
    if theirs == ours:
        return None
    fix = (f"import it with one, e.g. recipe={example} (recipe=list shows them)" if example
           else "import it with one (recipe=list shows them)")
    return (f"recipe {recipe} is a {ours} model, not a {theirs} one: config.json's "
            f"{architecture(hf)} imports into {theirs} recipes only; {fix}")


def recipe_architecture(model: ModelConfig) -> str | None:
    """The architecture a recipe's model exports as; None if it is shaped as none."""
    try:
        return hf_config_for(model, "bfloat16")["architectures"][0]
    except ConfigError:  # not Llama-, Mixtral- or NemotronH-shaped: its family check says so
        return None


def other_architecture(hf: dict, model: ModelConfig, recipe: str,
                       example: str | None) -> str | None:
    """The line for a recipe of another architecture of the same family (Mixtral for a
    Llama): that alone, not the fields that differ with it; None when they agree or the
    recipe is shaped as no architecture."""
    name, ours = architecture(hf), recipe_architecture(model)
    if ours is None or ours == name:
        return None
    wanted, got = ARCHITECTURES[name][0], ARCHITECTURES.get(ours, (ours,))[0]
    fix = f"e.g. recipe={example}" if example else "convert.py --help lists them"
    return (f"config.json's {name} needs a {wanted} recipe and recipe={recipe} is {got}; "
            f"import it with a {wanted} recipe, {fix}")


def example_recipe(hf: dict) -> str | None:
    """A recipe for this HF model: the first whose model matches config.json field by field,
    else the first whose model exports as its architecture (`hf_config_for`); None if none."""
    from recipes.registry import RECIPES, get_recipe

    name, family = architecture(hf), _architecture(hf)[1]
    hf = _with_architecture(hf)
    same = []
    for recipe in RECIPES:
        model = get_recipe(recipe).model
        try:
            if hf_config_for(model, "bfloat16")["architectures"][0] != name:
                continue
            same.append(recipe)
            family.compare_with_recipe(hf, model, recipe)
        except ConfigError:  # not of this architecture's shape, or other fields
            continue
        return recipe
    return same[0] if same else None


def compare_with_recipe(hf: dict, model: ModelConfig, recipe: str) -> None:
    """Refuse, in one line naming each differing field, a recipe that is not the HF model (a
    broken config.json first, `check_values`; a recipe of the other family or architecture:
    naming one of the model's, `other_family`, `other_architecture`)."""
    check_values(hf)
    if _module_for(model) is not _architecture(hf)[1]:
        raise ConfigError(other_family(hf, model, recipe, example_recipe(hf)))
    if recipe_architecture(model) not in (None, architecture(hf)):
        raise ConfigError(other_architecture(hf, model, recipe, example_recipe(hf)))
    _architecture(hf)[1].compare_with_recipe(_with_architecture(hf), model, recipe)


def check_exportable(model: ModelConfig, where: str) -> None:
    """A hybrid model exports as NemotronH, a GPT one as Llama or Mixtral, if shaped so."""
    _module_for(model).check_shaped(model, where)


def hf_config_for(model: ModelConfig, dtype: str, base: dict | None = None) -> dict:
    """The config.json of an exported model, from its family's mapping."""
    return _module_for(model).hf_config_for(model, dtype, base)
