"""The scaling harness without runs: its options, each size's batch, when two sizes are
comparable, efficiency and budget figures, the diagnosis rules, the table and the plots."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.hang import HANG_S
from trainer.entry.commands import SCALING
from trainer.entry.contract import parse_arguments
from trainer.tools.scaling.report import (
    Point,
    ScalingOptions,
    build_report,
    compare,
    condition_differences,
    conditions,
    diagnose,
    format_table,
    plan_points,
    read_point,
    scaling_options,
    write_plots,
)

REPO = Path(__file__).resolve().parents[2]


def parse_scaling_args(argv: list[str]) -> tuple[ScalingOptions, tuple[str, ...]]:
    """scripts/scaling.py's command line as the entry contract parses it."""
    args = parse_arguments(SCALING, argv)
    return scaling_options(args.options), args.rest


def test_options_are_parsed_and_the_rest_passed_on():
    options, rest = parse_scaling_args(["recipe=tiny_dp1", "scaling.world_sizes=[4,1,2]",
                                        "scaling.mode=strong", "scaling.steps=9", "a.b=1"])
    assert (options.world_sizes, options.mode, options.steps) == ([1, 2, 4], "strong", 9)
    assert rest == ("recipe=tiny_dp1", "a.b=1")


@pytest.mark.parametrize("arg, words", [
    ("scaling.mode=both", "scaling.mode expects one of weak, strong, got 'both'"),
    ("scaling.world_sizes=[1,x]", "scaling.world_sizes expects an integer, got 'x'"),
    ("scaling.world_sizes=[2,2]", "repeats a size"),
    ("scaling.steps=3", "scaling.steps=3 leaves no measured steps"),
    ("scaling.size=2", "unknown option scaling.size; did you mean scaling.steps?"),
    ("scaling.token_budget=-1", "scaling.token_budget=-1.0 must be a positive number"),
])
def test_bad_options_are_one_line_naming_the_field(arg, words):
    with pytest.raises(ConfigError) as error:
        parse_scaling_args([arg])
    assert words in str(error.value) and "\n" not in str(error.value)


def test_weak_keeps_the_per_replica_batch_and_strong_the_global_batch(tmp_path):
    cfg = get_recipe("tiny_tp2")  # TP2: 2 ranks per replica, global batch 8, micro-batch 2
    weak = plan_points(cfg, ScalingOptions(world_sizes=[2, 4, 8], mode="weak"), tmp_path)
    strong = plan_points(cfg, ScalingOptions(world_sizes=[2, 4, 8], mode="strong"), tmp_path)
    assert [(p.data_parallel, p.global_batch, p.microbatches) for p in weak] == [
        (1, 8, 4), (2, 16, 4), (4, 32, 4)]
    assert [(p.data_parallel, p.global_batch, p.microbatches) for p in strong] == [
        (1, 8, 4), (2, 8, 2), (4, 8, 1)]
    assert "cluster.gpus_per_node=8" in strong[2].overrides


def test_sizes_the_layout_or_batch_cannot_use_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="has 3, not a multiple of the recipe's TP x PP x CP "
                       "= 2 ranks per replica; use multiples of 2"):
        plan_points(get_recipe("tiny_tp2"), ScalingOptions(world_sizes=[2, 3]), tmp_path)
    with pytest.raises(ConfigError, match="raise train.global_batch_size to 16"):
        plan_points(get_recipe("tiny_dp1"), ScalingOptions(world_sizes=[1, 8], mode="strong"),
                    tmp_path)


