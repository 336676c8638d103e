"""What a checkpoint says about the run that saved it, read before any rank starts.

Every checkpoint this project saves holds `run.json` beside Megatron's files: the run's counters
(step, consumed samples and tokens), its layout, the versions of torch, megatron-core and this
project, the tokenizer it trained with, the whole resolved config, and the size and CRC-32 of
every file of the checkpoint. It is plain JSON, so the launching process reads it without torch
and without unpickling anything, and three questions are answered in about a second instead of
after every rank has built its model:

- Is the checkpoint intact? A file missing, shorter or with another CRC than at save time is
  named in one line, together with the previous complete checkpoint to fall back to.
- Can this run load it? A model of another shape, vocabulary or tokenizer cannot; the first
  differing field is named (refused, as Megatron would only fail later with a shape error).
- What changes on resume? A changed global batch, learning rate, schedule or layout is allowed
  and stated: the schedule and the data continue from the consumed samples, this run's values
  apply from the next step, and a new layout reshards weights and optimizer state.

A step Megatron-LM or Megatron Bridge wrote has no `run.json`; `megatron_lm.py` describes it in
the same shape from what that tool keeps, and the same checks apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipes.config.arguments import as_written
from recipes.models.hybrid.pattern import PIPE
from trainer.checkpoint.checksums import crc32s, file_crc32
from trainer.checkpoint.format import (
    FSDP_DTENSOR,
    MANIFEST_FILE,
    TORCH_DIST,
    format_of,
    readable,
    unreadable_text,
)

# Model fields that decide the saved tensors' names, shapes or meaning (a zero-centred norm
# stores gamma - 1): a change cannot load.
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "activation", "normalization", "position_embedding",
    "add_bias_linear", "share_embeddings_and_output_weights", "num_moe_experts",
    "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size", "hybrid_layer_pattern",
    "mamba_state_dim", "mamba_head_dim", "mamba_num_heads", "mamba_num_groups", "mamba_conv_kernel",
    "layernorm_zero_centered_gamma",
    "moe_latent_size", "mtp_use_repeated_layer",  # the latent width; MTP depths stored
)
# Fields a resume may change; each change is stated before launch (sections, then fields).
STATED_FIELDS = (
    "train.global_batch_size", "train.micro_batch_size", "train.train_iters", "train.seed",
    "optimizer.lr", "optimizer.min_lr", "optimizer.weight_decay", "optimizer.clip_grad",
    "scheduler.style", "scheduler.warmup_iters", "scheduler.decay_iters", "precision.dtype",
    "model.seq_length", "model.rotary_base", "model.rotary_percent", "model.rope_scaling_factor",
    "data.source",
    "data.blend", "data.documents", "data.eod_mask_loss", "optimizer.fsdp",
    "model.attention_softmax_in_fp32", "data.pack_order",
)
LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "dp")


def file_record(path: Path) -> dict[str, int]:
    """Size and CRC-32 of one file, read in chunks (what `run.json` lists per file)."""
    crc, size = file_crc32(path)
    return {"bytes": size, "crc32": crc}


def layout_record(layout) -> dict[str, int]:
    return {"tp": layout.tensor, "pp": layout.pipeline, "vpp": layout.virtual_stages,
            "cp": layout.context, "ep": layout.expert, "dp": layout.data_parallel}


def layout_text(record: dict[str, int]) -> str:
    parts = [f"{key.upper()}{record[key]}" for key in LAYOUT_KEYS if record.get(key, 1) > 1]
    return "x".join(parts) or "one rank"


def tokenizer_identity(cfg) -> dict[str, Any]:
    """The tokenizer a run's data was made with: the byte tokenizer, or the blend's ids, the
    CRC-32 of each tokenizer file its manifests name (what decides a match) and their folders
    (what a refusal names)."""
    if cfg.data.source != "blend" or cfg.data.blend is None:
        return {"kind": cfg.data.tokenizer}
    from recipes.config.blend import load_blend, manifest_tokenizer, named_paths

    blend = load_blend(cfg.data.blend, verify=False)  # its ids only: at every save
    files, folders = set(), set()
    for name in named_paths(cfg.data.blend)[1:]:
        path = Path(name)
        if path.suffix != ".json" or not path.is_file():
            continue
        found = manifest_tokenizer(name, json.loads(path.read_text(encoding="utf-8")))
        if found is None or not found.exists():
            continue
        folders.add(str(found.resolve()))  # a Hugging Face folder (older: its one file)
        found = found / "tokenizer.json" if found.is_dir() else found
        if found.is_file():
            files.add(file_record(found)["crc32"])
    return {"kind": "prepared", "vocab_size": blend.vocab_size, "eod_id": blend.eod_id,
            "files_crc32": sorted(files), "folders": sorted(folders)}


def read_manifest(step_dir: Path) -> dict[str, Any] | None:
    """The checkpoint's `run.json`, or None when it has none (or an unreadable one): a step
    another tool wrote has none by design; for one of this project's steps `manifest_problem`
    says what is wrong with it."""
    try:
        manifest = json.loads((step_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "files" in manifest else None


# What the pre-flight reads from every `run.json` (a file without one of them is not whole).
MANIFEST_KEYS = ("step", "consumed_samples", "consumed_tokens", "versions", "files")


def manifest_problem(step_dir: Path) -> str | None:
    """Why the `run.json` of a step this project saved cannot be read, or None. A published
    step always has a whole one (written before the rename), so a missing or broken one means
    the step was damaged since: its checks cannot run, and it is refused like a damaged file."""
    name = f"{step_dir.name}/{MANIFEST_FILE}"
    try:
        text = (step_dir / MANIFEST_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{name} is missing (every step this project saves has one)"
    except PermissionError:
        return unreadable_text(step_dir / MANIFEST_FILE, name)
    except (OSError, UnicodeDecodeError) as err:
        return f"{name} cannot be read ({getattr(err, 'strerror', None) or err})"
    try:
        manifest = json.loads(text)
    except ValueError:
        return f"{name} cannot be read (not valid JSON: cut short or overwritten?)"
    missing = [key for key in MANIFEST_KEYS
               if not isinstance(manifest, dict) or key not in manifest]
    if missing:
        return f"{name} cannot be read (it has no {', '.join(missing)})"
    wrong = shape_problem(manifest)
    return f"{name} cannot be read ({wrong}: edited since the save?)" if wrong else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _file_list(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(entry, dict) and _count(entry.get("bytes")) and _count(entry.get("crc32"))
        for entry in value.values())


def _layout(value: Any) -> bool:
    return isinstance(value, dict) and all(
        _count(value.get(key, 1)) and value.get(key, 1) >= 1 for key in LAYOUT_KEYS)


# What each field of `run.json` that the pre-flight reads must hold (those after the required
# ones are absent, or null, in older saves): a file edited by hand is refused here, in one line,
# rather than met by a check that expects a number and finds text.
MANIFEST_SHAPES: dict[str, tuple[Any, str]] = {
    "step": (_count, "a whole number"),
    "consumed_samples": (_count, "a whole number"),
    "consumed_tokens": (_count, "a whole number"),
    "versions": (lambda value: isinstance(value, dict), "a mapping of package to version"),
    "files": (_file_list, "a mapping of file to its bytes and crc32"),
    "world_size": (lambda value: _count(value) and value >= 1, "a whole number of ranks"),
    "padded_vocab_size": (lambda value: _count(value) and value >= 1, "a whole number"),
    "layout": (_layout, f"a mapping of {', '.join(LAYOUT_KEYS)} to sizes"),
    "tokenizer": (lambda value: isinstance(value, dict), "a mapping"),
    "config": (lambda value: isinstance(value, dict), "a mapping of the run's settings"),
}


def shape_problem(manifest: dict[str, Any]) -> str | None:
    """The first field of a `run.json` whose value is not what the save writes there, or None."""
    for key, (fits, what) in MANIFEST_SHAPES.items():
        optional = key not in MANIFEST_KEYS
        if key in manifest and not fits(manifest[key]) and not (optional and manifest[key] is None):
            value = manifest[key]
            if key == "files" and isinstance(value, dict):  # name the entry, not the whole list
                name, entry = next((name, entry) for name, entry in value.items()
                                   if not _file_list({name: entry}))
                key, value = f"files entry {name}", entry
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"its {key} is {shown}, not {what}"
    return None


def damaged_file(step_dir: Path, manifest: dict[str, Any], checksums: bool) -> str | None:
    """The first file of the checkpoint that is missing, truncated, changed since the save or
    not readable by this user (checked for every file, with or without `checksums`: torch DCP
    would otherwise fail in every rank); then, with `checksums`, the first whose CRC-32 differs
    from the save's, the files read side by side under a bar (`checksums.crc32s`)."""
    listed = sorted(manifest["files"].items())
    for name, saved in listed:
        path, shown = step_dir / name, f"{step_dir.name}/{name}"
        try:
            if not path.is_file():
                return f"{shown} is missing"
            size = path.stat().st_size
        except PermissionError:
            return unreadable_text(step_dir, step_dir.name)
        except OSError as err:
            return f"{shown} cannot be read ({err.strerror or err})"
        if size != saved["bytes"]:
            return f"{shown} is truncated or changed ({size} of {saved['bytes']} bytes)"
        if not readable(path):
            return unreadable_text(path, shown)
    if not checksums:
        return None
    found = crc32s([step_dir / name for name, _ in listed])
    for name, saved in listed:
        path, shown = step_dir / name, f"{step_dir.name}/{name}"
        crc = found[path]
        if isinstance(crc, PermissionError):
            return unreadable_text(path, shown)
        if isinstance(crc, OSError):
            return f"{shown} cannot be read ({crc.strerror or crc})"
        if crc != saved["crc32"]:
            return f"{shown} is corrupted (its CRC-32 differs from the save's)"
    return None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (how overrides name fields)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shape_value(name: str, value: Any) -> Any:
    """A hybrid pattern's `|` marks are stage boundaries (layout), not shape: `M*-ME-` saved
    resumes as `M*|-M|E|-` at PP2 x VPP2; its MTP depths after `/` are shape."""
    if name == "hybrid_layer_pattern" and isinstance(value, str):
        return value.replace(PIPE, "")
    return value


