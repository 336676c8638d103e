"""Benchmark: how documents share samples — concatenate-and-cut vs exact packing, same corpus.

usage: python scripts/bench_documents.py blend=conf/data/<blend>.yaml [steps=N] [recipe=NAME]

    python scripts/bench_documents.py blend=conf/data/python_stdlib.yaml steps=20

For the blend's training datasets at the recipe's sequence length it prints, per mode:
documents cut across samples (concatenate: every document that straddles a sample boundary;
packing: documents longer than a pack, split), padding tokens, efficiency (document tokens /
row tokens), loss tokens per row, and the median step time and effective tokens/s of `steps`
training steps (micro-batch 1 in every mode, so the rows compare one to one). Modes:
`concatenate` (Megatron's GPTDataset: documents attend across the cut), `inter_document` (the
same samples, attention kept inside documents through cu_seqlens), `packed` (whole documents
packed best-fit-decreasing; padding fills the rest of a row). Then each mode's step time and
effective tokens/s as a ratio to concatenate's, measured in the same run.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_DOCUMENTS  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCH_DOCUMENTS))
