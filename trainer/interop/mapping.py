"""Which family's tensor mapping a model goes through, with the sizes it needs.

The mappings are the families' (`trainer/models/gpt/hf_tensors.py`: Llama and Mixtral, and the
rule type and conversions every family uses; `trainer/models/hybrid/hf_tensors.py`: NemotronH).
"""

from __future__ import annotations

from recipes.config.schema import ModelConfig
from trainer.models.gpt import hf_tensors as gpt
from trainer.models.gpt.hf_tensors import Rule, Shapes
from trainer.models.hybrid import hf_tensors as hybrid


def shapes_of(model: ModelConfig, padded_vocab: int) -> Shapes:
    """The sizes every mapping of `model` needs (a hybrid model's own ones included)."""
    return Shapes.of(model, padded_vocab,
                     hybrid=hybrid.HybridShapes.of(model) if model.is_hybrid else None)


def rules(s: Shapes) -> list[Rule]:
    """Every weight of the model, in Hugging Face's file order, by its family's mapping."""
    return hybrid.rules(s) if s.hybrid is not None else gpt.rules(s)
