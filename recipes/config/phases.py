"""Pretraining in phases: a recipe's run as an ordered list of stretches of training.

Nemotron-style pretraining is not one blend at one batch for one run: it switches to a
higher-quality blend for its last part (where a warm-up–stable–decay schedule decays), may
raise its batch, and extends its context in a long-sequence phase. A recipe says so with
`phases`, a list of `PhaseConfig`, each saying where it ends (a share of the run's tokens, or
the step it ends at), its blend, and the changes a phase may make:

    phases:
      - {name: general, tokens: 0.8}
      - {name: quality, tokens: 0.2, blend: conf/data/quality.yaml, lr_decay: true}

Inside one run a phase may change its blend, its global batch and whether the one learning-rate
schedule decays over it; its sequence length and context-parallel size change what a running
world holds, so a phase that changes them says `relaunch: true` (it starts from the previous
phase's last checkpoint). No phases: one phase covering the run, from the run's own fields.

`phase_spans` resolves the list to steps (torch-free, the trainer, the planner and the summary
read the same spans); the rules below, one pure function each, refuse every phase mistake in one
line before any rank starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from recipes.config.rampup import check_rampup_shape, ramp_schedule, samples_after
from recipes.config.schema import PhaseConfig, RunConfig

SHARE_TOLERANCE = 1e-6  # token shares must add up to 1 within this
# What a running world holds and a phase may change only with a new launch.
LAUNCH_FIELDS = ("seq_length", "context", "documents", "micro_batch_size")


@dataclass(frozen=True)
class PhaseSpan:
    """A phase resolved to steps [start_step, end_step) with every value it trains with."""

    index: int
    name: str
    start_step: int
    end_step: int
    start_sample: int  # consumed samples of the run when the phase starts
    end_sample: int  # and when it ends (through a batch ramp-up when there is one)
    blend: str | None
    global_batch_size: int
    seq_length: int
    context: int
    documents: str
    micro_batch_size: int
    lr_decay: bool
    relaunch: bool

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step

    @property
    def samples(self) -> int:
        """Samples the phase trains: its steps at its batch, or what the batch ramp-up takes
        over its steps (`recipes/config/rampup.py`): the one count every tokens figure uses."""
        return self.end_sample - self.start_sample

    @property
    def tokens(self) -> int:
        return self.samples * self.seq_length


def _value(phase_value, run_value):
    return run_value if phase_value is None else phase_value


def _resolved(cfg: RunConfig, phase: PhaseConfig, previous: PhaseSpan | None) -> dict:
    """The values a phase trains with: its own, else the previous phase's, else the run's."""
    base = {"blend": cfg.data.blend, "global_batch_size": cfg.train.global_batch_size,
            "seq_length": cfg.model.seq_length, "context": cfg.parallel.context,
            "documents": cfg.data.documents, "micro_batch_size": cfg.train.micro_batch_size}
    if previous is not None:
        base = {name: getattr(previous, name) for name in base}
    return {name: _value(getattr(phase, name), run) for name, run in base.items()}


def _end_steps(cfg: RunConfig, values: list[dict]) -> list[int]:
    """Each phase's end step: given, or from token shares. A phase of share s with t tokens per
    step runs s·T/t steps; T is the token count that fills `train.train_iters` steps."""
    phases, total = cfg.phases, cfg.train.train_iters
    if phases[0].tokens is None:
        return [int(_value(p.end_step, total)) for p in phases]
    weights = [p.tokens / (v["global_batch_size"] * v["seq_length"])
               for p, v in zip(phases, values, strict=True)]
    cumulative = [sum(weights[: i + 1]) / sum(weights) for i in range(len(weights))]
    ends = [round(total * share) for share in cumulative]
    ends[-1] = total
    return ends


def phase_spans(cfg: RunConfig) -> tuple[PhaseSpan, ...]:
    """The run's phases resolved to steps (one span over the whole run without phases).
    Call on a validated config: the rules below guarantee every phase has a step."""
    if not cfg.phases:
        single = PhaseConfig(name="run", end_step=cfg.train.train_iters)
        cfg = dataclasses.replace(cfg, phases=[single])
    spans: list[PhaseSpan] = []
    values: list[dict] = []
    for phase in cfg.phases:  # values chain: a null keeps the previous phase's value
        span_values = _resolved(cfg, phase, _as_previous(values))
        values.append(span_values)
    ramp = ramp_schedule(cfg) if check_rampup_shape(cfg) is None else None  # refused elsewhere
    start, sample = 0, 0
    for index, (phase, end) in enumerate(zip(cfg.phases, _end_steps(cfg, values), strict=True)):
        end_sample = (samples_after(ramp, end) if ramp is not None
                      else sample + (end - start) * values[index]["global_batch_size"])
        span = PhaseSpan(index=index, name=phase.name, start_step=start, end_step=end,
                         start_sample=sample, end_sample=end_sample, lr_decay=phase.lr_decay,
                         relaunch=phase.relaunch, **values[index])
        spans.append(span)
        start, sample = end, end_sample
    return tuple(spans)


def _as_previous(values: list[dict]) -> PhaseSpan | None:
    """The previous phase's values in the shape `_resolved` reads (steps do not matter)."""
    if not values:
        return None
    return PhaseSpan(index=0, name="", start_step=0, end_step=0, start_sample=0, end_sample=0,
                     lr_decay=False, relaunch=False, **values[-1])


