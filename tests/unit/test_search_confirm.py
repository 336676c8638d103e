"""The confirm report's arithmetic (ranks with ties, Spearman's rho) and its short-run
overrides; the runs themselves are a benchmark (`scripts/plan.py ... search=true confirm=6`,
docs/search.md), not a test."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.plan.cluster import load_cluster
from recipes.plan.search import search
from recipes.registry import get_recipe
from trainer.tools.search_confirm import confirm_lines, ranks, short_run_overrides, spearman

REPO = Path(__file__).resolve().parents[2]


def test_ranks_share_ties_and_spearman_is_rank_correlation() -> None:
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)


def test_confirm_lines_rerank_by_measured_time() -> None:
    cfg = get_recipe("tiny_tp2_pp2")
    top = search(cfg, load_cluster(REPO / "conf" / "cluster" / "cpu_local.yaml"), top=3).listed
    lines = confirm_lines(top, [0.3, 0.1, 0.2])
    assert lines[2].split()[:2] == ["1", "2"] and lines[-1].endswith("over 3 layouts")
    assert "Spearman rho (predicted vs measured step time): -0.50" in lines[-1]


def test_short_runs_are_the_scaling_harness_ones(tmp_path) -> None:
    overrides = short_run_overrides(get_recipe("tiny_tp2_pp2").layout, 6, tmp_path)
    assert "cluster.gpus_per_node=4" in overrides and "checkpoint.save=false" in overrides
    assert f"run_dir={tmp_path}" in overrides


def test_calibration_fit_recovers_a_known_gemm_model() -> None:
    from trainer.tools.calibrate import fit_gemm_model

    peak, fraction, half = 100.0, 0.6, 48.0
    points = [(d, peak * fraction * (d / (d + half)) ** 3) for d in (32, 64, 128, 256, 512)]
    got_fraction, got_half = fit_gemm_model(points, peak)
    assert got_fraction == pytest.approx(fraction, rel=1e-2)
    assert got_half == pytest.approx(half, rel=1e-2)


def test_confirm_reads_each_runs_median_step(tmp_path, monkeypatch) -> None:
    import json

    import trainer.tools.search_confirm as confirm

    def fake_run(base, point, log):  # one slow step among the measured ones
        run_dir = Path(next(o for o in point.overrides if o.startswith("run_dir="))[8:])
        run_dir.mkdir(parents=True, exist_ok=True)
        rows = [{"kind": "train", "step": i, "step_time_s": s, "loss_tokens": 1,
                 "data_wait_s": 0.0, "forward_backward_s": s, "optimizer_s": 0.0,
                 "measured": i > 1} for i, s in enumerate([9.0, 0.14, 0.73, 0.15, 0.16], 1)]
        rows.append({"kind": "summary", "layout": "x", "backend": "CPU (gloo)",
                     "effective_tokens_per_s": 1.0, "model_tflops_per_gpu": 0.0, "mfu": None,
                     "measured_steps": 4})
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))

    monkeypatch.setattr(confirm, "_run_point", fake_run)
    cfg = get_recipe("tiny_tp2_pp2")
    top = search(cfg, load_cluster(REPO / "conf" / "cluster" / "cpu_local.yaml"), top=1).listed
    assert confirm.measure(cfg, top, 6, tmp_path) == [pytest.approx(0.155)]


def _tiny_search():
    cfg = get_recipe("tiny_tp2_pp2")
    return cfg, search(cfg, load_cluster(REPO / "conf" / "cluster" / "cpu_local.yaml"), top=6)


def test_spread_runs_k_layouts_over_the_whole_ranking_fastest_and_slowest_included() -> None:
    from recipes.config.validation import validate
    from recipes.plan.search import apply_candidate, spread

    cfg, result = _tiny_search()
    picked = spread(result, 6)
    found = [rank for rank, _ in picked]
    n = len(result.fitting)
    assert n > 12 and len(found) == 6 and found[0] == 1 and found[-1] == n
    assert found == sorted(set(found))
    assert all(later - earlier > 1 for earlier, later in zip(found, found[1:], strict=False))
    for rank, evaluated in picked:
        assert result.fitting[rank - 1] is evaluated
        validate(apply_candidate(cfg, evaluated.candidate))


def test_a_layout_a_rule_refuses_leaves_the_ranking_its_count_and_the_spread(
        monkeypatch) -> None:
    import recipes.config.validation as validation
    from plugins.protocol.errors import ConfigError
    from recipes.plan.search import spread

    cfg, before = _tiny_search()
    slowest = before.fitting[-1].candidate
    real = validation.validate

    def refuse_the_slowest(run):
        if (run.parallel.tensor, run.parallel.pipeline, run.parallel.context,
                run.train.micro_batch_size, run.train.recompute) == (
                slowest.tensor, slowest.pipeline, slowest.context, slowest.micro_batch,
                slowest.recompute):
            raise ConfigError("refused")
        return real(run)

    monkeypatch.setattr(validation, "validate", refuse_the_slowest)
    cfg, result = _tiny_search()
    assert result.refused >= 1
    assert len(result.fitting) == len(before.fitting) - result.refused
    assert all(e.candidate != slowest for e in result.fitting)
    found = [rank for rank, _ in spread(result, 6)]
    assert found[-1] == len(result.fitting) and len(found) == 6


def test_confirm_pick_top_keeps_the_listed_layouts_and_their_ranks() -> None:
    from recipes.plan.command import confirm_layouts

    cfg, result = _tiny_search()
    picked = confirm_layouts(cfg, result, 3, "top")
    assert [rank for rank, _ in picked] == [1, 2, 3]
    assert [e for _, e in picked] == result.listed[:3]
    lines = confirm_lines([e for _, e in picked], [0.3, 0.1, 0.2], [1, 9, 18])
    assert lines[2].split()[:3] == ["1", "2", "9"]


def test_the_search_command_says_which_layouts_it_confirms(capsys) -> None:
    from recipes.plan.command import run_plan

    seen = []

    def confirmer(cfg, picked, steps):
        seen.append(([rank for rank, _ in picked], steps))
        return ["confirmed"]

    cluster = str(REPO / "conf" / "cluster" / "cpu_local.yaml")
    options = {"cluster": cluster, "search": True, "top": 6, "confirm": 3,
               "confirm_pick": "spread", "confirm_steps": 2}
    assert run_plan(["recipe=tiny_tp2_pp2"], options, confirm=confirmer) == 0
    (found, steps), = seen
    out = capsys.readouterr().out
    assert steps == 2 and found[0] == 1 and len(found) == 3
    assert f"confirm: 3 layouts, spread over the {found[-1]} that fit (search ranks " \
           f"{', '.join(map(str, found))})" in out


@pytest.mark.parametrize(("options", "expected"), [
    ({"confirm": 3},
     "confirm=3 runs the layout search's layouts; add search=true, or drop confirm="),
    ({"search": True, "confirm": 0, "confirm_pick": "spread"},
     "confirm_pick=spread picks the layouts confirm=K runs; add confirm=K, e.g. confirm=6"),
])
def test_confirm_options_without_what_they_need_are_refused(options, expected) -> None:
    from recipes.plan.command import search_option_problem

    assert search_option_problem(options) == expected
    assert search_option_problem({**options, "search": True, "confirm": 3}) is None


@pytest.mark.parametrize(("options", "expected"), [
    ({"calibrate": True, "search": True}, "calibrate=true only measures this machine and writes "
     "the cluster file; run search=true in a second command, after it"),
    ({"calibrate": True, "verify": True}, "calibrate=true only measures this machine and writes "
     "the cluster file; run verify=true in a second command, after it"),
    ({"search": True, "verify": True}, "verify=true builds the shards of the one layout planned, "
     "not of a search's; drop search=true, or verify the layout it picks in a second command"),
])
def test_options_one_command_would_silently_skip_are_refused(options, expected) -> None:
    from recipes.plan.command import search_option_problem

    assert search_option_problem(options) == expected
