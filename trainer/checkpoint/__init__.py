"""Everything about checkpoints, in one package of the trainer.

Torch-free, so the launching process checks a checkpoint before it imports torch (a damaged or
unloadable one is refused in about a second, not after every rank built its model):

    format.py     a checkpoint's names on disk (step directories, `.tmp-`, `latest`, `run.json`)
                  and which step a checkpoint root resumes from
    manifest.py   `run.json`'s content: file records, damage, shape and tokenizer mismatches,
                  layouts the optimizer state cannot reshard to, the changes a resume states
    preflight.py  the `checkpoint.load` rule, `checkpoint.resume` resolution, the pre-flight, and
                  `validate_paths` (recipes/'s path rules with the checkpoint rule among them)

With torch, on the ranks:

    save.py       save and load (Megatron's `dist_checkpointing`), atomic publication, rotation,
                  disk errors agreed across ranks, asynchronous saves, and the workarounds of
                  Megatron Core's behaviour on these paths
"""
