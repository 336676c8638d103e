"""Training on prepared data: Megatron Core's blended GPTDataset and exact packs.

From one reference checkpoint, packed rows (documents kept apart by the packing plugin) train
the same losses at TP2 x PP2 as on one rank; effective tokens count loss tokens only (padding
excluded); packed data at CP2 (packs made for documents padded to multiples of 4, each row's
documents so padded, cut per document by Megatron) trains the losses of the same packs as plain
rows on one rank; a run stopped after two steps and resumed continues bit-identically, with
the same samples in the same order, on a blend and on packed data; a corpus prepared in three
shards trains exactly as the same corpus prepared as one dataset (its manifest's shards are one
Megatron dataset, `trainer/sharded_dataset.py`); and every step's model TFLOP/s is
`training_flops` over the sequences it trained, read from the batches independently (full rows;
packed and inter-document rows: their documents), on one rank, TP2 x PP2, CP2 and DP2.
"""

from __future__ import annotations

import pytest

from tests.dist.prepared_data import prepare_corpus, write_blend, write_byte_dataset

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.layout_runs"
STEPS, SAVE_AFTER = 4, 2
LOSS_TOLERANCE = 2e-5  # fp32 on CPU: layouts differ only in summation order
PACKED = ["data.documents=packed", "train.micro_batch_size=1"]