def span_at(spans: tuple[PhaseSpan, ...], step: int) -> PhaseSpan:
    """The phase that trains step `step` (0-based: the step about to run); the last phase
    after the end."""
    return next((s for s in spans if s.start_step <= step < s.end_step), spans[-1])


def samples_at(spans: tuple[PhaseSpan, ...], step: int) -> int:
    """Consumed samples after `step` steps (what Megatron's schedule counts) without a batch
    ramp-up (`run_samples_at` takes both); past the end at the last phase's batch."""
    span = next((s for s in spans if step <= s.end_step), spans[-1])
    return span.start_sample + max(0, step - span.start_step) * span.global_batch_size


def phase_config(cfg: RunConfig, span: PhaseSpan) -> RunConfig:
    """The run config one phase trains with (its blend, batch, sequence, CP, documents; no
    phases)."""
    return dataclasses.replace(
        cfg, phases=[],
        data=dataclasses.replace(cfg.data, blend=span.blend, documents=span.documents),
        train=dataclasses.replace(cfg.train, global_batch_size=span.global_batch_size,
                                  micro_batch_size=span.micro_batch_size),
        model=dataclasses.replace(cfg.model, seq_length=span.seq_length),
        parallel=dataclasses.replace(cfg.parallel, context=span.context),
    )


# --- rules: one pure function per mistake -------------------------------------------------

def _named(index: int, phase: PhaseConfig) -> str:
    return f"phases[{index}] ({phase.name})"


def check_phase_names(cfg: RunConfig) -> str | None:
    """Names label the logs and key each phase's saved data position: present and unique."""
    seen: set[str] = set()
    for index, phase in enumerate(cfg.phases):
        if not phase.name.strip():
            return f"phases[{index}] has an empty name; give every phase a name, e.g. name: decay"
        if phase.name in seen:
            return (f"{_named(index, phase)}: the name is used by an earlier phase; give every "
                    "phase its own name")
        seen.add(phase.name)
    return None


def check_phase_end(cfg: RunConfig) -> str | None:
    """Each phase says where it ends in exactly one way, and all phases in the same way."""
    for index, phase in enumerate(cfg.phases):
        if (phase.tokens is None) == (phase.end_step is None):
            return (f"{_named(index, phase)} needs exactly one of tokens (its share of the "
                    "run's tokens) or end_step; set one, e.g. tokens: 0.2")
    kinds = {phase.tokens is None for phase in cfg.phases}
    if len(kinds) > 1:
        return ("phases mix tokens and end_step; say where every phase ends the same way "
                "(all token shares or all end steps)")
    return None


def check_phase_shares(cfg: RunConfig) -> str | None:
    """Token shares are positive and add up to the whole run."""
    shares = [p.tokens for p in cfg.phases if p.tokens is not None]
    if not shares or check_phase_end(cfg) is not None:
        return None
    for index, phase in enumerate(cfg.phases):
        if not math.isfinite(phase.tokens) or phase.tokens <= 0:
            return (f"{_named(index, phase)}: tokens={phase.tokens} must be a positive share "
                    "of the run's tokens, e.g. tokens: 0.2")
    if abs(sum(shares) - 1.0) > SHARE_TOLERANCE:
        return (f"phases' token shares add up to {sum(shares):g}, not 1; make them cover the "
                f"run ({' + '.join(f'{s:g}' for s in shares)})")
    return None


