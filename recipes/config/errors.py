"""The exception for configuration mistakes; entry points print its message as one line.

It is the plugin protocol's `UserError`, so mistakes found before launch (here) and at run time
(by a plugin) end the same way: one line and exit code 2.
"""

from __future__ import annotations

from plugins.protocol import UserError


class ConfigError(UserError):
    """A configuration or command-line mistake the user can fix; the message says how."""
