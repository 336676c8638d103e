"""Per-rank functions for moving a run between Megatron-LM and this trainer, both ways (run
through the `launch_ranks` fixture; tests/dist/test_megatron_lm_checkpoints.py).

One launch runs four trainings of the same recipe on the same batches, in one process per rank:
this trainer for `steps` steps, saving after `save_at` in Megatron-LM's layout
(`checkpoint.format=megatron_lm`); Megatron-LM's own loop (`megatron.training.pretrain`, as the
parity check drives it) for `steps` steps from the same initial weights, saving after `save_at`
with its own `save_checkpoint`; Megatron-LM resumed (`--load`) from this trainer's checkpoint;
this trainer resumed (`checkpoint.load=`) from Megatron-LM's. Each resumed run is compared with
the other tool's uninterrupted run: per step loss, grad norm and lr, and the final weights.

With `bridge` in the payload, Megatron-LM's loop also saves each step a second time in Megatron
Bridge's shape (Megatron Bridge's `save_checkpoint` writes Megatron-LM's state without `args`,
plus `train_state.pt` and `run_config.yaml` beside it: megatron/bridge/training/checkpointing.py,
`TrainState.state_dict`), and a fifth training resumes this trainer from it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.dist.layout_runs import _finish, _session


def _steps(session, steps: int, save_at: int | None = None, root: Path | None = None):
    """This trainer's steps up to `steps` as the parity check records them (`record_steps`),
    saving into `root` after step `save_at`."""
    from trainer.checkpoint.save import save_checkpoint
    from trainer.tools.megatron_parity import record_steps

    def save(trained) -> None:
        if trained.state.step == save_at:
            save_checkpoint(trained, root)

    return record_steps(session, steps, save)


def _reduced(record) -> dict:
    """A run's per-step figures as every rank sees them (the loss lives on the last stage)."""
    from trainer.tools.megatron_parity import _max_over_world

    return {"losses": _max_over_world(record.losses),
            "grad_norms": _max_over_world(record.grad_norms),
            "lrs": _max_over_world(record.lrs)}


def _weights_apart(a: list[dict], b: list[dict]) -> dict:
    """Largest |difference| of this rank's final weights, and how many tensors differ, summed
    over ranks."""
    import torch

    from trainer.tools.megatron_parity import _max_over_world, _weights_diff

    worst, differ = _weights_diff(a, b)
    total = torch.tensor([differ], dtype=torch.int64)
    torch.distributed.all_reduce(total)
    return {"max_diff": _max_over_world([worst])[0], "tensors_differ": int(total.item())}


def _bridge_files(step_dir: Path, args) -> None:
    """What Megatron Bridge writes beside a step: its counters as a dict of int64 tensors, and
    its run config (the model's shape and the batch, under Bridge's section names)."""
    import torch
    import yaml

    torch.save({"step": torch.tensor(args.iteration, dtype=torch.int64),
                "consumed_train_samples": torch.tensor(args.consumed_train_samples,
                                                       dtype=torch.int64),
                "skipped_train_samples": torch.tensor(0, dtype=torch.int64),
                "do_train": torch.tensor(True, dtype=torch.bool)}, step_dir / "train_state.pt")
    model = {name: getattr(args, name) for name in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
        "num_query_groups", "kv_channels", "seq_length", "tensor_model_parallel_size",
        "pipeline_model_parallel_size")}
    train = {"global_batch_size": args.global_batch_size,
             "micro_batch_size": args.micro_batch_size, "train_iters": args.train_iters}
    config = {"model": model, "train": train, "optimizer": {"lr": args.lr,
                                                              "min_lr": args.min_lr}}
    (step_dir / "run_config.yaml").write_text(yaml.safe_dump(config))


@contextlib.contextmanager
def bridge_shaped_saves(root: Path):
    """Every save of Megatron-LM's loop done again into `root` as Megatron Bridge shapes it."""
    import megatron.training.checkpointing as checkpointing
    import megatron.training.training as training
    from megatron.training import get_args

    save, generate = training.save_checkpoint, checkpointing.generate_state_dict

    def without_args(*args, **kwargs):
        state = generate(*args, **kwargs)
        state.pop("args", None)
        return state

    def save_both(iteration, *args, **kwargs):
        save(iteration, *args, **kwargs)
        megatron_args = get_args()
        own = megatron_args.save
        megatron_args.save, checkpointing.generate_state_dict = str(root), without_args
        try:  # Megatron-LM's check of the common state reads its `args`, which Bridge's lacks
            save(iteration, *args, **{**kwargs, "preprocess_common_state_dict_fn": None})
        finally:
            megatron_args.save, checkpointing.generate_state_dict = own, generate
        if torch_rank() == 0:
            megatron_args.iteration = iteration
            _bridge_files(root / f"iter_{iteration:07d}", megatron_args)

    training.save_checkpoint = save_both
    try:
        yield
    finally:
        training.save_checkpoint = save


