"""The continuous-vs-resumed comparison behind `scripts/validate_resume.py`.

A long job trusts that a restart continues where it stopped. This checks it on the user's own
machines, recipe and layout before the job: train `steps` steps without stopping, saving a full
checkpoint after `save_at`; then build a new training session from that checkpoint and train
to `steps` again. Per step after the save, on every rank, the two must agree bit for bit in
loss, learning rate, consumed tokens, the token ids trained on (a digest of each batch), and
the random streams (a digest of every generator right after the load and after the last step).
Each check is reduced over all ranks; rank 0 prints the table.

Both sessions start from what this check makes itself (step 0, then its own checkpoint), so a
`checkpoint.load` or `checkpoint.resume` given to it would be ignored while the launch said it
resumes from it: they are refused in one line instead (`loading_refusal`, torch-free like
this module's import, so a launching process may ask it before any rank starts). So is
`checkpoint.save=false` (`saving_refusal`): the check makes its own save, so it would pass a
config whose job never saves and has nothing to resume from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.schema import RunConfig


@dataclass
class StepRecord:
    loss: float
    lr: float
    tokens: int
    data: str  # digest of this rank's token ids of the step


def rng_digest() -> str:
    """One digest of every random stream of this rank (Python, NumPy, torch, Megatron's)."""
    from trainer.state import RngState

    state = RngState.capture().as_dict()
    h = hashlib.sha256(repr((state["python"], state["numpy"])).encode())
    h.update(state["torch_cpu"].numpy().tobytes())
    for name, tensor in sorted(state["tracker"].items()):
        h.update(name.encode() + tensor.cpu().numpy().tobytes())
    if state["torch_cuda"] is not None:
        h.update(state["torch_cuda"].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _batch_digest(microbatches: list) -> str:
    h = hashlib.sha256()
    for mb in microbatches:
        h.update(mb["tokens"].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _train(session, steps: int, save_at: int | None, root: Path) -> tuple[list, str | None]:
    """Records of steps up to `steps`; the RNG digest right after the save (when saving)."""
    from trainer.checkpoint.save import save_checkpoint
    from trainer.step import train_step

    records, at_save = [], None
    while session.state.step < steps:
        digest = _batch_digest(session.train_batches.upcoming())
        metrics = train_step(session)
        records.append(StepRecord(metrics.loss, metrics.lr, session.state.consumed_tokens, digest))
        if session.state.step == save_at:
            save_checkpoint(session, root)
            at_save = rng_digest()
    return records, at_save


def _session(cfg: RunConfig, run_dir: Path, load: Path | None):
    from trainer.session import start_session

    checkpoint = dataclasses.replace(cfg.checkpoint, load=str(load) if load else None,
                                     load_model_only=False, save=False, keep_last=None)
    return start_session(dataclasses.replace(cfg, checkpoint=checkpoint), run_dir)


def _end_session() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def _all_ranks(ok: bool) -> bool:
    import torch

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def compare(before: list[StepRecord], after: list[StepRecord], rng: tuple) -> list[tuple]:
    """(check, what was compared, passed on this rank) for each check."""
    n = len(after)
    loss = _max_diff([r.loss for r in before], [r.loss for r in after])
    lr = _max_diff([r.lr for r in before], [r.lr for r in after])
    same_data = sum(a.data == b.data for a, b in zip(before, after, strict=True))
    tokens_ok = [r.tokens for r in before] == [r.tokens for r in after]
    at_save, after_load, end_before, end_after = rng
    return [
        ("loss", f"max |difference| {loss:.3g} over {n} steps", loss == 0.0),
        ("learning rate", f"max |difference| {lr:.3g}", lr == 0.0),
        ("consumed tokens", f"{after[-1].tokens} after the last step, every step equal",
         tokens_ok),
        ("data order", f"{same_data} of {n} batches with identical token ids", same_data == n),
        ("RNG streams", "identical after the load and after the last step",
         at_save == after_load and end_before == end_after),
    ]


def loading_refusal(cfg: RunConfig) -> str | None:
    """Why this check cannot take the config's checkpoint, or None: it trains its own run from
    step 0 and resumes that (module doc). `checkpoint.resume` has usually become a plain
    `checkpoint.load` before a rank starts (`preflight.resolve_resume`)."""
    checkpoint = cfg.checkpoint
    if checkpoint.load is None and not checkpoint.resume:
        return None
    given = (f"checkpoint.load={checkpoint.load}" if checkpoint.load is not None
             else "checkpoint.resume=true")
    return (f"scripts/validate_resume.py trains its own run from step 0 and resumes it from its "
            f"own checkpoint, so {given} would be ignored; drop checkpoint.load and "
            "checkpoint.resume (to continue a checkpoint, use scripts/pretrain.py)")


def saving_refusal(cfg: RunConfig) -> str | None:
    """Why this check cannot take a config that never saves, or None: its own save would make
    it pass where the job itself could not resume (module doc)."""
    if cfg.checkpoint.save:
        return None
    return ("checkpoint.save=false: a job with this config saves no checkpoint, so it cannot "
            "resume, while scripts/validate_resume.py makes its own save and would pass; check "
            "the config the job will run, with checkpoint.save=true")


def resume_check_refusal(cfg: RunConfig) -> str | None:
    """The first of this check's refusals of a config (torch-free, asked before launch and on
    every rank alike), or None."""
    return loading_refusal(cfg) or saving_refusal(cfg)


def run_resume_check(cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> list[tuple]:
    """Both runs on this rank; the checks, each passed only when it passed on every rank. A
    checkpoint the config names, or a config that never saves, is refused first, on every rank
    alike (`resume_check_refusal`)."""
    import torch

    refusal = resume_check_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)
    steps, save_at = options["steps"], options["save_at"]
    root = run_dir / "validate_resume"
    session = _session(cfg, run_dir, None)
    before, at_save = _train(session, steps, save_at, root)
    end_before = rng_digest()
    _end_session()
    session = _session(cfg, run_dir, root / f"step_{save_at:07d}")
    after_load = rng_digest()
    after, _ = _train(session, steps, None, root)
    rows = compare(before[save_at:], after, (at_save, after_load, end_before, rng_digest()))
    _end_session()
    rows = [(check, detail, _all_ranks(ok)) for check, detail, ok in rows]
    if torch.distributed.get_rank() == 0 and all(ok for *_, ok in rows):
        shutil.rmtree(root, ignore_errors=True)  # kept for inspection when a check failed
    return rows


def format_table(name: str, rows: list[tuple], options: dict[str, int]) -> str:
    head = (f"validate_resume {name}: {options['steps']} steps without stopping vs saved after "
            f"step {options['save_at']} and resumed in a new session")
    width = max(len(check) for check, *_ in rows)
    lines = [head, f"  {'check':<{width}}  result  compared"]
    lines += [f"  {check:<{width}}  {'pass' if ok else 'FAIL'}    {detail}"
              for check, detail, ok in rows]
    verdict = "all checks pass" if all(ok for *_, ok in rows) else "resume is NOT exact"
    return "\n".join([*lines, verdict])