def _effective(flat: dict[str, Any], name: str) -> Any:
    """A shape field as the model builds it: the unset ones that follow from others filled in
    (Megatron-LM saves them filled, `training/arguments.py` validate_args)."""
    value = _shape_value(name, flat.get(f"model.{name}"))
    if value is not None:
        return value
    get = flat.get
    if name == "kv_channels" and get("model.hidden_size") and get("model.num_attention_heads"):
        return get("model.hidden_size") // get("model.num_attention_heads")
    if name == "num_query_groups":
        return get("model.num_attention_heads")
    if name == "moe_ffn_hidden_size" and get("model.num_moe_experts"):
        return get("model.ffn_hidden_size")
    if name == "mamba_num_heads" and get("model.hybrid_layer_pattern") and get(
            "model.mamba_head_dim"):
        return 2 * get("model.hidden_size") // get("model.mamba_head_dim")
    return None


def _family(flat: dict[str, Any]) -> str:
    pattern = flat.get("model.hybrid_layer_pattern")
    return f"a hybrid model (model.hybrid_layer_pattern={pattern})" if pattern else "a GPT model"


def family_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """A GPT checkpoint for a hybrid run or the other way round: other modules altogether."""
    if "model.hybrid_layer_pattern" not in saved or bool(
            saved["model.hybrid_layer_pattern"]) == bool(current.get("model.hybrid_layer_pattern")):
        return None
    name = f" (the saved run's: {saved['name']})" if saved.get("name") else ""
    return (f"it holds {_family(saved)} and this run builds {_family(current)}; load it with a "
            f"recipe of its family{name}")