def check_phase_steps(cfg: RunConfig) -> str | None:
    """End steps rise and the last phase ends with the run (phases cover the run)."""
    ends = [p.end_step for p in cfg.phases if p.end_step is not None]
    if not ends or check_phase_end(cfg) is not None:
        return None
    previous = 0
    for index, phase in enumerate(cfg.phases):
        if phase.end_step <= previous:
            return (f"{_named(index, phase)}: end_step={phase.end_step} must be after the "
                    f"previous phase's end ({previous}); phases follow each other")
        previous = phase.end_step
    total = cfg.train.train_iters
    if ends[-1] != total:
        return (f"the last phase ends at step {ends[-1]} but the run has train.train_iters="
                f"{total}; phases must cover the run: set its end_step: {total}")
    return None


def _resolvable(cfg: RunConfig) -> bool:
    """Whether the phases can be resolved to steps (the shape rules above hold)."""
    shape = (check_phase_positive, check_phase_end, check_phase_shares, check_phase_steps)
    return bool(cfg.phases) and all(rule(cfg) is None for rule in shape)


def check_phase_lengths(cfg: RunConfig) -> str | None:
    """Token shares too small for the run's steps would leave a phase without a step."""
    if not _resolvable(cfg) or cfg.phases[0].tokens is None:
        return None
    for span, phase in zip(phase_spans(cfg), cfg.phases, strict=True):
        if span.steps < 1:
            return (f"{_named(span.index, phase)}: tokens={phase.tokens:g} is less than one "
                    f"step of {cfg.train.train_iters}; raise its share or train.train_iters")
    return None


def check_phase_blend(cfg: RunConfig) -> str | None:
    """A phase's blend, and its rows of whole documents, are prepared data: the run trains on
    blends (the file is checked on disk with the other paths, before launch)."""
    for index, phase in enumerate(cfg.phases):
        if phase.blend is not None and cfg.data.source != "blend":
            return (f"{_named(index, phase)}: blend={phase.blend} needs data.source=blend "
                    "(a phase's blend is prepared data); set data.source=blend "
                    "data.blend=<first blend>")
        if phase.documents not in (None, "concatenate") and cfg.data.source != "blend":
            return (f"{_named(index, phase)}: documents: {phase.documents} needs prepared data "
                    "(data.source=blend); set data.source=blend data.blend=<first blend>")
    return None


def check_phase_relaunch(cfg: RunConfig) -> str | None:
    """Sequence length, CP size and how documents share a row (the data loader and the packing
    plugin a launch builds) change what a running world holds: a phase that changes them starts
    as a new launch, and says so; the first phase has nothing to relaunch from."""
    if cfg.phases and cfg.phases[0].relaunch:
        return (f"{_named(0, cfg.phases[0])}: relaunch: true on the first phase starts from "
                "nothing; set it on the phase that changes the layout")
    spans = phase_spans(cfg)
    for before, span in zip(spans, spans[1:], strict=False):
        changed = [name for name in LAUNCH_FIELDS
                   if getattr(span, name) != getattr(before, name)]
        if changed and not span.relaunch:
            name = changed[0]
            return (f"{_named(span.index, cfg.phases[span.index])}: changing {name} "
                    f"({getattr(before, name)} -> {getattr(span, name)}) needs a new launch; "
                    "set relaunch: true on this phase")
    return None


def check_relaunch_sequences_given(cfg: RunConfig) -> str | None:
    """With a relaunch the next launch sets model.seq_length to its phase's; a phase that
    inherited the run's sequence length would then change length (and its token share its
    steps), so every phase names its own."""
    if not any(phase.relaunch for phase in cfg.phases):
        return None
    for index, phase in enumerate(cfg.phases):
        if phase.seq_length is None:
            return (f"{_named(index, phase)}: a run with relaunch phases names every phase's "
                    f"seq_length; set seq_length: {cfg.model.seq_length} on it")
    return None


def check_phase_documents_given(cfg: RunConfig) -> str | None:
    """A later launch sets data.documents to its phase's: a phase that inherited the run's would
    then change its rows, so once one phase names its documents every phase does."""
    if all(phase.documents is None for phase in cfg.phases):
        return None
    for index, phase in enumerate(cfg.phases):
        if phase.documents is None:
            return (f"{_named(index, phase)}: a phase of this run names its documents, so every "
                    f"phase does; set documents: {cfg.data.documents} on it")
    return None


def check_relaunch_saves(cfg: RunConfig) -> str | None:
    """A launch that ends where a relaunch phase begins hands over through its checkpoint:
    the run saves, and a CP change (a new layout) with the distributed optimizer saves a
    state that any layout can load (trainer/checkpoint/manifest.py, `reshard_problem`)."""
    if not any(phase.relaunch for phase in cfg.phases):
        return None
    if not cfg.checkpoint.save:
        return ("phases with relaunch: true continue from the checkpoint the launch before "
                "saves at their start, but checkpoint.save=false; set checkpoint.save=true")
    if not _resolvable(cfg):
        return None
    spans = phase_spans(cfg)
    changes_cp = any(a.context != b.context for a, b in zip(spans, spans[1:], strict=False))
    if changes_cp and cfg.optimizer.distributed and \
            cfg.checkpoint.optimizer_format != "fully_reshardable":
        return ("a relaunch phase changes parallel.context, a new layout, and the distributed "
                f"optimizer's {cfg.checkpoint.optimizer_format} state reshards over DP only; "
                "set checkpoint.optimizer_format=fully_reshardable")
    return None


