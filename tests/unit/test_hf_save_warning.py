"""An import's save no longer prints Megatron's 'MCore's async save is deprecated' notice:
`megatron_side.without_async_deprecation` drops that one record, by its message, from the
logger that says it, while the save runs; every other record still prints."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from trainer.interop.megatron_side import (
    ASYNC_DEPRECATION,
    ASYNC_DEPRECATION_LOGGER,
    is_async_deprecation,
    without_async_deprecation,
)

NOTICE = (f"{ASYNC_DEPRECATION} and will be removed in the future releases. Please, use NVRx "
          "async solution by setting `async_strategy` to `nvrx`.")


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord(ASYNC_DEPRECATION_LOGGER, logging.WARNING, __file__, 1, message,
                             None, None)


def test_the_notice_is_recognised_by_its_message_alone() -> None:
    assert is_async_deprecation(_record(NOTICE))
    assert not is_async_deprecation(_record("Async save failed"))


def test_the_text_and_logger_are_megatrons() -> None:
    """An upgrade that rewords or moves the notice fails here, not silently."""
    spec = importlib.util.find_spec(ASYNC_DEPRECATION_LOGGER)
    assert spec is not None and spec.origin is not None
    assert f'"{ASYNC_DEPRECATION} and will be' in Path(spec.origin).read_text(encoding="utf-8")


def test_only_the_notice_is_dropped_and_only_during_the_save(caplog) -> None:
    logger = logging.getLogger(ASYNC_DEPRECATION_LOGGER)
    with caplog.at_level(logging.WARNING, logger=ASYNC_DEPRECATION_LOGGER):
        with without_async_deprecation():
            logger.warning(NOTICE)
            logger.warning("another warning")
        logger.warning(NOTICE)
    assert [r.getMessage() for r in caplog.records] == ["another warning", NOTICE]
