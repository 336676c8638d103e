"""The tokenizer a preparation writes with: a Hugging Face `tokenizers` file, or a byte-level
BPE trained on the corpus, and the one end-of-document (EOD) id appended to every document.

Why these choices:
- Only the Rust `tokenizers` library is used (no `transformers`): it reads every modern
  tokenizer.json and trains BPE offline, so nothing is downloaded.
- The EOD is the tokenizer's own end-of-text special token (eod_token= names another); a
  tokenizer without one gets `<|endoftext|>` added as a special token, and the tokenizer actually
  used is saved beside the output so training reads the same ids.
- eod_token= must name a special (added) token: an ordinary word (`the`) would end a document at
  every occurrence (loss masking, packing, attention resets). A folder's tokenizer_config.json
  is read as transformers reads it: a damaged one is refused (transformers cannot load the
  folder either), and an eos_token its tokenizer.json lacks is refused rather than replaced by
  another end-of-text token (transformers would add it as a new id, so the two would disagree).
- Training shows a rich bar (MiB of text read, then the merges) when the output is a terminal,
  as the preparation's own bars do; the library's own bar is not used (it counts nothing it can
  know from an iterator: "0 / 0"), and logs and tests get no bar at all.
- Training is deterministic, so it keeps the library's thread pool: word and pair counts are
  sums (the order threads add them in does not matter), merges are taken in a fixed order (the
  highest count, ties broken by the pair's ids) and the byte alphabet is fixed. Checked: the
  same tokenizer.json byte for byte across processes and with TOKENIZERS_PARALLELISM on and
  off (3 MiB of stdlib source, vocab 4000), and by the tests (a second process).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.config import TOKENIZER_FILE, TRAIN_PREFIX, PrepareConfig
from plugins.protocol.errors import ConfigError
from recipes.config.dataset_files import EOD_CANDIDATES, TOKENIZER_CONFIG

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


def training_bar(enabled: bool | None, console: Console | None = None) -> Progress:
    """The bar tokenizer training shows, in the style of the preparation's own bars: off when
    the console is not a terminal (logs, tests, pipes) unless `enabled` says otherwise. No
    total: the texts come from a stream whose length in text is not known beforehand."""
    console = console or Console()
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(),
        TextColumn("{task.completed:,.1f} MiB of text, {task.fields[documents]:,} documents"),
        TextColumn("{task.fields[phase]}"), TimeElapsedColumn(), console=console,
        disable=not (console.is_terminal if enabled is None else enabled),
    )


def counted(texts: Iterable[str | list[str]], bar: Progress,
            task: TaskID) -> Iterator[str | list[str]]:
    """`texts` unchanged, advancing `task` by the MiB and documents each item holds; when they
    run out the task says "merging" (the trainer then counts pairs and merges, which the bar's
    clock keeps showing: the library releases the GIL while it computes)."""
    documents = 0
    for item in texts:
        batch = [item] if isinstance(item, str) else item
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in batch)
        documents += len(batch)
        bar.update(task, advance=size / 2**20, documents=documents)
        yield item
    bar.update(task, phase="merging")


def train_byte_level_bpe(texts: Iterable[str | list[str]], vocab: int,
                         length: int | None = None, *, progress: bool | None = False,
                         console: Console | None = None) -> Tokenizer:
    """A GPT-2-style byte-level BPE with `vocab` ids at most: `<|endoftext|>` is id 0, the 256
    byte symbols follow, then the merges (fewer if the corpus runs out of pairs). `progress`:
    show `training_bar` (None: only on a terminal); off by default for library callers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[DEFAULT_EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # training_bar instead (see the module's docstring)
    )
    with training_bar(progress, console) as bar:
        task = bar.add_task("tokenizer", total=None, documents=0, phase="reading")
        tokenizer.train_from_iterator(counted(texts, bar, task), trainer=trainer, length=length)
        read = next(t.completed for t in bar.tasks if t.id == task)
        bar.update(task, total=read or 1, completed=read or 1, phase="trained")
    return tokenizer


def _special_tokens(tokenizer: Tokenizer) -> list[str]:
    return [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]


def _added_tokens(tokenizer: Tokenizer) -> set[str]:
    return {t.content for t in tokenizer.get_added_tokens_decoder().values()}


def tokenizer_config_file(spec: str) -> Path:
    """The tokenizer_config.json beside the tokenizer `tokenizer=` names (in the folder, or
    beside the tokenizer.json file): where transformers reads the eos token from."""
    path = Path(spec).expanduser()
    return path / TOKENIZER_CONFIG if path.is_dir() else path.with_name(TOKENIZER_CONFIG)


def read_tokenizer_config(spec: str) -> dict[str, Any] | str | None:
    """The tokenizer's tokenizer_config.json as a dict; None when there is none; the one-line
    problem when it cannot be read as a JSON object. A damaged one is not passed over: it is
    what names the eos token, and transformers refuses to load the folder too."""
    file = tokenizer_config_file(spec)
    if not file.is_file():
        return None
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return (f"tokenizer={spec}: {file} cannot be read ({reason}); download it again or fix "
                "it (or remove it: the tokenizer's own end-of-text token is used then)")
    if not isinstance(loaded, dict):
        return (f"tokenizer={spec}: {file} holds {type(loaded).__name__}, not a JSON object; "
                "download it again or fix it (or remove it)")
    return loaded


