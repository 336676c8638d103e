"""Commands that must meet permissions as a user does: root reads and enters through chmod, so
as root they run with the capabilities that pass by permissions dropped (setpriv)."""

from __future__ import annotations

import os
import shutil

import pytest

DAC_CAPABILITIES = "-dac_override,-dac_read_search"


def plain_user_prefix() -> list[str]:
    """What to put before a command so it is refused a path as a user would be: nothing for a
    user, setpriv for root (the test is skipped where root has no setpriv)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv reads through any chmod")
    return ["setpriv", f"--inh-caps={DAC_CAPABILITIES}", f"--bounding-set={DAC_CAPABILITIES}"]