def shape_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """`model.X=a` (saved) vs `model.X=b` (this run) for the first shape field that differs
    (compared as the model builds them: an unset KV width is hidden / heads). A GPT model and a
    hybrid one are named as such first: their layer counts differing is not what to mend."""
    family = family_mismatch(saved, current)
    if family:
        return family
    for name in SHAPE_FIELDS:
        key = f"model.{name}"
        if key in saved and _effective(saved, name) != _effective(current, name):
            return f"it was saved with {key}={saved[key]}, this run has {key}={current.get(key)}"
    return None


IDENTITY_KEYS = ("kind", "vocab_size", "eod_id", "files_crc32")  # what makes two the same


def tokenizer_mismatch(saved: dict[str, Any] | None, current: dict[str, Any],
                       saved_blend: str | None = None) -> str | None:
    """Why a checkpoint trained on one tokenizer's ids cannot go on with another's (the same
    ids would mean other text), naming both tokenizers and the setting to change; None when
    they are the same files (wherever they lie now) or the checkpoint records none."""
    if saved is None or all(saved.get(k) == current.get(k) for k in IDENTITY_KEYS):
        return None
    back = (f"set data.blend back to a blend prepared with the saved tokenizer (the saved run "
            f"had data.blend={saved_blend})" if saved_blend else
            "set data.source back to the saved run's" if saved.get("kind") != "prepared" else
            "set data.blend to a blend prepared with the saved tokenizer")
    return (f"it was trained with {_tokenizer_text(saved)}, this run's data uses "
            f"{_tokenizer_text(current)}; {back}, or train from scratch without "
            "checkpoint.load")


