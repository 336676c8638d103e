"""The tokenizer a preparation writes with: a Hugging Face `tokenizers` file, or a byte-level
BPE trained on the corpus, and the one end-of-document (EOD) id appended to every document.

Why these choices:
- Only the Rust `tokenizers` library is used (no `transformers`): it reads every modern
  tokenizer.json and trains BPE offline, so nothing is downloaded.
- The EOD is the tokenizer's own end-of-text special token (eod_token= names another); a
  tokenizer without one gets `<|endoftext|>` added as a special token, and the tokenizer actually
  used is saved beside the output so training reads the same ids.
- Training is deterministic, so it keeps the library's thread pool: word and pair counts are
  sums (the order threads add them in does not matter), merges are taken in a fixed order (the
  highest count, ties broken by the pair's ids) and the byte alphabet is fixed. Checked: the
  same tokenizer.json byte for byte across processes and with TOKENIZERS_PARALLELISM on and
  off (3 MiB of stdlib source, vocab 4000), and by the tests (a second process).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.config import TOKENIZER_FILE, TRAIN_PREFIX, PrepareConfig
from plugins.protocol.errors import ConfigError
from recipes.config.dataset_files import EOD_CANDIDATES, configured_eos

DEFAULT_EOD = EOD_CANDIDATES[0]  # GPT-2's end of text; the trained tokenizer's id 0
PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


@dataclass(frozen=True)
class PreparedTokenizer:
    """A tokenizer, its end-of-document token and the id range the datasets must hold."""

    tokenizer: Tokenizer
    eod_id: int
    eod_token: str
    eod_added: bool  # the token was not in the tokenizer and was added as a special token
    vocab_size: int  # largest id + 1 (what the indexed dataset's dtype must hold)
    source: str  # the tokenizer= text it came from


def tokenizer_file(spec: str) -> Path:
    """The tokenizer.json that `tokenizer=` names (a file, or a folder holding one)."""
    path = Path(spec).expanduser()
    return path / TOKENIZER_FILE if path.is_dir() else path


def load_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer from a tokenizer.json file or a folder holding one; one-line error if not."""
    path = tokenizer_file(spec)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust parser raises plain Exceptions with serde's message
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        named = f"tokenizer={spec}" + ("" if str(path) == spec else f": {path}")
        raise ConfigError(
            f"{named} cannot be loaded as a Hugging Face tokenizers file ({reason}); "
            "expected a tokenizer.json saved by `tokenizers` or `transformers`"
        ) from None


@contextmanager
def serial_tokenizers() -> Iterator[None]:
    """Turn the Rust library's thread pool off for the block (it reads the variable per call,
    and worker processes forked inside the block inherit it)."""
    before = os.environ.get(PARALLELISM_ENV)
    os.environ[PARALLELISM_ENV] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARALLELISM_ENV, None)
        else:
            os.environ[PARALLELISM_ENV] = before


def train_byte_level_bpe(texts: Iterable[str | list[str]], vocab: int,
                         length: int | None = None) -> Tokenizer:
    """A GPT-2-style byte-level BPE with `vocab` ids at most: `<|endoftext|>` is id 0, the 256
    byte symbols follow, then the merges (fewer if the corpus runs out of pairs)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[DEFAULT_EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    return tokenizer


def _special_tokens(tokenizer: Tokenizer) -> list[str]:
    return [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]


def choose_eod(tokenizer: Tokenizer, cfg: PrepareConfig) -> tuple[int, str, bool]:
    """(id, token, added): eod_token= if given (it must exist), else the folder's configured
    eos token, else the first known end-of-text token the tokenizer has, else DEFAULT_EOD
    added as a new special token."""
    if cfg.eod_token is not None:
        token_id = tokenizer.token_to_id(cfg.eod_token)
        if token_id is None:
            specials = ", ".join(_special_tokens(tokenizer)[:8]) or "none"
            raise ConfigError(
                f"eod_token={cfg.eod_token} is not a token of tokenizer={cfg.tokenizer}; name "
                f"one of its special tokens ({specials}) or leave eod_token unset"
            )
        return token_id, cfg.eod_token, False
    configured = configured_eos(cfg.tokenizer) if cfg.train_vocab is None else None
    for token in (configured, *EOD_CANDIDATES):
        token_id = tokenizer.token_to_id(token) if token else None
        if token_id is not None:
            return token_id, token, False
    tokenizer.add_special_tokens([AddedToken(DEFAULT_EOD, special=True, normalized=False)])
    return tokenizer.token_to_id(DEFAULT_EOD), DEFAULT_EOD, True


def id_range(tokenizer: Tokenizer) -> int:
    """Largest token id + 1 (added tokens may sit above the model's vocabulary)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def prepare_tokenizer(cfg: PrepareConfig, texts: Iterable[str | list[str]] | None = None,
                      length: int | None = None) -> PreparedTokenizer:
    """Load `cfg.tokenizer`, or train one on `texts` for `train:VOCAB`; choose the EOD."""
    if cfg.tokenizer.startswith(TRAIN_PREFIX):
        if cfg.train_vocab is None or texts is None:
            raise ConfigError(f"tokenizer={cfg.tokenizer}: give train:VOCAB, e.g. train:32000")
        tokenizer = train_byte_level_bpe(texts, cfg.train_vocab, length)
    else:
        tokenizer = load_tokenizer(cfg.tokenizer)
    eod_id, eod_token, added = choose_eod(tokenizer, cfg)
    return PreparedTokenizer(
        tokenizer=tokenizer, eod_id=eod_id, eod_token=eod_token, eod_added=added,
        vocab_size=id_range(tokenizer), source=cfg.tokenizer,
    )