def launch_end(spans: tuple[PhaseSpan, ...], start_step: int) -> int:
    """The step a launch starting at `start_step` trains to: the start of the next phase that
    needs a new launch, else the run's end."""
    return next((s.start_step for s in spans if s.relaunch and s.start_step > start_step),
                spans[-1].end_step)


def launch_starts(spans: tuple[PhaseSpan, ...]) -> tuple[PhaseSpan, ...]:
    """The first phase of each launch the run takes: the first phase, then every phase that
    needs a new launch (one job each under scripts/launch.py)."""
    return tuple(s for s in spans if s.index == 0 or s.relaunch)


def relaunch_overrides(span: PhaseSpan) -> list[str]:
    """The overrides that start a launch in `span`'s layout."""
    return [f"model.seq_length={span.seq_length}", f"parallel.context={span.context}",
            f"data.documents={span.documents}", f"train.micro_batch_size={span.micro_batch_size}"]


def continue_overrides(span: PhaseSpan) -> list[str]:
    """What a later launch adds to the run's saved config: the full resume from the run's
    newest checkpoint (not a `checkpoint.load` the run started from, nor the resolved resume
    the saved config holds) and the layout of the phase it starts in."""
    return ["checkpoint.load=null", "checkpoint.load_model_only=false", "checkpoint.resume=true",
            *relaunch_overrides(span)]


def _layout(cfg: RunConfig) -> tuple[int, int, str, int]:
    return (cfg.model.seq_length, cfg.parallel.context, cfg.data.documents,
            cfg.train.micro_batch_size)


def _span_layout(span: PhaseSpan) -> tuple[int, int, str, int]:
    return span.seq_length, span.context, span.documents, span.micro_batch_size


def launch_finished(cfg: RunConfig, start_step: int) -> bool:
    """A launch in the layout of the phases that end at `start_step`, where a phase that needs
    a new launch begins: a requeue of that launch after its last save, with nothing left to
    train in its layout."""
    if not cfg.phases or start_step >= cfg.train.train_iters:
        return False
    spans = phase_spans(cfg)
    span = span_at(spans, start_step)
    if not span.relaunch or span.start_step != start_step:
        return False
    before = spans[span.index - 1]
    return _layout(cfg) == _span_layout(before) != _span_layout(span)


def launch_stop(cfg: RunConfig, start_step: int) -> int:
    """The step this launch trains to from `start_step` (its own start when it is finished)."""
    if launch_finished(cfg, start_step):
        return start_step
    return launch_end(phase_spans(cfg), start_step)


def launch_layout(cfg: RunConfig, start_step: int) -> list[str]:
    """The overrides that put a launch starting at `start_step` into the layout of the phase
    that step is in (none when it is in it already): the phase comes from the saved state."""
    if not cfg.phases or start_step >= cfg.train.train_iters:
        return []
    span = span_at(phase_spans(cfg), start_step)
    return [] if _layout(cfg) == _span_layout(span) else relaunch_overrides(span)


def launch_mismatch(cfg: RunConfig, start_step: int) -> str | None:
    """A launch must run in the layout of the phase it starts in (sequence length, CP size):
    None when it does (or has finished its phases), else the one line that says how."""
    overrides = launch_layout(cfg, start_step)
    if not overrides or launch_finished(cfg, start_step):
        return None
    span = span_at(phase_spans(cfg), start_step)
    keys = [o.split("=")[0] for o in relaunch_overrides(span)]
    differ = [(key, want, have) for key, want, have in zip(
        keys, _span_layout(span), _layout(cfg), strict=True) if want != have]
    wanted = " ".join(f"{key}={want}" for key, want, _ in differ)
    found = " ".join(f"{key}={have}" for key, _, have in differ)
    return (f"step {start_step} is in phases[{span.index}] ({span.name}), which trains with "
            f"{wanted}, but this launch has {found}; start it with {' '.join(overrides)}")