def _tokenizer_text(identity: dict[str, Any]) -> str:
    if identity.get("kind") != "prepared":
        return f"the {identity.get('kind')} tokenizer of the built-in corpora"
    ids = f"vocab {identity.get('vocab_size')}, EOD {identity.get('eod_id')}"
    folders = identity.get("folders")
    if folders:
        return f"tokenizer {', '.join(folders)} ({ids})"
    return f"a prepared tokenizer ({ids}, tokenizer.json CRC-32 {identity.get('files_crc32')})"


# What a run saved before a stated field existed trained with: its record lacks the key.
BEFORE_THE_FIELD = {"model.attention_softmax_in_fp32": True, "data.pack_order": "v1"}


def _stated(flat: dict[str, Any], key: str) -> Any:
    """A stated field as the run uses it: unset decay iterations are the training iterations
    (Megatron-LM saves them filled, `--lr-decay-iters` = `--train-iters`); a field newer than
    the record, what the run trained with then (`BEFORE_THE_FIELD`); the pack order of a run
    without packed rows, None (nothing read it)."""
    value = flat.get(key, BEFORE_THE_FIELD.get(key))
    if key == "scheduler.decay_iters" and value is None:
        return flat.get("train.train_iters")
    if key == "data.pack_order" and flat.get("data.documents") != "packed":
        return None  # read by packed rows only
    return value


def stated_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`field a -> b` for every field a resume may change and this run did: set to another
    value, and so used with another. A field left unset in both that follows another (decay
    iterations follow train_iters) is not a change of its own: the other field is stated."""
    return [f"{key} {as_written(_stated(saved, key))} -> {as_written(_stated(current, key))}"
            for key in STATED_FIELDS
            if (key in saved or key in BEFORE_THE_FIELD) and saved.get(key) != current.get(key)
            and _stated(saved, key) != _stated(current, key)]


def _current(cfg) -> dict[str, Any]:
    from recipes.config.io import config_dict

    return flatten(config_dict(cfg))


def _padding_mismatch(cfg, manifest: dict[str, Any]) -> str | None:
    saved = manifest.get("padded_vocab_size")
    padded = cfg.layout.padded_vocab
    if saved is None or saved == padded:
        return None
    return (f"its vocabulary is padded to {saved} rows, this run pads to {padded} "
            "(model.make_vocab_size_divisible_by x TP); choose model.make_vocab_size_divisible_by "
            f"so that TP {cfg.parallel.tensor} pads to {saved}")


def incompatibility(cfg, manifest: dict[str, Any]) -> str | None:
    """Why this run cannot load the checkpoint's model at all (shape, padding)."""
    saved = flatten(manifest.get("config") or {})
    return shape_mismatch(saved, _current(cfg)) or _padding_mismatch(cfg, manifest)


