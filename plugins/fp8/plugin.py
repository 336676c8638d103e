"""Sets the FP8 format on the transformer config; Transformer Engine's layers do the rest."""

from __future__ import annotations

import dataclasses
from typing import Any

from plugins.protocol import Plugin


class Fp8Plugin(Plugin):
    def __init__(self, fp8_format: str) -> None:
        self.fp8_format = fp8_format  # Megatron's TransformerConfig.fp8: 'hybrid' or 'e4m3'

    def transformer_config(self, config: Any) -> Any:
        # `replace` re-runs TransformerConfig's own checks with FP8 on.
        return dataclasses.replace(config, fp8=self.fp8_format)
