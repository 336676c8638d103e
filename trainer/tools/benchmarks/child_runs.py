"""How a benchmark says that a tool it ran in a child process failed: the benchmarks run our
scripts (`prepare_data.py`, `pretrain.py`) and a Megatron-LM tool the user names, and one rule
turns each failure into the bench's own exit, so none prints a Python list or a bare line.
"""

from __future__ import annotations

from plugins.protocol.errors import EXIT_USER_ERROR, ConfigError


def child_failure(tool: str, returncode: int, stderr: str) -> BaseException:
    """The exception for a child that exited `returncode`: its own `error:` line with exit 2
    (a user mistake our script refused) stays that one line, exit 2; anything else (a crash,
    or another tool's failure) is `error: <tool> failed (exit N): <its last line>`, exit 1."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "no output on stderr"
    if returncode == EXIT_USER_ERROR and last.startswith("error: "):
        return ConfigError(last[len("error: "):])
    return SystemExit(f"error: {tool} failed (exit {returncode}): {last}")
