"""Tokenize local text, JSONL or Parquet into Megatron Core indexed datasets (.bin/.idx).

usage: python scripts/prepare_data.py input=FILES output=PREFIX tokenizer=TOKENIZER [key=value ...]

    python scripts/prepare_data.py input='data/*.jsonl' output=data/corpus tokenizer=train:32000
    python scripts/prepare_data.py input='web/*.jsonl.zst' output=data/web/web tokenizer=llama3/ \\
        num_shards=128 valid_shards=1 test_shards=1 num_proc=8
    python scripts/prepare_data.py input='web/*.parquet' output=/shared/web/web tokenizer=llama3/ \\
        num_shards=128 executor=ray ray_address=ray://head:10001
    python scripts/prepare_data.py input=a.parquet,b.parquet output=data/ab \\
        tokenizer=data/corpus.tokenizer text_field=content

arguments:
  input=       files, a folder (searched recursively) or a glob; several joined by commas.
               .txt/.text/.md, .jsonl/.json/.ndjson, .parquet, optionally .gz/.bz2/.xz/.zst
               (a UTF-8 byte order mark opening a file is dropped, as utf-8-sig reads it)
  output=      prefix of what is written (its folder is created):
                 <output>_<name>.bin/.idx   one Megatron indexed dataset per input file, <name>
                                            = the file's path below the inputs' common folder
                                            without suffixes ('/' -> '_'); with num_shards:
                                            <output>_train_00000 ..., _valid_..., _test_...
                 <output>.json              manifest: shards of each split (prefix relative to
                                            this file's folder, documents, tokens, checksums),
                                            a blend, eod id, vocabulary, dtype
                 <output>.tokenizer/        the tokenizer the ids come from, as a Hugging Face
                                            folder (tokenizer.json, tokenizer_config.json)
                 <output>.data-args         Megatron-LM's --data-args-path file (train)
                 <output>.per-split-data-args.json   its --per-split-data-args-path file
                 <output>.shards/           one record per shard (what a re-run keeps)
  tokenizer=   a tokenizer.json, a Hugging Face tokenizer folder holding one, or train:VOCAB
               (a byte-level BPE of VOCAB tokens trained on these inputs, offline)
  text_field=  JSONL/Parquet field holding the text (default text); a Parquet column may be
               string, large_string, string_view or a dictionary of strings (pandas category);
               refused where no input is JSONL or Parquet
  sample_by=   text files: one document per line, paragraph or document (default line);
               refused where no input is a text file
  num_shards=  train shards of about equal tokens, cut in document order over all inputs
               (default null: one shard per input file)
  valid_shards=, test_shards=  held-out shards: a document goes to valid when the CRC-32 of its
               text modulo round(1/held_out_fraction) is the largest residue, to test when it is
               the one below (empty documents stay in train; default 0: none)
  held_out_fraction=  share of documents for valid, and again for test (default 0.01)
  num_proc=    workers: shards written at once (default 1)
  executor=    local (a process pool, default) or ray (one Ray task per shard)
  ray_address= executor=ray: the cluster (default RAY_ADDRESS, else a local Ray for the run)
  empty_documents=  keep (zero-length documents, as Megatron-LM writes them; default) or skip
  shard_size=  documents per dataset: datasets become <output>_<name>_00000, _00001, ...
               (default null: one dataset per input file; not with num_shards)
  eod_token=   end-of-document token (default: the tokenizer's own, e.g. <|endoftext|>,
               <|end_of_text|>, </s>; <|endoftext|> is added when it has none)
  seed=        set before any step (default 1234)
  packing.seq_length=    also write an exact pack index for rows of that many tokens beside
                         every dataset (packs, lower bound and efficiency in the summary)
  packing.pad_multiple=  with packing.seq_length: pad each document to a multiple of this
                         many tokens in the packs (context parallel needs 2 x CP; default 1)
                         (pack_size= and pad_multiple= are older spellings of these two keys)

Every document becomes one sequence: the tokenizer's encoding of it (its own special tokens,
e.g. a BOS, included) followed by one end-of-document id, as Megatron-LM's preprocess_data
--append-eod writes it; an empty document is a zero-length document. Datasets are published by
rename only when complete, each shard with a record of its checksums: after a kill the same
command redoes only the shards that are not complete, and the same inputs give byte-identical
outputs whatever the executor and workers. A mistake prints `error: <one line>`, exit code 2.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import PREPARE_DATA  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # datasets' worker processes import this file: keep the guard
    sys.exit(main(PREPARE_DATA))
