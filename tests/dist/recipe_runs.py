"""A rank of `scripts/pretrain.py` as its own launching process starts it, for the launch_ranks
fixture: `main(PRETRAIN)` on the rank's command line (the run's saved config and directory,
`trainer.entry.pipeline.rank_arguments`), in the directory the run was launched from, so the
relative data paths of the recipe's blends resolve where the launching process prepared them.
"""

from __future__ import annotations

import os


def pretrain_as_rank(payload: dict) -> int:
    """0 once the rank has trained; any other exit code ends the rank with it (a refusal's
    one line is then on its stderr, which the launcher reports)."""
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import main
    from trainer.entry.pipeline import PREFLIGHT_DONE_ENV

    os.chdir(payload["cwd"])
    os.environ[PREFLIGHT_DONE_ENV] = "1"  # as the launching process sets it for its ranks
    code = main(PRETRAIN, payload["argv"])
    if code != 0:
        raise SystemExit(code)
    return code