def tokenizer_refusal(cfg, manifest: dict[str, Any]) -> str | None:
    """Why this run's data cannot go on from the checkpoint's (`tokenizer_mismatch`)."""
    saved = flatten(manifest.get("config") or {})
    return tokenizer_mismatch(manifest.get("tokenizer"), tokenizer_identity(cfg),
                              saved.get("data.blend"))


def _experts_apart(flat: dict[str, Any]) -> bool:
    """Whether a run's expert weights have an optimizer of their own: Megatron gives them the
    expert process groups only with EP > 1 or an expert-TP other than TP
    (`tensor_parallel/layers.py:961-963`), and only those go to a second, chained optimizer
    (`optimizer/__init__.py:1180-1186`); otherwise they sit in the dense model's."""
    tp = flat.get("parallel.tensor") or 1
    return (flat.get("parallel.expert") or 1) > 1 or (
        flat.get("parallel.expert_tensor") or tp) != tp


def expert_optimizer_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why a full resume cannot load this MoE checkpoint's optimizer state, or None: one run
    keeps the experts in their own optimizer, the other in the dense model's, and Megatron's
    chained optimizer loads only as many optimizers as it saved (`optimizer/optimizer.py:
    1573-1581`), whatever the format."""
    saved = flatten(manifest.get("config") or {})
    if not saved.get("model.num_moe_experts") or cfg.checkpoint.load_model_only:
        return None
    before, now = _experts_apart(saved), _experts_apart(_current(cfg))
    if before == now:
        return None
    where = {True: "an optimizer of their own (EP > 1 or expert-TP != TP)",
             False: "the dense model's optimizer (EP1, expert-TP = TP)"}
    return (f"its experts' optimizer state was saved in {where[before]} and this run keeps them "
            f"in {where[now]}, which Megatron's chained optimizer cannot load; resume with "
            f"{'EP > 1 or expert-TP != TP' if before else 'EP1 and expert-TP = TP'}, or start "
            "from its weights with checkpoint.load_model_only=true (a fresh optimizer)")


def fsdp_mamba_tp_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why this run cannot load a Megatron FSDP checkpoint of a model with Mamba layers at
    another TP, or None. `fsdp_dtensor` stores a Mamba mixer's `in_proj` and `conv1d` whole,
    as each TP rank's [z; x; B; C; dt] parts end to end (no per-part sharding as torch_dist's
    `MambaMixer.sharded_state_dict` gives): DCP would cut them as one tensor, mixing parts."""
    saved = flatten(manifest.get("config") or {})
    pattern = saved.get("model.hybrid_layer_pattern") or ""
    if saved.get("optimizer.fsdp", "none") == "none" or "M" not in pattern:
        return None
    before, now = saved.get("parallel.tensor") or 1, cfg.parallel.tensor
    if before == now:
        return None
    return (f"its Mamba layers were saved by Megatron FSDP at TP{before}, each in_proj and "
            f"conv1d as every TP rank's parts end to end, which cannot be cut for TP{now}; "
            f"resume with parallel.tensor={before}, or export it (scripts/convert.py export) "
            "and import it at the new TP")


