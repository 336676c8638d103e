"""Per-rank functions for the packed-sequence equality test (run through `launch_ranks`).

Each builds a real session through the trainer (a recipe plus overrides) and runs forward and
backward through `trainer.step.run_schedule`, so the real hooks run: the packing plugin's
`forward_kwargs` on every pipeline stage, the CPU runtime's attention swap, Megatron's schedules
and `finalize_model_grads` (which divides by the loss tokens of the batch). The packed rows are
built here, not read from a blend, so the session's data does not turn packing on: the packing
plugin is added to the session's own plugins (`_packed`), as a blend with
`data.documents=packed` adds it (tests/unit/test_packed_batch.py).
"""

from __future__ import annotations

import numpy as np

from tests.dist.layout_runs import _finish
from tests.dist.layout_runs import _session as _layout_session

SEQ = 32  # one packed row: documents of 7, 12 and 9 tokens, then 4 padding tokens
LENGTHS = (7, 12, 9)
PAD_ID = 0
# Three layers, so that PP3 has a middle stage that must get the boundaries too.
PACKED_OVERRIDES = [
    "model.num_layers=3",
    f"model.seq_length={SEQ}",
    "train.micro_batch_size=1",
]


def _session(payload: dict):
    """The layout tests' session (their small synthetic data, which the session needs; the
    batches are built here) in the packed row's shape, before the payload's own overrides."""
    return _layout_session({**payload,
                            "overrides": [*PACKED_OVERRIDES, *payload.get("overrides", [])]})


def documents() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(1, 256, size=n) for n in LENGTHS]


def _alone_row(document: np.ndarray) -> dict:
    """The document alone at the start of a plain row: ordinary causal attention is exact for
    it (the padding after it is never attended to), and the padding carries no loss."""
    from plugins.protocol.packed_batch import packed_row
    from trainer.data import as_tensors

    row = as_tensors(packed_row([document], SEQ, PAD_ID))
    return {key: row[key] for key in ("tokens", "labels", "loss_mask", "position_ids")}


def _forward_backward(session, microbatches: list[dict], plugins) -> tuple[list | None, dict]:
    """[summed loss, loss tokens] (None off the last stage) and this rank's gradients."""
    import torch
    from megatron.core import parallel_state

    from trainer.step import run_schedule

    for chunk in session.model:
        chunk.zero_grad_buffer()
    reports = run_schedule(session.model, microbatches, plugins, seq_length=SEQ,
                           micro_batch_size=1, forward_only=False)
    LAST_REPORTS[:] = reports
    loss = None
    if reports:
        total = sum(report["lm loss"] for report in reports)
        # Each CP rank holds the loss of its own chunks: the row's is their sum.
        torch.distributed.all_reduce(total, group=parallel_state.get_context_parallel_group())
        loss = [float(total[0]), int(total[1])]
    grads = {
        f"{index}.{name}": param.main_grad.detach().clone()
        for index, chunk in enumerate(session.model)
        for name, param in chunk.module.named_parameters()
    }
    return loss, grads


LAST_REPORTS: list[dict] = []  # the last `_forward_backward`'s loss reports (this rank's)


def _max_difference(grads: dict, reference: dict) -> float:
    return max(float((grads[name] - reference[name]).abs().max()) for name in reference)


def _packed(session):
    """The session's plugins with the packing plugin, named and set up as the registry builds
    it for packed data (its place among them does not matter: no other plugin here changes
    forward kwargs)."""
    from plugins.packing.plugin import PackingPlugin
    from plugins.protocol.hooks import PluginSet

    assert "packing" not in [plugin.name for plugin in session.plugins]  # plain rows' session
    packing = PackingPlugin(mamba_layers=session.cfg.model.is_hybrid)
    packing.name = "packing"
    return PluginSet([*session.plugins, packing])


def _ends_only(plugins):
    """Control: the boundaries reach only the first and last pipeline stage (a failure seen
    elsewhere with PP > 2); middle stages then attend across documents."""
    from megatron.core import parallel_state

    from plugins.protocol.hooks import Plugin, PluginSet

    middle = not (parallel_state.is_pipeline_first_stage()
                  or parallel_state.is_pipeline_last_stage())

    class DropOnMiddleStages(Plugin):
        name = "drop_on_middle_stages"

        def forward_kwargs(self, batch, kwargs):
            return {**kwargs, "packed_seq_params": None} if middle else kwargs

    return PluginSet([*plugins, DropOnMiddleStages()])


