"""The exceptions for mistakes a user can fix: every entry point prints the message as one line.

`UserError` is found at run time (a plugin meeting data it cannot use, a checkpoint it may not
load); `ConfigError` is one found before launch (a command line, a config file, a layout, a
path). The message names what is wrong and the fix; entry points print `error: <message>` and
exit with code 2, never a traceback. This module is the floor of the house: everything above may
raise these, and it imports nothing.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake the user can fix, found at run time (a plugin meeting data it cannot use).

    The message is one line naming what is wrong and the fix; entry points print it as
    `error: <message>` with exit code 2.
    """


class RankUserError(UserError):
    """A run-time mistake that one rank may meet alone (in the samples it reads): the rank that
    meets it prints it, where other user errors are printed by rank 0 alone (every rank meets
    them alike, and one line is enough)."""


class ConfigError(UserError):
    """A configuration or command-line mistake the user can fix; the message says how."""


class ConfigErrors(ConfigError):
    """Several mistakes found together before launch (a typo in a path beside a value out of
    range): entry points print each as its own `error:` line, so fixing one does not reveal the
    next only on the following try. `str()` is the lines joined by newlines."""

    def __init__(self, messages) -> None:
        self.messages = tuple(messages)
        super().__init__("\n".join(self.messages))


def config_error(messages) -> ConfigError | None:
    """One `ConfigError` for the messages found (several: `ConfigErrors`); None for none.
    The same message found twice is said once."""
    unique = tuple(dict.fromkeys(message for message in messages if message))
    if not unique:
        return None
    return ConfigError(unique[0]) if len(unique) == 1 else ConfigErrors(unique)


def error_lines(error: UserError) -> tuple[str, ...]:
    """What an entry point prints for `error`: one message per line."""
    return getattr(error, "messages", None) or (str(error),)


# How a program of the project ends; every entry point and launcher exits with one of these.
EXIT_OK = 0
EXIT_FAULT = 1  # a run, a rank or a check failed (the reason is printed in one line)
EXIT_USER_ERROR = 2  # a mistake the user can fix: `error: <what and how to fix>`
EXIT_NONFINITE = 3  # the loss or a gradient became NaN/inf
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT, as a shell reports it); SIGTERM: 143
EXIT_BROKEN_PIPE = 141  # its output's reader stopped early (128 + SIGPIPE, as `yes | head`)