def optimizer_kind_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why a full resume cannot load this checkpoint's optimizer state, saved by the other kind
    of optimizer, or None. The distributed optimizer saves its state in its own sharded form
    (flat buffer slices, or per parameter with `fully_reshardable`) and plain Adam per
    parameter under other keys and param groups: Megatron 0.19.2 fails after every rank has
    built its model, whichever way and in either format (a `KeyError` or `ValueError` loading
    into plain Adam; `CheckpointingException: ShardedTensor.flattened_range is not supported`
    loading into the distributed optimizer). Megatron FSDP's checkpoints are `format_problem`'s."""
    saved = flatten(manifest.get("config") or {})
    if cfg.checkpoint.load_model_only or "optimizer.distributed" not in saved:
        return None
    if saved.get("optimizer.fsdp", "none") != "none" or cfg.optimizer.fsdp != "none":
        return None
    before, now = bool(saved["optimizer.distributed"]), bool(cfg.optimizer.distributed)
    if before == now:
        return None
    kind = {True: "the distributed optimizer (optimizer.distributed=true)",
            False: "plain Adam (optimizer.distributed=false)"}
    return (f"its optimizer state was saved by {kind[before]} and this run uses {kind[now]}, "
            "which cannot load it; resume with "
            f"optimizer.distributed={str(before).lower()}, or start from its weights with "
            "checkpoint.load_model_only=true (a fresh optimizer)")


def precision_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why a full resume cannot load this checkpoint's optimizer state under another
    `precision.dtype`, or None. Measured on CPU ranks (tiny recipes, 2 steps then a resume):
    the distributed optimizer's `dp_reshardable` state is keyed by its buffers' dtype pair
    (distrib_optimizer.py:1893-1894), so any change fails in the load (KeyError), bf16 <-> fp16
    included; plain Adam and Megatron FSDP hold fp32 main copies of the weights under bf16 or
    fp16 and none under fp32 (`optimizer.state.fp32_param...`), so a move across fp32 fails
    and bf16 <-> fp16 resumes; `fully_reshardable` state resumed both ways."""
    config = flatten(manifest.get("config") or {})
    saved, now = config.get("precision.dtype"), cfg.precision.dtype
    if cfg.checkpoint.load_model_only or saved is None or saved == now:
        return None
    weights = ("start from its weights with checkpoint.load_model_only=true (a fresh "
               "optimizer)")
    sharded = config.get("optimizer.distributed") and config.get("optimizer.fsdp", "none") == \
        "none"
    if sharded and config.get("checkpoint.optimizer_format") == "dp_reshardable":
        return (f"its optimizer state was saved dp_reshardable at precision.dtype={saved}, "
                "keyed by the dtypes of the distributed optimizer's buffers; resume with "
                f"precision.dtype={saved}, or {weights}, or save with "
                "checkpoint.optimizer_format=fully_reshardable to change precision")
    if sharded or "fp32" not in (saved, now):
        return None
    return (f"its optimizer state was saved at precision.dtype={saved} and this run's "
            f"precision.dtype={now} keeps {'no' if now == 'fp32' else 'fp32'} main copies of "
            f"the weights, which Megatron's optimizer state is keyed by; resume with "
            f"precision.dtype={saved}, or {weights}")


def iterations_problem(cfg, step: int) -> str | None:
    """Why a full resume from `step` cannot continue, or None: the step loop runs while the step
    is below `train.train_iters`, so a run asked to end before the checkpoint's step would end
    at once, rc 0 and no checkpoint, as if it had trained. Ending exactly at it is a finished
    run (`finished_note`): a Slurm job requeued after its last save must end well, not fail."""
    iters = cfg.train.train_iters
    if cfg.checkpoint.load_model_only or iters >= step:
        return None
    return (f"train.train_iters={iters} is before the checkpoint's step {step}, so this run "
            f"would train no step; raise it (e.g. train.train_iters={max(2 * step, step + 1)})")


def finished_note(cfg, step: int) -> str | None:
    """The line of a full resume whose checkpoint already ends the run."""
    if cfg.checkpoint.load_model_only or cfg.train.train_iters != step:
        return None
    return (f"the checkpoint is at step {step} = train.train_iters: the run is finished and "
            "trains no step (raise train.train_iters to train on)")