def _point(gpus, rate, data=0.0, fwd_bwd=0.9, opt=0.1, comm=0.0, cond=None) -> dict:
    return {"gpus": gpus, "layout": f"DP{gpus}", "backend": "CPU (gloo)",
            "effective_tokens_per_s": rate, "model_tflops_per_gpu": 0.01, "mfu": None,
            "step_time_s": 1.0, "data_wait_s": data, "forward_backward_s": fwd_bwd,
            "optimizer_s": opt, "exposed_comm_s": comm, "profiled_step_time_s": 1.0,
            "conditions": cond or {"seq_length": 128, "precision": "fp32", "micro_batch_size": 2,
                                   "global_batch": 8,
                                   "samples_per_replica": 8 // gpus, "tokens_per_step": 1024}}


def test_strong_points_with_other_conditions_get_no_efficiency():
    points = [_point(1, 1000), _point(2, 1800), _point(4, 3000)]
    points[2]["conditions"] = {**points[2]["conditions"], "seq_length": 256}
    compare(points, "strong", 1e9)
    assert points[0]["efficiency"] == 1.0 and points[1]["efficiency"] == 0.9
    assert points[2]["efficiency"] is None
    assert points[2]["not_comparable"] == ["seq_length 128 vs 256"]
    assert round(points[1]["gpu_hours_for_budget"], 1) == round(1e9 / 1800 / 3600 * 2, 1)


def test_weak_scaling_allows_only_the_global_batch_to_grow():
    cfg = get_recipe("tiny_dp1")
    one, two = (Point(g, g, 8 * g, 4, ()) for g in (1, 2))
    assert condition_differences(conditions(cfg, one), conditions(cfg, two), "weak") == []
    assert condition_differences(conditions(cfg, one), conditions(cfg, two), "strong") == [
        "global_batch 8 vs 16", "tokens_per_step 1024 vs 2048"]
    bf16 = copy.deepcopy(cfg)
    bf16.precision.dtype = "bf16"
    assert condition_differences(conditions(cfg, one), conditions(bf16, two), "weak") == [
        "precision fp32 vs bf16"]


def test_diagnosis_names_the_dominant_cause_and_its_figure():
    base = _point(1, 1000, comm=0.05)
    data_bound = _point(2, 1500, data=0.3, fwd_bwd=0.6)
    comm_bound = _point(2, 1500, comm=0.5)
    assert diagnose(base, base)["bottleneck"] == "compute"
    found = diagnose(data_bound, base)
    assert found["bottleneck"] == "data wait" and "data wait 30% of the step" in found["evidence"]
    assert "prefetch" in found["change"]
    found = diagnose(comm_bound, base)
    assert found["bottleneck"] == "exposed communication"
    assert found["evidence"] == "exposed communication 50% of the step (vs 5% at 1 ranks)"
    assert "overlap_grad_reduce" in found["change"]


def test_exposed_communication_that_does_not_grow_with_gpus_is_not_blamed():
    base, same = _point(1, 1000, comm=0.3), _point(2, 1900, comm=0.32)
    assert diagnose(same, base)["bottleneck"] == "compute"


def test_report_table_json_and_plots(tmp_path):
    options = ScalingOptions(world_sizes=[1, 2], mode="strong")
    report = build_report(get_recipe("tiny_dp1"), options, [_point(1, 1000), _point(2, 1700)])
    table = format_table(report)
    assert "85.0%" in table and "CPU figures" in table and "1 ranks: compute" in table
    json.dumps(report)  # JSON-ready
    paths = write_plots(report, tmp_path)
    assert sorted(path.name for path in paths) == ["efficiency.png", "throughput.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_script_refuses_a_bad_option_in_one_line():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "scaling.py"),
                             "recipe=tiny_dp1", "scaling.mode=fast"],
                            capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: scaling.mode expects one of weak, strong, got 'fast'; e.g. scaling.mode=weak"]


def test_a_bad_scaling_cluster_is_one_line_before_any_run(tmp_path, monkeypatch):
    import trainer.tools.scaling.sweep as sweep

    monkeypatch.setattr(sweep, "_run_here", lambda *a: pytest.fail("a run started"))
    options, rest = parse_scaling_args(["recipe=tiny_dp1", "scaling.cluster=/nonexistent.yaml",
                                        f"scaling.out={tmp_path}"])
    with pytest.raises(ConfigError, match="cluster=/nonexistent.yaml does not exist"):
        sweep.run_scaling(options, None, list(rest))


def test_submitted_sizes_read_the_frozen_base_config(tmp_path, monkeypatch):
    """A real submission (Slurm stood in for) first writes the sweep directory: each job reads
    its base_config.yaml, and sweep.json keeps the launch's cluster file for the MFU."""
    import trainer.tools.scaling.sweep as sweep
    from trainer.launch.cluster import LaunchArgs

    submitted = []
    monkeypatch.setattr(sweep, "_submit", lambda source, points, launch: submitted.append(
        (source, [p.gpus for p in points])))
    options, rest = parse_scaling_args(["recipe=tiny_dp1", "data.source=synthetic",
                                        "scaling.world_sizes=[1,2]", f"scaling.out={tmp_path}"])
    launch = LaunchArgs(cluster="conf/cluster/cpu_slurm_2x2.yaml")
    assert sweep.run_scaling(options, launch, list(rest)) == 0
    assert submitted == [([f"config={tmp_path / 'base_config.yaml'}"], [1, 2])]
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["gpus"] for p in saved["points"]] == [1, 2]
    assert saved["options"]["cluster"] == "conf/cluster/cpu_slurm_2x2.yaml"  # its peak: MFU


def _record(step, seconds, measured, comm=None) -> dict:
    return {"kind": "train", "step": step, "step_time_s": seconds, "loss_tokens": 500,
            "data_wait_s": 0.1 * seconds, "forward_backward_s": 0.8 * seconds,
            "optimizer_s": 0.1 * seconds, "exposed_comm_s": comm, "measured": measured}


def test_a_run_is_read_from_measured_steps_and_mfu_uses_the_named_peak(tmp_path):
    records = [_record(1, 9.0, False), _record(2, 3.0, False, comm=1.5),
               _record(3, 3.0, False, comm=0.5), _record(4, 1.0, True), _record(5, 2.0, True),
               {"kind": "summary", "layout": "TP1 x PP1 x DP2 (2 ranks)",
                "backend": "CPU (gloo)", "effective_tokens_per_s": 333.3,
                "model_tflops_per_gpu": 0.05, "mfu": None, "measured_steps": 2}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    point = Point(2, 2, 16, 4, ())
    figures = read_point(tmp_path, get_recipe("tiny_dp1"), point, 0.2)
    assert figures["step_time_s"] == 1.5 and figures["data_wait_s"] == pytest.approx(0.15)
    assert figures["exposed_comm_s"] == 1.0 and figures["profiled_step_time_s"] == 3.0
    assert figures["mfu"] == pytest.approx(0.25)
    assert read_point(tmp_path, get_recipe("tiny_dp1"), point, None)["mfu"] is None


def test_one_slow_step_moves_the_mean_but_not_the_median(tmp_path):
    summary = {"kind": "summary", "layout": "TP1 x PP1 x DP2 (2 ranks)", "backend": "CPU (gloo)",
               "effective_tokens_per_s": 1.0, "model_tflops_per_gpu": 0.05, "mfu": None,
               "measured_steps": 5}
    steps = [0.14, 0.15, 0.73, 0.14, 0.16]  # step 4 of 5 measured: the machine was busy
    records = [_record(1, 9.0, False)] + [_record(i + 2, s, True) for i, s in enumerate(steps)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records + [summary]))
    figures = read_point(tmp_path, get_recipe("tiny_dp1"), Point(2, 2, 16, 4, ()), None)
    assert figures["step_time_s"] == pytest.approx(0.264)
    assert figures["step_time_median_s"] == pytest.approx(0.15)


def test_cpu_ranks_beyond_the_cores_carry_a_caveat(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    options = ScalingOptions(world_sizes=[2, 4], mode="strong")
    report = build_report(get_recipe("tiny_dp1"), options, [_point(2, 1000), _point(4, 1100)])
    assert "caveat" not in report["points"][0]["diagnosis"]
    assert "4 CPU ranks share 2 cores" in report["points"][1]["diagnosis"]["caveat"]
    assert "  caveat: 4 CPU ranks share 2 cores" in format_table(report)


def test_memory_near_capacity_leads_and_names_model_state_or_activations():
    base = _point(1, 1000)
    states = _point(2, 1900) | {"memory_gib": 75.0, "memory_capacity_gib": 80.0,
                                "model_state_gib": 50.0}
    found = diagnose(states, base)
    assert found["bottleneck"] == "memory (model state)"
    assert found["evidence"] == "peak 75.0 GiB of 80.0 GiB (94%); model state 50.0 GiB"
    assert "optimizer.distributed=true" in found["change"]
    activations = states | {"model_state_gib": 10.0}
    found = diagnose(activations, base)
    assert found["bottleneck"] == "memory (activations)" and "recompute" in found["change"]
    roomy = states | {"memory_gib": 70.0}  # 87.5% of capacity: below the 90% line
    assert diagnose(roomy, base)["bottleneck"] == "compute"


def test_one_busy_pipeline_stage_is_named_beside_the_time_cause():
    base = _point(2, 1000)
    busy = base | {"stage_compute_s": [0.6, 0.3]}
    found = diagnose(busy, base)
    assert found["bottleneck"] == "compute"
    assert found["also"] == [{
        "bottleneck": "busy stage",
        "evidence": "stage 0 computes 0.6 s per step vs 0.45 s mean over 2 stages (1.33x)",
        "change": found["also"][0]["change"]}]
    assert "parallel.first_stage_layers" in found["also"][0]["change"]
    even = base | {"stage_compute_s": [0.5, 0.45]}
    assert diagnose(even, base)["also"] == []
    waiting = even | {"exposed_comm_s": 0.5}  # with stages, the bubble waits as p2p comm
    assert diagnose(waiting, waiting)["change"].endswith(
        "or interleaving (parallel.virtual_pipeline)")
    assert "bubble" not in diagnose(_point(2, 1000, comm=0.5), base)["change"]


def test_a_busy_expert_is_named_from_the_routers_imbalance():
    base = _point(2, 1000)
    found = diagnose(base | {"moe_imbalance": 2.5}, base)
    assert [a["bottleneck"] for a in found["also"]] == ["busy expert"]
    assert found["also"][0]["evidence"] == "busiest expert 2.50x the mean tokens per expert"
    assert "moe_aux_loss_coeff" in found["also"][0]["change"]
    assert diagnose(base | {"moe_imbalance": 1.2}, base)["also"] == []
    report = build_report(get_recipe("tiny_dp1"), ScalingOptions(world_sizes=[2]),
                          [base | {"moe_imbalance": 2.5}])
    assert "  also busy expert (busiest expert 2.50x" in format_table(report)


def test_memory_and_stage_figures_are_read_from_the_run(tmp_path):
    records = [_record(1, 9.0, False) | {"memory_gib": 1.5},
               _record(2, 3.0, False, comm=1.5) | {"stage_compute_s": [2.0, 1.0]},
               _record(3, 3.0, False, comm=0.5) | {"stage_compute_s": [1.0, 1.0]},
               _record(4, 1.0, True) | {"memory_gib": 2.5, "extra": {"moe_imbalance": 3.0}},
               {"kind": "summary", "layout": "TP1 x PP2 (2 ranks)", "backend": "CPU (gloo)",
                "effective_tokens_per_s": 500.0, "model_tflops_per_gpu": 0.05, "mfu": None,
                "measured_steps": 1}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    cfg = get_recipe("tiny_dp1")
    figures = read_point(tmp_path, cfg, Point(2, 1, 8, 4, ()), None, model_state_gib=0.25)
    assert figures["memory_gib"] == 2.5 and figures["model_state_gib"] == 0.25
    assert figures["memory_capacity_gib"] == cfg.cluster.gpu_memory_gib
    assert figures["stage_compute_s"] == [1.5, 1.0] and figures["moe_imbalance"] == 3.0


def test_sizes_become_cluster_jobs_through_the_launcher(tmp_path):
    """With cluster=, each size is one NeMo-Run job whose run directory lies in the sweep
    directory; --dry-run prints each job's sbatch script (8 ranks: 1 node, 16 ranks: 2) and
    writes nothing. A multi-node job refuses the built-in corpus, so the sweep trains synthetic
    data."""
    out = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "scaling.py"), "recipe=tiny_dp1",
         "data.source=synthetic", "scaling.world_sizes=[8,16]",
         "cluster=conf/cluster/h100_80gb_8x8.yaml",
         f"scaling.out={out}", "--dry-run", f"job_dir={tmp_path / 'jobs'}"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    *scripts, last = result.stdout.split("scaling: ")[1:]
    assert [s.splitlines()[0] for s in scripts] == ["8 ranks as a slurm job",
                                                    "16 ranks as a slurm job"]
    for script, nodes, gpus in zip(scripts, (1, 2), (8, 16), strict=True):
        assert f"#SBATCH --nodes={nodes}\n" in script
        assert f"run_dir={out / f'G{gpus}'}" in script and "logging.exposed_comm=true" in script
        assert "recipe=tiny_dp1 data.source=synthetic" in script
    assert last.startswith(f"dry run, nothing written; the sweep would write {out}")
    assert not out.exists()  # a dry run writes no sweep directory


def test_a_report_of_unfinished_jobs_is_refused_in_one_line(tmp_path):
    from trainer.tools.scaling.sweep import save_sweep, write_report

    with pytest.raises(ConfigError, match="holds no sweep.json; name the directory"):
        write_report(tmp_path)
    cfg = get_recipe("tiny_dp1")
    options = ScalingOptions(world_sizes=[1, 2])
    points = plan_points(cfg, options, tmp_path)
    save_sweep(tmp_path, options, points, [cfg, cfg])
    (tmp_path / "G1").mkdir()
    (tmp_path / "G1" / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    with pytest.raises(ConfigError, match=r"the run of 1 ranks has not finished \(no summary in "
                                          r"G1/metrics.jsonl\); wait for its job"):
        write_report(tmp_path)