def torch_rank() -> int:
    import torch

    return torch.distributed.get_rank()


def both_ways(payload: dict) -> dict:
    """The four trainings (see the module's docstring) and what the test compares."""
    from trainer.checkpoint.megatron_fixes import in_process_write_results
    from trainer.tools.megatron_parity import train_megatron_lm

    steps, save_at, run_dir = payload["steps"], payload["save_at"], Path(payload["run_dir"])
    overrides = payload.get("overrides", [])
    ours_root, theirs_root = run_dir / "ours", run_dir / "megatron_lm"
    session = _session({**payload, "overrides": [*overrides, "checkpoint.format=megatron_lm"]})
    cfg = session.cfg
    ours, batches = _steps(session, steps, save_at, ours_root)
    _finish()
    bridge_root = run_dir / "megatron_bridge"
    bridge = bridge_shaped_saves(bridge_root) if payload.get("bridge") else contextlib.nullcontext()
    with in_process_write_results():  # Megatron-LM's save would start a spawned Manager
        with bridge:
            theirs = train_megatron_lm(cfg, steps, ours, batches, [
                "--save", str(theirs_root), "--save-interval", str(save_at)])
        theirs_resumed = train_megatron_lm(cfg, steps, ours, batches,
                                           ["--load", str(ours_root)])
    resumed = _session({**payload, "overrides": [
        *overrides, f"checkpoint.load={theirs_root / f'iter_{save_at:07d}'}"]})
    start = resumed.start_step
    ours_resumed, _ = _steps(resumed, steps)
    _finish()
    found = {}
    if payload.get("bridge"):
        from_bridge = _session({**payload, "overrides": [
            *overrides, f"checkpoint.load={bridge_root / f'iter_{save_at:07d}'}"]})
        found["bridge_start"] = from_bridge.start_step
        bridge_resumed, _ = _steps(from_bridge, steps)
        _finish()
        found["bridge_resumed"] = _reduced(bridge_resumed)
        found["bridge_resumed_vs_theirs"] = _weights_apart(bridge_resumed.final, theirs.final)
    return {**found,
        "ours": _reduced(ours), "theirs": _reduced(theirs),
        "theirs_resumed": _reduced(theirs_resumed), "ours_resumed": _reduced(ours_resumed),
        "start": start,
        "theirs_resumed_vs_ours": _weights_apart(theirs_resumed.final, ours.final),
        "ours_resumed_vs_theirs": _weights_apart(ours_resumed.final, theirs.final),
        "ours_files": sorted(p.name for p in ours_root.iterdir()),
        "theirs_files": sorted(p.name for p in theirs_root.iterdir()),
    }


def distributed_optimizer_load(payload: dict) -> dict:
    """This trainer's distributed-optimizer checkpoint, then Megatron-LM's `--load` of it on CPU
    with and without `megatron_lm_on_cpu`'s megatron_lm_distributed_optimizer_load patch: the
    error without it, the steps trained with it."""
    from trainer.checkpoint.megatron_fixes import in_process_write_results
    from trainer.tools.megatron_parity import train_megatron_lm

    steps, save_at, root = payload["steps"], payload["save_at"], Path(payload["run_dir"]) / "ours"
    session = _session({**payload, "overrides": [*payload["overrides"],
                                                 "checkpoint.format=megatron_lm"]})
    cfg = session.cfg
    ours, batches = _steps(session, steps, save_at, root)
    _finish()
    found = {}
    with in_process_write_results():
        try:
            train_megatron_lm(cfg, steps, ours, batches, ["--load", str(root)],
                              skip=frozenset({"megatron_lm_distributed_optimizer_load"}))
            found["without"] = None
        except (AssertionError, KeyError, RuntimeError) as error:
            found["without"] = f"{type(error).__name__}: {error}"
        resumed = train_megatron_lm(cfg, steps, ours, batches, ["--load", str(root)])
    found["with"] = _reduced(resumed)
    found["ours"] = _reduced(ours)
    return found