def reshard_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why a full resume cannot reshard this checkpoint's optimizer state, or None.

    `dp_reshardable` stores each data-parallel rank's own slice of the distributed optimizer's
    flat buffers, whose layout follows the TP/PP/VPP/CP/EP split (Megatron: "allows checkpoint
    resharding only in DP dimension", `optimizer/distrib_optimizer.py:1472-1476`)."""
    mamba = fsdp_mamba_tp_problem(cfg, manifest)
    if mamba:
        return mamba
    experts = expert_optimizer_problem(cfg, manifest)
    if experts:
        return experts
    saved = flatten(manifest.get("config") or {})
    if not saved.get("optimizer.distributed") or cfg.checkpoint.load_model_only:
        return None
    if saved.get("checkpoint.optimizer_format") != "dp_reshardable":
        return None
    if saved.get("optimizer.fsdp", "none") != "none":
        return None  # fsdp_dtensor: torch DCP reshards its DTensors (`format_problem`)
    before, now = manifest.get("layout") or {}, layout_record(cfg.layout)
    changed = [key.upper() for key in LAYOUT_KEYS if key != "dp" and key in before
               and before[key] != now[key]]
    if not changed:
        return None
    return (f"its optimizer state was saved dp_reshardable at {layout_text(before)}, which "
            f"reshards over DP only, and this run changes {'/'.join(changed)} "
            f"({layout_text(now)}); resume at the saved layout, or start from its weights with "
            "checkpoint.load_model_only=true (a fresh optimizer), or save with "
            "checkpoint.optimizer_format=fully_reshardable to move between layouts")


def _saved_format(manifest: dict[str, Any]) -> tuple[str, str]:
    """(format, Megatron FSDP level) a checkpoint was saved with, from its config."""
    fsdp = flatten(manifest.get("config") or {}).get("optimizer.fsdp", "none")
    return (TORCH_DIST if fsdp == "none" else FSDP_DTENSOR), fsdp


def format_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why this run cannot load a checkpoint saved in the other format, or None.

    Megatron FSDP (`optimizer.fsdp`) saves and resumes `fsdp_dtensor` (torch DCP of its
    DTensors, which reshard to any DP, TP, CP or sharding level it trains); the other runs
    `torch_dist`. A `torch_dist` checkpoint's weights load into a Megatron FSDP run
    (`checkpoint.load_model_only`: before the wrap, as any layout's); its optimizer state does
    not (the distributed optimizer's flat buffers are no DTensors). An `fsdp_dtensor`
    checkpoint has no reader outside Megatron FSDP."""
    saved, level = _saved_format(manifest)
    now = format_of(cfg)
    if saved == now or (saved == TORCH_DIST and cfg.checkpoint.load_model_only):
        return None
    if saved == TORCH_DIST:
        return (f"it was saved {TORCH_DIST} (optimizer.fsdp=none) and Megatron FSDP "
                f"(optimizer.fsdp={cfg.optimizer.fsdp}) resumes only {FSDP_DTENSOR}; resume "
                "with optimizer.fsdp=none, or start from its weights with "
                "checkpoint.load_model_only=true (a fresh optimizer)")
    return (f"it was saved {FSDP_DTENSOR} by Megatron FSDP (optimizer.fsdp={level}), which only "
            f"a Megatron FSDP run reads; resume with optimizer.fsdp={level} (any DP, TP or "
            "sharding level)")


def change_notes(cfg, manifest: dict[str, Any], rng: str = "per-rank RNG streams start "
                 "afresh") -> list[str]:
    """What a full resume changes, one line each: the stated fields, then the layout (`rng`
    says what becomes of the RNG streams under the new one)."""
    notes = []
    changes = stated_changes(flatten(manifest.get("config") or {}), _current(cfg))
    if changes:
        notes.append(f"changed since the save: {', '.join(changes)}; this run's values apply "
                     "from the next step, the schedule and the data continue from sample "
                     f"{manifest['consumed_samples']}")
    saved_layout, layout = manifest.get("layout") or {}, layout_record(cfg.layout)
    if any(layout[key] != value for key, value in saved_layout.items()):
        ranks = manifest.get("world_size")
        notes.append(f"layout {layout_text(saved_layout)}"
                     f"{f' ({ranks} ranks)' if ranks else ''} -> {layout_text(layout)} "
                     f"({cfg.layout.world_size} ranks): weights and optimizer state are "
                     f"resharded; {rng}")
    return notes


def resume_notes(cfg, step_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """What a full resume continues from and what it changes, one line each (printed)."""
    return [f"resuming from {step_dir} (step {manifest['step']}, "
            f"{manifest['consumed_samples']} samples, {manifest['consumed_tokens']} loss tokens; "
            f"saved by mcore-recipes {manifest['versions'].get('mcore-recipes')}, torch "
            f"{manifest['versions'].get('torch')}, megatron-core "
            f"{manifest['versions'].get('megatron-core')})", *change_notes(cfg, manifest)]