def packed_vs_alone(payload: dict) -> dict:
    """One packed row of all documents against each document alone (three micro-batches of
    one step), plus the controls that must differ. With `weights_dir` it first saves the
    session's initial weights there (one launch fewer than a separate save)."""
    from plugins.protocol.packed_batch import packed_row
    from tests.dist.reference_weights import save_model_weights
    from trainer.data import as_tensors

    session = _session(payload)
    saved = None
    if payload.get("weights_dir"):  # the reference run: save its initial weights for the rest
        saved = str(save_model_weights(payload["weights_dir"], session.cfg, session.model))
    docs = documents()
    # Context parallel cuts every document into 2 x CP chunks: each is padded to a multiple.
    packed = as_tensors(
        packed_row(docs, SEQ, PAD_ID, pad_multiple=payload.get("pad_multiple", 1)))
    plain, packing = session.plugins, _packed(session)  # plain: Megatron's causal path
    alone_loss, alone_grads = _forward_backward(
        session, [_alone_row(doc) for doc in docs], plain)
    packed_loss, packed_grads = _forward_backward(session, [packed], packing)
    causal_loss, causal_grads = _forward_backward(session, [packed], plain)
    result = {
        "weights": saved,
        "alone": alone_loss,
        "packed": packed_loss,
        "causal_only": causal_loss,
        "grad_max": max(float(g.abs().max()) for g in alone_grads.values()),
        "grad_max_diff": _max_difference(packed_grads, alone_grads),
        "causal_only_grad_max_diff": _max_difference(causal_grads, alone_grads),
    }
    if payload.get("row_max_seqlen_probe"):
        # max_seqlen = row length switches THD RoPE to positions running across documents
        # (rope_utils.py:224-250); with a per-document mask RoPE's relative form hides it here.
        row = {**packed, "max_seqlen": SEQ}
        row_loss, row_grads = _forward_backward(session, [row], packing)
        result["row_max_seqlen"] = row_loss
        result["row_max_seqlen_grad_max_diff"] = _max_difference(row_grads, alone_grads)
    if payload.get("middle_stage_control"):
        ends_loss, ends_grads = _forward_backward(session, [packed], _ends_only(packing))
        result["ends_only"] = ends_loss
        result["ends_only_grad_max_diff"] = _max_difference(ends_grads, alone_grads)
    _finish()
    return result


def _mtp_losses() -> list[float]:
    """Each MTP depth's per-token loss of the last `_forward_backward` (one rank: its reports'
    sums over their token counts, `trainer.step.loss_with_mtp`)."""
    total = sum(report["mtp loss"] for report in LAST_REPORTS).tolist()
    return [total[2 * d] / total[2 * d + 1] for d in range(len(total) // 2)]


def mtp_packed_vs_rows(payload: dict) -> dict:
    """One packed row of the documents against the same documents each in a row of its own,
    the three rows in one micro-batch (Megatron scales each micro-batch's MTP loss by its own
    token counts, `transformer/multi_token_prediction.py:885-893`: one micro-batch each keeps
    the two the same objective); the LM loss, every gradient (the MTP depths' included) and
    each depth's MTP loss. Control: the packed row without its boundaries."""
    import torch

    from plugins.protocol.packed_batch import packed_row
    from trainer.data import as_tensors

    session = _session(payload)
    docs = documents()
    rows = [_alone_row(doc) for doc in docs]
    alone = {key: torch.cat([row[key] for row in rows]) for key in rows[0]}
    packed = as_tensors(packed_row(docs, SEQ, PAD_ID))
    plain, packing = session.plugins, _packed(session)
    alone_loss, alone_grads = _forward_backward(session, [alone], plain)
    alone_mtp = _mtp_losses()
    packed_loss, packed_grads = _forward_backward(session, [packed], packing)
    packed_mtp = _mtp_losses()
    causal_loss, causal_grads = _forward_backward(session, [packed], plain)
    causal_mtp = _mtp_losses()
    mtp_names = [name for name in alone_grads if ".mtp." in name]
    result = {
        "alone": alone_loss, "packed": packed_loss, "causal_only": causal_loss,
        "alone_mtp": alone_mtp, "packed_mtp": packed_mtp, "causal_only_mtp": causal_mtp,
        "mtp_parameters": len(mtp_names),
        "mtp_grad_max": max(float(alone_grads[name].abs().max()) for name in mtp_names),
        "grad_max_diff": _max_difference(packed_grads, alone_grads),
        "causal_only_grad_max_diff": _max_difference(causal_grads, alone_grads),
    }
    _finish()
    return result
