"""Everything about checkpoints, one concern per module, in one package of the trainer.

Torch-free, so the launching process checks a checkpoint before it imports torch (a damaged or
unloadable one is refused in about a second, not after every rank has built its model); they
import no torch module of the trainer (tests/unit/test_architecture.py):

    format.py        a checkpoint's names on disk (step directories, `.tmp-`, `latest`,
                     `run.json`) and which step a checkpoint root resumes from
    manifest.py      `run.json`'s content: file records, damage, shape and tokenizer mismatches,
                     layouts the optimizer state cannot reshard to, the changes a resume states
    megatron_lm.py   a step Megatron-LM or Megatron Bridge wrote, read without torch or pickled
                     code and described as `run.json` describes ours
    preflight.py     the `checkpoint.load` rule, `checkpoint.resume` resolution, the pre-flight,
                     and `validate_paths` (recipes/'s path rules with the checkpoint rule)

With torch, on the ranks; each module imports only those listed before it (the same test):

    megatron_fixes.py  every workaround of Megatron Core's behaviour on the save and load paths,
                     each a named entry (`FIX_NAMES`) with its self-test
    fsdp_dtensor.py  Megatron FSDP's format: torch DCP of its DTensors, the run's own files, and
                     its weights read back in one process (the export)
    state_dicts.py   what a checkpoint holds as Megatron's sharded state dicts; the save strategy
    disk_errors.py   a save the file system refuses, agreed across ranks: one line, no half save
    publish.py       atomic publication: `run.json`, rename into place, `latest`, rotation
    async_save.py    asynchronous saves: the forked writer, publication when every rank is done
    save.py          `save_checkpoint`, the one entry of a save (synchronous or asynchronous)
    load.py          `load_checkpoint` (a whole run) and `load_model_weights` (any layout)

Why apart: the launching process needs the first three without torch; the fixes are one list
to review when Megatron Core is upgraded; publication and its failure handling are what a
crash tests, and are tested without a process group where they can be.
"""
