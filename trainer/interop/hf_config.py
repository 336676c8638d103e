"""Which family's Hugging Face mapping a model directory or a checkpoint's model goes through.

The mappings themselves are the families' (`trainer/models/gpt/hf_config.py`: Llama and
Mixtral; `trainer/models/hybrid/hf_config.py`: NemotronH); this module reads a model
directory's `config.json`, names its family from `architectures` (anything else is refused in
one line listing what is mapped), and hands each question to that family. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from plugins.protocol.errors import ConfigError
from recipes.config.schema import ModelConfig
from trainer.models.gpt import hf_config as gpt
from trainer.models.hybrid import hf_config as hybrid

# A Hugging Face architecture -> our name for it and the family module that maps it.
ARCHITECTURES = {"LlamaForCausalLM": ("llama", gpt), "MixtralForCausalLM": ("mixtral", gpt),
                 "NemotronHForCausalLM": ("nemotron_h", hybrid)}


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


def architecture(hf: dict) -> str:
    """config.json's first mapped architecture (`LlamaForCausalLM`); others are refused."""
    names = hf.get("architectures") or [hf.get("model_type", "?")]
    mapped = [name for name in names if name in ARCHITECTURES]
    if not mapped:
        raise ConfigError(f"architecture {', '.join(map(str, names))} is not mapped; supported: "
                          f"{', '.join(ARCHITECTURES)}")
    return mapped[0]


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


def example_recipe(hf: dict) -> str | None:
    """A recipe for this HF model: the first whose model matches config.json field by field,
    else the first whose model exports as its architecture (`hf_config_for`); None if none."""
    from recipes.registry import RECIPES, get_recipe

    name, family = architecture(hf), _architecture(hf)[1]
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
    recipe of the other family: naming one of the model's, `other_family`)."""
    if _module_for(model) is not _architecture(hf)[1]:
        raise ConfigError(other_family(hf, model, recipe, example_recipe(hf)))
    _architecture(hf)[1].compare_with_recipe(hf, model, recipe)


def check_exportable(model: ModelConfig, where: str) -> None:
    """A hybrid model exports as NemotronH, a GPT one as Llama or Mixtral, if shaped so."""
    _module_for(model).check_shaped(model, where)


def hf_config_for(model: ModelConfig, dtype: str, base: dict | None = None) -> dict:
    """The config.json of an exported model, from its family's mapping."""
    return _module_for(model).hf_config_for(model, dtype, base)
