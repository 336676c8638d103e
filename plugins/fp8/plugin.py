"""Sets the FP8 fields on the transformer config; Transformer Engine's layers do the rest.

Megatron reads them in three places: `fp8_utils.get_fp8_recipe` builds TE's recipe object
(megatron/core/fp8_utils.py:714-770), `TransformerBlock` enters the FP8 context around all layers
for delayed scaling and per layer otherwise, which is what lets the first and last layers stay
out of FP8 (transformer/transformer_block.py:600-660, fp8_utils.py:673-689).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from plugins.protocol.errors import UserError
from plugins.protocol.hooks import Plugin


class Fp8Plugin(Plugin):
    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields  # TransformerConfig fields, from Fp8Config.transformer_fields()

    def transformer_config(self, config: Any) -> Any:
        # `replace` re-runs TransformerConfig's own checks with FP8 on. What they refuse that our
        # rules cannot see before launch (e.g. MoE FP8 without Transformer Engine >= 1.7 in a
        # dry run, transformer_config.py:2294-2299) becomes one line, not a traceback.
        try:
            return dataclasses.replace(config, **self.fields)
        except ValueError as error:
            reason = " ".join(str(error).split())
            fmt = self.fields.get("fp8") or self.fields.get("fp4")  # NVFP4 sets fp4, fp4_recipe
            recipe = self.fields.get("fp8_recipe") or self.fields.get("fp4_recipe")
            raise UserError(
                f"plugins.fp8.format={fmt} with plugins.fp8.recipe={recipe}: Megatron refuses "
                f"this transformer config: {reason}"
            ) from None
