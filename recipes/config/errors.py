"""The one exception type for user mistakes; entry points print its message as one line."""


class ConfigError(ValueError):
    """A configuration or command-line mistake the user can fix; the message says how."""
