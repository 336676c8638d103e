"""Per-rank functions for the layout tests (run through the `launch_ranks` fixture).

Each builds a real training session from a registered recipe plus overrides, exactly as
`scripts/pretrain.py` would, and returns what the test compares.
"""

from __future__ import annotations

from pathlib import Path

from recipes.resolve import resolve_config
from trainer.checkpoint.preflight import validate_paths

# Small, machine-independent data so losses depend on numerics only, not the Python version.
TEST_DATA = ["data.source=synthetic", "data.max_corpus_bytes=120000", "train.eval_iters=0",
             "train.eval_interval=0"]
# The tiny hybrid (recipes/nemotron/nemotron_h.py) as the layout and resume tests run it:
# sequence 64 (two Mamba scan chunks), global batch 4 of micro-batches of 2.
HYBRID_SIZE = ["model.seq_length=64", "train.global_batch_size=4"]


def _session(payload: dict):
    from trainer.session import start_session

    cfg = resolve_config(
        [f"recipe={payload['recipe']}", *TEST_DATA, *payload.get("overrides", [])]
    )
    validate_paths(cfg)
    cfg.checkpoint.save = False
    cfg.logging.progress_bar = False
    return start_session(cfg, Path(payload["run_dir"]))


def _finish() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def save_reference_weights(payload: dict) -> str:
    """Initial weights of the recipe's model, saved for every layout to load."""
    from tests.dist.reference_weights import save_model_weights

    session = _session(payload)
    path = save_model_weights(payload["weights_dir"], session.cfg, session.model)
    _finish()
    return str(path)


def trained_lengths(microbatches: list[dict], documents: str) -> list[int]:
    """The lengths of the sequences in `microbatches`, read from their positions and loss
    masks, not from `cu_seqlens`: a full row (data.documents=concatenate) is one sequence; in
    a packed or inter-document row a sequence starts where the position ids restart at 0; a
    packed document of n tokens has n - 1 loss tokens (its padding, and the row's padding
    segment, have none), while Megatron's inter-document rows are documents end to end."""
    lengths = []
    for batch in microbatches:
        for positions, mask in zip(batch["position_ids"].tolist(), batch["loss_mask"].tolist(),
                                   strict=True):
            if documents == "concatenate":
                lengths.append(len(positions))
                continue
            starts = [i for i, position in enumerate(positions) if position == 0]
            for start, end in zip(starts, [*starts[1:], len(positions)], strict=True):
                ones = int(sum(mask[start:end]))
                if documents == "inter_document":
                    lengths.append(end - start)
                elif ones:
                    lengths.append(ones + 1)
    return lengths


def train_steps(payload: dict) -> dict:
    """Per-step loss and grad norm of `payload['steps']` optimizer steps, with each step's
    reported model TFLOP/s and time and the lengths of the sequences this rank trained
    (`trained_lengths`). With `weights_dir` the session's initial weights are saved there
    first (the reference run saves what every other layout loads, one launch fewer than
    `save_reference_weights` and then training)."""
    import torch
    from megatron.core import parallel_state

    from tests.dist.reference_weights import save_model_weights
    from trainer.step import train_step

    session = _session(payload)
    weights = None
    if payload.get("weights_dir"):
        weights = str(save_model_weights(payload["weights_dir"], session.cfg, session.model))
    losses, grad_norms, loss_tokens, mask_tokens, mtp_losses = [], [], [], [], []
    tflops, step_times, lengths = [], [], []
    for _ in range(payload["steps"]):
        batches = session.train_batches
        upcoming = batches.upcoming()
        # This rank's loss-mask ones of the coming batch (all of it on a single DP rank).
        mask_tokens.append(int(sum(mb["loss_mask"].sum() for mb in upcoming)))
        lengths.append(trained_lengths(upcoming, session.cfg.data.documents))
        metrics = train_step(session)
        losses.append(metrics.loss)
        mtp_losses.append({k: v for k, v in metrics.extra.items() if k.startswith("mtp_")})
        grad_norms.append(metrics.grad_norm)
        loss_tokens.append(metrics.loss_tokens)
        tflops.append(metrics.model_tflops_per_gpu)
        step_times.append(metrics.step_time_s)
    result = {"losses": losses, "grad_norms": grad_norms, "loss_tokens": loss_tokens,
              "mask_tokens": mask_tokens, "weights": weights, "tflops": tflops,
              "step_times": step_times, "lengths": lengths, "mtp_losses": mtp_losses,
              "dp_rank": parallel_state.get_data_parallel_rank(),
              "world": torch.distributed.get_world_size()}
    _finish()
    return result


def train_saving_each_step(payload: dict) -> dict:
    """Train up to `steps`, saving a full checkpoint after every optimizer step (as the run
    loop does when `checkpoint.save_interval=1`); what the checkpoint root then holds."""
    from trainer.checkpoint.save import save_checkpoint
    from trainer.step import train_step

    session = _session(payload)
    start, resumed_from = session.start_step, session.resumed_from
    root = Path(payload["checkpoint_dir"])
    while session.state.step < payload["steps"]:
        train_step(session)
        save_checkpoint(session, root)
    _finish()
    return {"start": start, "resumed_from": resumed_from and resumed_from.name,
            "entries": sorted(p.name for p in root.iterdir()) if root.exists() else [],
            "latest": (root / "latest").read_text() if (root / "latest").exists() else None}