def check_phase_lr_decay(cfg: RunConfig) -> str | None:
    """One schedule runs across the phases: at most one phase holds WSD's decay, which
    then sets where the decay starts and ends (not also scheduler.decay_iters/wsd_decay_iters)."""
    decaying = [i for i, p in enumerate(cfg.phases) if p.lr_decay]
    if not decaying:
        return None
    first = cfg.phases[decaying[0]]
    if len(decaying) > 1:
        return (f"phases {', '.join(cfg.phases[i].name for i in decaying)} all set lr_decay; "
                "the one schedule decays once: set lr_decay: true on one phase")
    s = cfg.scheduler
    if s.style != "wsd":
        return (f"{_named(decaying[0], first)}: lr_decay: true places a warm-up–stable–decay "
                f"schedule's decay, but scheduler.style={s.style}; set scheduler.style=wsd")
    if s.decay_iters is not None or s.wsd_decay_iters is not None:
        return (f"{_named(decaying[0], first)}: lr_decay: true sets where the decay runs, so "
                "scheduler.decay_iters and scheduler.wsd_decay_iters must stay null")
    return None


def check_phase_positive(cfg: RunConfig) -> str | None:
    """A phase's batch, sequence and CP sizes are at least 1."""
    for index, phase in enumerate(cfg.phases):
        for name in ("global_batch_size", "seq_length", "context", "end_step",
                     "micro_batch_size"):
            value = getattr(phase, name)
            if value is not None and value < 1:
                return (f"{_named(index, phase)}: {name}={value} must be at least 1, or null "
                        "to keep the previous phase's value")
    return None


def check_each_phase(cfg: RunConfig, rules) -> str | None:
    """Every phase's own config (its batch, sequence, CP) passes the run's rules: a batch
    that does not divide over DP, a sequence CP cannot split, are refused per phase; a
    phase's problem that is the run's own (a setting it inherits) is the run's rule's to say,
    once."""
    if not _resolvable(cfg) or check_phase_lengths(cfg) is not None:
        return None
    said = {rule: rule(cfg) for rule in rules}  # what the run's own rules already say
    for span in phase_spans(cfg):
        phase_cfg = phase_config(cfg, span)
        for rule in rules:
            message = rule(phase_cfg)
            if message is not None and message != said[rule]:
                return f"{_named(span.index, cfg.phases[span.index])}: {message}"
    return None


# Order: the shape of each phase first, so later rules can resolve spans safely.
PHASE_RULES = (
    check_phase_names,
    check_phase_positive,
    check_phase_end,
    check_phase_shares,
    check_phase_steps,
    check_phase_lengths,
    check_phase_blend,
    check_phase_relaunch,
    check_relaunch_sequences_given,
    check_phase_documents_given,
    check_relaunch_saves,
    check_phase_lr_decay,
)


@dataclass(frozen=True)
class ScheduleSamples:
    """The one learning-rate schedule of a run, in consumed samples (Megatron's unit)."""

    warmup: int
    decay: int  # where the decay span ends
    wsd_decay: int  # WSD: the final anneal's length


def wsd_decay_iters(scheduler, train_iters: int) -> int:
    """WSD's final anneal in steps, outside phases: the scheduler's, or a tenth of the decay
    span (`scheduler.decay_iters`, else the whole run)."""
    decay = scheduler.decay_iters or train_iters
    return scheduler.wsd_decay_iters or max(1, decay // 10)


def run_samples_at(cfg: RunConfig, step: int) -> int:
    """Consumed samples after `step` steps of the run: through the batch ramp-up when there is
    one (recipes/config/rampup.py), else through each phase's batch."""
    ramp = ramp_schedule(cfg)
    if ramp is not None:
        return samples_after(ramp, step)
    return samples_at(phase_spans(cfg), step)


def schedule_samples(cfg: RunConfig) -> ScheduleSamples:
    """Warm-up, decay end and WSD anneal in samples across the phases (and a batch ramp-up:
    the schedule counts the samples the steps really take). A phase with `lr_decay` holds
    WSD's anneal: it starts at the phase's first step and ends at its last."""
    spans, s = phase_spans(cfg), cfg.scheduler
    decay_iters = s.decay_iters or cfg.train.train_iters
    wsd_iters = wsd_decay_iters(s, cfg.train.train_iters)
    decaying = next((span for span in spans if span.lr_decay), None)
    if decaying is not None:
        decay_iters, wsd_iters = decaying.end_step, decaying.steps
    decay = run_samples_at(cfg, decay_iters)
    return ScheduleSamples(warmup=run_samples_at(cfg, s.warmup_iters), decay=decay,
                           wsd_decay=decay - run_samples_at(cfg, decay_iters - wsd_iters))