def configured_eos(config: dict[str, Any] | None) -> str | None:
    """The eos token a tokenizer_config.json names (a string or an AddedToken dict), if any."""
    eos = (config or {}).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def missing_eos_problem(tokenizer: Tokenizer, spec: str, eos: str | None) -> str | None:
    """A configured eos token the tokenizer does not hold. Falling back to another end-of-text
    token would disagree with transformers, which adds the eos token as a new id: training
    (Megatron-LM's HuggingFaceTokenizer) and generation would end documents differently."""
    if eos is None or tokenizer.token_to_id(eos) is not None:
        return None
    specials = ", ".join(_special_tokens(tokenizer)[:8]) or "none"
    return (f"tokenizer={spec}: its {TOKENIZER_CONFIG} names eos_token {eos}, which its "
            f"{TOKENIZER_FILE} does not hold (its special tokens: {specials}); fix eos_token in "
            f"{TOKENIZER_CONFIG}, or name the end of a document with eod_token=<token>")


def unknown_eod_problem(tokenizer: Tokenizer, cfg: PrepareConfig) -> str | None:
    """eod_token= names a token the tokenizer does not have."""
    if cfg.eod_token is None or tokenizer.token_to_id(cfg.eod_token) is not None:
        return None
    specials = ", ".join(_special_tokens(tokenizer)[:8]) or "none"
    return (f"eod_token={cfg.eod_token} is not a token of tokenizer={cfg.tokenizer}; name "
            f"one of its special tokens ({specials}) or leave eod_token unset")


def ordinary_eod_problem(tokenizer: Tokenizer, cfg: PrepareConfig,
                         configured: str | None) -> str | None:
    """eod_token= names an ordinary token (a word, a piece of one): every place the text holds
    it would count as a document end (loss masking, packing, attention resets). A special
    (added) token is accepted, and so is a known end-of-text spelling a tokenizer keeps in its
    plain vocabulary (older SentencePiece conversions keep `</s>` there)."""
    token = cfg.eod_token
    if token is None or token in _added_tokens(tokenizer) or token in (configured,
                                                                       *EOD_CANDIDATES):
        return None
    specials = ", ".join(_special_tokens(tokenizer)[:8])
    choose = (f"name one of its special tokens ({specials})" if specials else
              "add an end-of-document token to its tokenizer.json's added_tokens (special: true)")
    return (f"eod_token={token} is an ordinary token of tokenizer={cfg.tokenizer} (id "
            f"{tokenizer.token_to_id(token)}), not a special one: every '{token}' in the text "
            f"would end a document; {choose}, or leave eod_token unset")


def trained_eod_problem(cfg: PrepareConfig) -> str | None:
    """eod_token= with train:VOCAB names a token other than the one the trained tokenizer
    reserves (DEFAULT_EOD, id 0): found before the training, not after it."""
    if cfg.train_vocab is None or cfg.eod_token in (None, DEFAULT_EOD):
        return None
    return (f"eod_token={cfg.eod_token}: a tokenizer trained with tokenizer={cfg.tokenizer} "
            f"ends documents with its special token {DEFAULT_EOD} (id 0); leave eod_token "
            "unset, or prepare with a tokenizer file that holds the token as a special token")


def _raise(problem: str | None) -> None:
    if problem:
        raise ConfigError(problem)


def choose_eod(tokenizer: Tokenizer, cfg: PrepareConfig) -> tuple[int, str, bool]:
    """(id, token, added): eod_token= if given (a special token of the tokenizer), else the
    folder's configured eos token (which it must hold), else the first known end-of-text token
    the tokenizer has, else DEFAULT_EOD added as a new special token."""
    config = read_tokenizer_config(cfg.tokenizer) if cfg.train_vocab is None else None
    _raise(config if isinstance(config, str) else None)
    configured = configured_eos(config if isinstance(config, dict) else None)
    if cfg.eod_token is not None:
        _raise(unknown_eod_problem(tokenizer, cfg)
               or ordinary_eod_problem(tokenizer, cfg, configured))
        return tokenizer.token_to_id(cfg.eod_token), cfg.eod_token, False
    _raise(missing_eos_problem(tokenizer, cfg.tokenizer, configured))
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
                      length: int | None = None, *, progress: bool | None = None,
                      console: Console | None = None) -> PreparedTokenizer:
    """Load `cfg.tokenizer`, or train one on `texts` for `train:VOCAB` (with `training_bar`:
    `progress` None shows it on a terminal only); choose the EOD."""
    if cfg.tokenizer.startswith(TRAIN_PREFIX):
        if cfg.train_vocab is None or texts is None:
            raise ConfigError(f"tokenizer={cfg.tokenizer}: give train:VOCAB, e.g. train:32000")
        _raise(trained_eod_problem(cfg))
        tokenizer = train_byte_level_bpe(texts, cfg.train_vocab, length, progress=progress,
                                         console=console)
    else:
        tokenizer = load_tokenizer(cfg.tokenizer)
    eod_id, eod_token, added = choose_eod(tokenizer, cfg)
    return PreparedTokenizer(
        tokenizer=tokenizer, eod_id=eod_id, eod_token=eod_token, eod_added=added,
        vocab_size=id_range(tokenizer), source=cfg.tokenizer,
    )
