"""Tokenize local text, JSONL or Parquet into Megatron Core indexed datasets (.bin/.idx).

usage: python scripts/prepare_data.py input=FILES output=PREFIX tokenizer=TOKENIZER [key=value ...]

    python scripts/prepare_data.py input='data/*.jsonl' output=data/corpus tokenizer=train:32000
    python scripts/prepare_data.py input=books/ output=data/books tokenizer=llama3/ num_proc=8
    python scripts/prepare_data.py input=a.parquet,b.parquet output=data/ab \\
        tokenizer=data/corpus.tokenizer.json text_field=content

arguments:
  input=       files, a folder (searched recursively) or a glob; several joined by commas.
               .txt/.text/.md, .jsonl/.json/.ndjson, .parquet, optionally .gz/.bz2/.xz/.zst
  output=      prefix of what is written (its folder is created):
                 <output>_<name>.bin/.idx   one Megatron indexed dataset per input file, <name>
                                            = the file's path below the inputs' common folder
                                            without suffixes ('/' -> '_')
                 <output>.json              manifest: shards (prefix relative to this file's
                                            folder, documents, tokens), a blend, eod id, dtype
                 <output>.tokenizer.json    the tokenizer the ids come from
  tokenizer=   a tokenizer.json, a Hugging Face tokenizer folder holding one, or train:VOCAB
               (a byte-level BPE of VOCAB tokens trained on these inputs, offline)
  text_field=  JSONL/Parquet field holding the text (default text)
  sample_by=   text files: one document per line, paragraph or document (default line)
  num_proc=    tokenizing processes (default 1)
  shard_size=  documents per dataset: datasets become <output>_<name>_00000, _00001, ...
               (default null: one dataset per input file)
  eod_token=   end-of-document token (default: the tokenizer's own, e.g. <|endoftext|>,
               <|end_of_text|>, </s>; <|endoftext|> is added when it has none)
  seed=        set before any step (default 1234)
  packing.seq_length=    also write an exact pack index for rows of that many tokens beside
                         every dataset (packs, lower bound and efficiency in the summary)
  packing.pad_multiple=  with packing.seq_length: pad each document to a multiple of this
                         many tokens in the packs (context parallel needs 2 x CP; default 1)

Every document becomes one sequence: the tokenizer's encoding of it (its own special tokens,
e.g. a BOS, included) followed by one end-of-document id. Empty and whitespace-only documents
are skipped and counted. Datasets are published by rename only when complete; the same inputs
give byte-identical outputs. A mistake prints `error: <one line>` and exits with code 2.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import PREPARE_DATA  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # datasets' worker processes import this file: keep the guard
    sys.exit(main(PREPARE_DATA))