@pytest.fixture(scope="module")
def blend(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("prepared")
    path = write_blend(folder, write_byte_dataset(folder))
    return ["data.source=blend", f"data.blend={path}", "scheduler.warmup_iters=2",
            f"train.train_iters={STEPS}"]


@pytest.fixture(scope="module")
def reference_weights(launch_ranks, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("weights")
    return launch_ranks(1, f"{ENTRY}:save_reference_weights", {
        "recipe": "tiny_dp1", "run_dir": str(root / "save"), "weights_dir": str(root / "w"),
    })[0]


def assert_flops_of_trained_sequences(results: list[dict], recipe: str, overrides) -> None:
    """Each rank's reported TFLOP/s of each step is `training_flops` over the sequences the
    step trained (`layout_runs.trained_lengths`, from positions and loss masks: one DP rank's
    rows each, the other ranks of a replica hold the same) over that rank's step time."""
    from recipes.plan.flops import FlopsShape, training_flops
    from recipes.resolve import resolve_config
    from tests.dist.layout_runs import TEST_DATA

    cfg = resolve_config([f"recipe={recipe}", *TEST_DATA, *overrides])
    shape = FlopsShape.from_config(cfg)
    replicas = {r["dp_rank"]: r for r in results}
    assert len(replicas) == cfg.layout.data_parallel
    for step in range(len(results[0]["tflops"])):
        lengths = [n for r in replicas.values() for n in r["lengths"][step]]
        flops = training_flops(shape, sum(lengths), sum(n * n for n in lengths))
        for r in results:
            expected = flops / r["step_times"][step] / r["world"] / 1e12
            assert r["tflops"][step] == pytest.approx(expected, rel=1e-9), (step, r["dp_rank"])


def _train(launch_ranks, recipe, ranks, overrides, weights, run_dir) -> dict:
    results = launch_ranks(ranks, f"{ENTRY}:train_steps", {
        "recipe": recipe, "steps": STEPS, "run_dir": str(run_dir),
        "overrides": [f"checkpoint.load={weights}", "checkpoint.load_model_only=true",
                      *overrides],
    })
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert_flops_of_trained_sequences(results, recipe, overrides)
    return results[0]


def test_packed_rows_train_alike_at_tp2_pp2_and_count_no_padding(
    launch_ranks, blend, reference_weights, tmp_path
):
    single = _train(launch_ranks, "tiny_dp1", 1, [*blend, *PACKED], reference_weights,
                    tmp_path / "one")
    sharded = _train(launch_ranks, "tiny_tp2_pp2", 4, [*blend, *PACKED], reference_weights,
                     tmp_path / "four")
    assert sharded["losses"] == pytest.approx(single["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert sharded["loss_tokens"] == single["loss_tokens"]
    # Loss tokens are the loss-mask ones: never padding, never a label across documents.
    assert single["loss_tokens"] == single["mask_tokens"]
    assert all(tokens < 8 * 128 for tokens in single["loss_tokens"])


def test_packed_data_at_cp2_trains_as_its_packs_unpadded_on_one_rank(
    launch_ranks, blend, reference_weights, tmp_path
):
    """The CP2 run reads the pack index for pad multiple 2 x CP = 4 and pads every document in
    its rows; the reference reads the same index on one rank and places the same documents side
    by side with no padding (the plain packed rows the layout and equivalence tests vouch for).
    Equal losses over four steps (so equal updates too) and equal loss tokens mean the padding
    carries no loss and is never attended to, every document token is there, and the CP split
    of each padded document, its RoPE positions and its attention are exact. The rows differ
    between the two runs (padding inside versus none), so nothing is compared with itself."""
    overrides = [f"checkpoint.load={reference_weights}", "checkpoint.load_model_only=true",
                 *blend, *PACKED]
    plain = launch_ranks(1, "tests.dist.prepared_data:train_steps_on_packs_padded_for", {
        "recipe": "tiny_dp1", "steps": STEPS, "run_dir": str(tmp_path / "cp1"),
        "overrides": overrides, "index_pad_multiple": 4,
    })[0]
    cp2 = _train(launch_ranks, "tiny_cp2", 2, [*blend, *PACKED], reference_weights,
                 tmp_path / "cp2")
    print(f"CP2 {cp2['losses']} vs CP1 unpadded {plain['losses']}")
    assert cp2["losses"] == pytest.approx(plain["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert cp2["loss_tokens"] == plain["loss_tokens"] == plain["mask_tokens"]
    # Every step trains real documents only: rows are padded, so fewer tokens than slots.
    assert all(0 < tokens < 8 * 128 for tokens in cp2["loss_tokens"])


@pytest.mark.parametrize("documents", ["concatenate", "inter_document", "packed"])
def test_dp2_model_flops_count_the_sequences_each_replica_trained(launch_ranks, blend, documents,
                                                                  tmp_path):
    """Two replicas, two steps, each rank's figure from both replicas' rows. Full rows keep
    the recipe's figure (a global batch of full rows, `step_flops`); packed rows (with a
    padding segment) and Megatron's inter-document rows count their documents, which is less:
    attention stays inside each document."""
    from recipes.plan.flops import step_flops
    from recipes.resolve import resolve_config
    from tests.dist.layout_runs import TEST_DATA

    steps = 2
    overrides = [*blend, f"data.documents={documents}"]
    if documents != "concatenate":
        overrides += ["train.micro_batch_size=1"]
    results = launch_ranks(2, f"{ENTRY}:train_steps", {
        "recipe": "tiny_dp2", "steps": steps, "run_dir": str(tmp_path), "overrides": overrides})
    assert_flops_of_trained_sequences(results, "tiny_dp2", overrides)
    full = step_flops(resolve_config(["recipe=tiny_dp2", *TEST_DATA, *overrides]))
    flops = [t * r["step_times"][k] * 2 * 1e12 for r in results for k, t in enumerate(r["tflops"])]
    if documents == "concatenate":
        assert flops == pytest.approx([full] * len(flops), rel=1e-12)
    else:
        assert all(f < full for f in flops)


@pytest.mark.parametrize("documents", [[], PACKED], ids=["blend", "packed"])
def test_resume_mid_run_continues_with_the_same_samples(launch_ranks, blend, documents,
                                                        tmp_path):
    # One rank: the data order is what is tested (DP resumes are covered by test_resume.py).
    checkpoints = tmp_path / "checkpoints"
    common = {"recipe": "tiny_dp1", "steps": STEPS, "run_dir": str(tmp_path)}
    overrides = [*blend, *documents]
    continuous = launch_ranks(1, "tests.dist.resume_runs:continuous", {
        **common, "overrides": overrides, "save_at": [SAVE_AFTER],
        "checkpoint_dir": str(checkpoints),
    })[0]
    resumed = launch_ranks(1, "tests.dist.resume_runs:resumed", {
        **common, "overrides": [*overrides, f"checkpoint.load={checkpoints}"],
    })[0]
    assert resumed["start"] == SAVE_AFTER
    # Per step: loss, lr, consumed tokens and a digest of the token ids (same samples, order).
    assert resumed["records"] == continuous["records"][SAVE_AFTER:]


@pytest.fixture(scope="module")
def preparations(tmp_path_factory) -> tuple:
    """One small corpus prepared twice with one tokenizer: one train dataset, and three train
    shards (one valid dataset each)."""
    folder = tmp_path_factory.mktemp("sharding")
    one = prepare_corpus(folder, 1, "train:300")
    return one, prepare_corpus(folder, 3, str(one.tokenizer_dir))


def _sharding_blends(folder, one, three, held_out: str) -> tuple[str, str]:
    """(the unsharded datasets named by prefix, the sharded preparation named by manifest),
    held out by `valid:` sources or by `split:`."""
    def prefix(result, split: str) -> str:
        return str(result.output.parent / next(s.prefix for s in result.shards
                                                if s.split == split))

    unsharded, sharded = folder / "one.yaml", folder / "three.yaml"
    if held_out == "valid":
        unsharded.write_text(f"train:\n  - {{prefix: {prefix(one, 'train')}}}\n"
                             f"valid:\n  - {{prefix: {prefix(one, 'valid')}}}\n")
        sharded.write_text(f"train:\n  - {{manifest: {three.manifest}}}\n"
                           f"valid:\n  - {{manifest: {three.manifest}}}\n")
    else:
        unsharded.write_text(f"train:\n  - {{prefix: {prefix(one, 'train')}}}\nsplit: [90, 10]\n")
        sharded.write_text(f"train:\n  - {{manifest: {three.manifest}}}\nsplit: [90, 10]\n")
    return str(unsharded), str(sharded)


@pytest.mark.parametrize("held_out", ["valid", "split"])
def test_sharded_output_trains_exactly_as_one_dataset(launch_ranks, preparations, held_out,
                                                      tmp_path):
    """Per step: the same loss, lr, tokens and token ids; the same held-out batches and loss."""
    one, three = preparations
    assert sum(s.split == "train" for s in one.shards) == 1
    assert sum(s.split == "train" for s in three.shards) == 3
    runs = {}
    for name, blend in zip(("one", "three"), _sharding_blends(tmp_path, one, three, held_out),
                           strict=True):
        runs[name] = launch_ranks(1, "tests.dist.prepared_data:train_and_hold_out", {
            "recipe": "tiny_dp1", "steps": STEPS, "run_dir": str(tmp_path / name),
            "overrides": ["data.source=blend", f"data.blend={blend}", "model.vocab_size=320",
                          f"train.train_iters={STEPS}", "scheduler.warmup_iters=2",
                          "train.eval_iters=2"],
        })[0]
    keys = ("step", "loss", "lr", "tokens", "samples", "data")
    steps = {name: [{k: r[k] for k in keys} for r in run["records"]] for name, run in runs.items()}
    print(f"{held_out}: losses {[r['loss'] for r in steps['one']]}")
    assert steps["three"] == steps["one"]
    assert len({r["data"] for r in steps["one"]}) == STEPS  # every step other samples
    assert len(runs["one"]["heldout"]) == 2
    assert runs["three"]["heldout"] == runs["one"]["heldout"]
    assert runs["three"]["eval_loss"] == runs["one"]["eval_loss"]
